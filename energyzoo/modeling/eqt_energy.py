"""The label-free energy of EqT's Equilibrium Refinement Module (eqt.txt §3.3, eq. 11-16), with its gradient in
the hidden state written out analytically.

Per refined position t the energy is L(h) = lambda_rev L_rev + lambda_mask L_mask + lambda_conf L_conf +
lambda_mem L_mem (eq. 11). Everything that does not depend on h (the reverse encoder over the token window, the
candidate embeddings, the window's mask and the memory's relevant prototypes) is computed once per forward in
`EnergyContext`; each refinement step then evaluates a few small maps of h and their hand-written backward:

- the solver needs grad_h L at every step (Algorithm 1 lines 9-12). Written out it is an ordinary differentiable
  expression, so unrolled backprop through the K steps (eq. 18) is plain first-order autograd of it, with no
  ``autograd.grad(create_graph=True)``: no double backward through attention kernels (the CPU SDPA kernels have
  none), `torch.compile(fullgraph=True)` traces it, and `generate`'s no-grad context needs no special handling;
- the confidence gradient is analytic as Algorithm 1 line 11 asks: d/dz [H(p) - log p_xhat] = -p (log p + H) +
  p - e_xhat, chained through the LM head and the final RMSNorm.

Causality: position t reads h_t, and tokens, reverse-encoder states and mask keys at positions <= t only.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from .configuration_eqt import EqTLlamaConfig
from .numerics import applied_weight, own_parameter, widened

_HASH_MULTIPLIER = 0x9E3779B1  # Knuth's multiplicative hash (golden ratio * 2^32), for the position-keyed mask


def rms_normalise(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / rms(x), 1 / rms(x)) in float32 (at least), as Llama's RMSNorm computes them."""
    x = widened(x)
    inverse = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * inverse, inverse


def rms_norm_backward(normalised: torch.Tensor, inverse: torch.Tensor, grad_normalised: torch.Tensor) -> torch.Tensor:
    """d/dx of <grad, x / rms(x)>: (grad - xn mean(grad * xn)) / rms(x)."""
    return inverse * (grad_normalised - normalised * (grad_normalised * normalised).mean(-1, keepdim=True))


def gelu_derivative(x: torch.Tensor) -> torch.Tensor:
    """d gelu(x) / dx = Phi(x) + x phi(x) (exact, erf form)."""
    cdf = 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))
    return cdf + x * torch.exp(-0.5 * x * x) * 0.3989422804014327


def nll_and_grad(scores: torch.Tensor, allowed: torch.Tensor | None, target: torch.Tensor):
    """-log softmax(scores)[target] over the allowed candidates and its gradient in the scores."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    log_probs = widened(scores).log_softmax(-1)
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    grad = log_probs.exp() - F.one_hot(target, scores.shape[-1]).to(log_probs.dtype)
    return nll, grad.to(scores.dtype)


def position_mask(keys: torch.Tensor, ratio: float, seed: int) -> torch.Tensor:
    """Eq. 13's mask set M: a token is masked when a hash of its position among the real tokens (and the seed)
    falls below ``ratio``. Deterministic, so training, evaluation, the cache and padding all agree."""
    mixed = (keys * _HASH_MULTIPLIER + seed * 0x85EBCA77 + 0x165667B1) % (2**32)
    mixed = (mixed ^ (mixed >> 15)) * 0x2C1B3C6D % (2**32)
    return (mixed ^ (mixed >> 12)).double() / 2**32 < ratio


@dataclass
class EnergyContext:
    """What the energies of one chunk of positions read besides h, computed once per forward (B batch, n
    positions, W window slots r = 0..W-1 holding position t - r, d_rev the energy network's width).

    window_valid: (B, n, W) slot holds a real token. rev_state: (B, n, W, d_rev) u_{i-1} + R_phi[r], the reverse
    encoder's state before slot i plus its offset embedding (eq. 12's x_<i). masked: (B, n, W) slots in eq. 13's
    mask set. candidates: (V, d_rev) or (B, n, W, d_rev) embeddings scored by the heads; targets (B, n, W) the
    index of each slot's token among them; allowed (B, n, W): candidate slots (window vocabulary) or None.
    """

    window_valid: torch.Tensor
    rev_state: torch.Tensor
    masked: torch.Tensor
    candidates: torch.Tensor
    targets: torch.Tensor
    allowed: torch.Tensor | None


class EqTEnergyNetwork(nn.Module):
    """q_phi and p_psi of eq. 12-13 plus the memory banks of eq. 15-16 (one per refined layer), shared by the
    refined layers (one energy network: "+8% params dominated by the reverse prediction head", §5.3.3).

    - reverse predictive coding (eq. 12): u = ``rev_layers``(``embed_proj``(E x)), causal Llama layers of width
      d_rev with sliding-window attention (window W), run once per forward over the ids; then
      q_phi(x_i | h, x_<i) = softmax over the candidates of <e~, ``rev_out``(RMSNorm(u_{i-1} + ``rev_cond`` h +
      ``rev_offset``[t - i]))>, e~ = ``embed_proj``(E) the shared embedding in d_rev (§3.3.1 "shares the embedding
      layer"). h enters only the head, so the encoder runs once, not once per step (eq. 12 conditions on
      x_<i and h; where h enters is not stated, and entering at the head keeps the cost of a step small);
    - masked prediction (eq. 13) as a latent probe (label-free at test time, §2.2.2, so no input corruption):
      p_psi(x_i | h) = softmax of <e~,
      ``mask_out``(GELU(``mask_in`` h + ``mask_offset``[t - i]))> for the masked i of the window, the 2-layer MLP
      of §3.3.2 ([h ; R_psi] through the first layer is ``mask_in`` h + ``mask_offset``);
    - episodic memory (eq. 15-16): buffers ``memory_banks`` (sites, M, d), N(0, 1) at initialisation, updated by
      the EMA of eq. 16 in training (`update_memory`), never by the optimiser (§3.3.4 "not trainable").
    """

    def __init__(self, config: EqTLlamaConfig):
        super().__init__()
        self.config = config
        width = config.erm_rev_hidden_size
        window = config.erm_rev_window
        self.embed_proj = nn.Linear(config.hidden_size, width, bias=False)
        encoder_config = LlamaConfig(
            hidden_size=width, intermediate_size=2 * width, num_attention_heads=config.erm_rev_num_heads,
            num_hidden_layers=max(config.erm_rev_num_layers, 1), rms_norm_eps=config.rms_norm_eps,
            max_position_embeddings=config.max_position_embeddings, rope_parameters=config.rope_parameters)
        self.encoder_config = encoder_config
        self.follow_attention(config._attn_implementation)
        self.rev_layers = nn.ModuleList(LlamaDecoderLayer(encoder_config, index)
                                        for index in range(config.erm_rev_num_layers))
        self.rev_rotary = LlamaRotaryEmbedding(encoder_config)
        self.rev_start = nn.Parameter(torch.zeros(width))
        self.rev_offset = nn.Embedding(window, width)
        self.rev_cond = nn.Linear(config.hidden_size, width, bias=False)
        self.rev_norm_weight = nn.Parameter(torch.ones(width))
        self.rev_out = nn.Linear(width, width, bias=False)
        self.mask_in = nn.Linear(config.hidden_size, width, bias=False)
        self.mask_offset = nn.Embedding(window, width)
        self.mask_out = nn.Linear(width, width, bias=False)
        self.register_buffer("memory_banks", torch.randn(len(config.erm_sites), config.erm_memory_size,
                                                         config.hidden_size))

    def follow_attention(self, implementation: str | None) -> None:
        """The reverse encoder runs the model's attention implementation where its additive sliding-window mask
        fits (eager, SDPA) and SDPA otherwise (flex and flash kernels take no additive mask)."""
        self.encoder_config._attn_implementation = implementation if implementation in ("eager", "sdpa") else "sdpa"

    # once per forward ------------------------------------------------------------------------------------------
    def context(self, embeddings: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor, keys: torch.Tensor,
                chunk: int) -> EnergyContext:
        """The `EnergyContext` of the last ``chunk`` positions of a sequence whose earlier positions (at least
        `config.erm_context_length` of them, where they exist) are given for context. ``embeddings`` is the token
        embedding matrix E (V, d); ``valid`` marks real tokens; ``keys`` is each token's index among the real ones."""
        config = self.config
        window = config.erm_rev_window
        batch, length = ids.shape
        projected = self.embed_proj(embeddings[ids])  # e~ of every token, (B, T, d_rev)
        states = self.reverse_encode(projected, valid, keys)
        # slot r of chunk position t holds sequence position t - r; one step back holds u_{i-1}
        positions = torch.arange(length - chunk, length, device=ids.device)[:, None] - torch.arange(window,
                                                                                                    device=ids.device)
        inside = positions >= 0
        index = positions.clamp_min(0)
        window_ids = ids[:, index]
        window_valid = valid[:, index] & inside
        previous = (positions - 1).clamp_min(0)
        has_previous = (valid[:, previous] & (positions - 1 >= 0)).unsqueeze(-1)
        offsets = self.rev_offset(torch.arange(window, device=ids.device))
        rev_state = torch.where(has_previous, states[:, previous], own_parameter(self, "rev_start")) + offsets
        masked = window_valid & position_mask(keys[:, index], config.erm_mask_ratio, config.erm_mask_seed)
        if config.erm_head_vocabulary == "full":
            candidates, targets, allowed = self.embed_proj(embeddings), window_ids, None
        else:
            # the window's distinct tokens: each slot's token is scored at its first slot
            same = (window_ids[..., :, None] == window_ids[..., None, :]) & window_valid[..., None, :]
            targets = same.int().argmax(-1)
            allowed = window_valid & (targets == torch.arange(window, device=ids.device))
            candidates = projected[:, index]
        return EnergyContext(window_valid, rev_state, masked, candidates, targets, allowed)

    def reverse_encode(self, projected: torch.Tensor, valid: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """u: the reverse encoder's causal sliding-window states (key j visible from i when 0 <= i - j < W and j
        is real; i always sees itself), with rotary positions = the real-token keys."""
        length = projected.shape[1]
        offsets = torch.arange(length, device=projected.device)
        distance = offsets[:, None] - offsets[None, :]
        visible = (distance >= 0) & (distance < self.config.erm_rev_window)
        visible = (visible & valid[:, None, :]) | (distance == 0)
        mask = torch.zeros(visible.shape, dtype=projected.dtype, device=projected.device)
        mask = mask.masked_fill(~visible, torch.finfo(projected.dtype).min).unsqueeze(1)
        states = projected
        rotary = self.rev_rotary(states, position_ids=keys)
        for layer in self.rev_layers:
            states = layer(states, attention_mask=mask, position_embeddings=rotary, position_ids=keys)
        return states

    def relevant_memories(self, site: int, proposal: torch.Tensor) -> torch.Tensor:
        """Eq. 15's relevant prototypes r_i = 1: the `erm_memory_topk` slots most cosine-similar to the proposal f
        (the paper leaves r_i unspecified; fixed for the whole refinement), unit-normalised, (B, n, k, d)."""
        bank = F.normalize(own_parameter(self, "memory_banks")[site].to(proposal.dtype), dim=-1)
        similarity = F.normalize(proposal, dim=-1) @ bank.T
        return bank[similarity.topk(self.config.erm_memory_topk, dim=-1).indices]

    @torch.no_grad()
    def update_memory(self, site: int, refined: torch.Tensor, valid: torch.Tensor) -> None:
        """Eq. 16 over a batch: every real position's h* picks the prototype of largest raw dot product; each
        picked prototype moves to beta z + (1 - beta) mean(h* of the positions that picked it)."""
        decay = self.config.erm_memory_ema_decay
        if decay == 1.0:
            return
        bank = self.memory_banks[site]
        states = refined[valid].detach().to(bank.dtype)
        slots = (states @ bank.T).argmax(-1)
        sums = torch.zeros_like(bank).index_add_(0, slots, states)
        counts = torch.zeros(bank.shape[0], dtype=bank.dtype, device=bank.device).index_add_(
            0, slots, torch.ones_like(slots, dtype=bank.dtype))
        hit = (counts > 0).unsqueeze(-1)
        mean = sums / counts.clamp_min(1).unsqueeze(-1)
        bank.copy_(torch.where(hit, decay * bank + (1 - decay) * mean, bank))

    # every step ------------------------------------------------------------------------------------------------
    def reverse_energy(self, hidden, context: EnergyContext, with_gradient: bool):
        """Eq. 12: the mean over the window's real slots of -log q_phi(x_i | h, x_<i), and its h-gradient."""
        normalised, inverse = rms_normalise(context.rev_state + self.rev_cond(hidden).unsqueeze(-2),
                                            self.config.rms_norm_eps)
        normalised = normalised.to(hidden.dtype)
        norm_weight = own_parameter(self, "rev_norm_weight")
        output = self.rev_out(norm_weight * normalised)
        return self._head_energy(output, context, context.window_valid, with_gradient, lambda grad_output: (
            rms_norm_backward(normalised, inverse, (grad_output @ applied_weight(self.rev_out, hidden)) * norm_weight)
            .to(hidden.dtype).sum(-2) @ applied_weight(self.rev_cond, hidden)))

    def masked_energy(self, hidden, context: EnergyContext, with_gradient: bool):
        """Eq. 13: the mean over the window's masked slots of -log p_psi(x_i | h) (0 where none is masked), and
        its h-gradient."""
        offsets = self.mask_offset(torch.arange(self.config.erm_rev_window, device=hidden.device))
        pre = self.mask_in(hidden).unsqueeze(-2) + offsets
        output = self.mask_out(F.gelu(pre))
        return self._head_energy(output, context, context.masked, with_gradient, lambda grad_output: (
            ((grad_output @ applied_weight(self.mask_out, hidden)) * gelu_derivative(pre)).sum(-2)
            @ applied_weight(self.mask_in, hidden)))

    def _head_energy(self, output, context: EnergyContext, scored: torch.Tensor, with_gradient: bool, backward):
        """Mean NLL of the scored slots' tokens under softmax(<candidates, output>), and (through ``backward``,
        the head's map from d/d output to d/d h) its gradient in h."""
        scores = output @ context.candidates.mT
        allowed = None if context.allowed is None else context.allowed.unsqueeze(-2)
        nll, grad_scores = nll_and_grad(scores, allowed, context.targets)
        weights = scored.to(nll.dtype) / scored.sum(-1, keepdim=True).clamp_min(1)
        energy = (nll * weights).sum(-1)
        if not with_gradient:
            return energy, None
        grad_output = (grad_scores * weights.unsqueeze(-1).to(grad_scores.dtype)) @ context.candidates
        return energy, backward(grad_output)

    @staticmethod
    def confidence_energy(hidden, norm_weight, eps, readout, with_gradient: bool):
        """Eq. 14: H[p] - log p_xhat with p = softmax(readout(norm(h))), xhat = argmax p (no gradient through the
        argmax), and its analytic h-gradient (Algorithm 1 line 11). ``readout`` is (V, d), or (B, n, k, d) rows
        of the top-k candidates."""
        normalised, inverse = rms_normalise(hidden, eps)
        features = norm_weight * normalised.to(hidden.dtype)
        shared = readout.dim() == 2  # the whole vocabulary: one GEMM; else per-position candidate rows
        logits = widened(features @ readout.T if shared else (readout @ features.unsqueeze(-1)).squeeze(-1))
        log_probs = logits.log_softmax(-1)
        probs = log_probs.exp()
        entropy = -(probs * log_probs).sum(-1)
        top = log_probs.max(-1)
        energy = entropy - top.values
        if not with_gradient:
            return energy, None
        grad_logits = -probs * (log_probs + entropy.unsqueeze(-1)) + probs - F.one_hot(top.indices, logits.shape[-1])
        grad_logits = grad_logits.to(hidden.dtype)
        grad_features = grad_logits @ readout if shared else (grad_logits.unsqueeze(-2) @ readout).squeeze(-2)
        return energy, rms_norm_backward(normalised, inverse, grad_features * norm_weight)

    def memory_energy(self, hidden, memories: torch.Tensor, with_gradient: bool):
        """Eq. 15: -log sum_{relevant i} exp(cos(h, z_i) / tau) and its h-gradient, -sum_i softmax_i (z^_i -
        cos_i h^) / (tau ||h||)."""
        temperature = self.config.erm_memory_temperature
        hidden, memories = widened(hidden), widened(memories)  # the gradient grows as 1 / ||h||: float32 at least
        norm = hidden.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        unit = hidden / norm
        cosine = (memories @ unit.unsqueeze(-1)).squeeze(-1)
        energy = -torch.logsumexp(cosine / temperature, dim=-1)
        if not with_gradient:
            return energy, None
        weights = (cosine / temperature).softmax(-1)
        direction = (weights.unsqueeze(-2) @ memories).squeeze(-2) - (weights * cosine).sum(-1, keepdim=True) * unit
        return energy, -direction / (temperature * norm)
