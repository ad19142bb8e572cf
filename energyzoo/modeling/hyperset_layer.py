"""The Hyper-SET layer: one iteration of alternating descent on the hyperspherical energy (hyperset.txt §4).

Energies (per sample; W = [W_1..W_H] in R^{d x Hp}, D in R^{d x M}, beta = 1 / sqrt(p)):
    E_ATTN = sum_h beta^-1 sum_i log sum_j exp(beta z_i^h . z_j^h),  z^h = W_h^T x,  ||z_i^h|| = sqrt(p)   (eq. 2-4)
    E_FF   = -1/2 sum_i sum_m ReLU(d_m^T x_i)^2,                     ||D^T x_i|| = sqrt(M)                  (eq. 5)
One iteration (eq. 9, 11), in the paper's closed form (not autograd; the RMSNorm Jacobian is dropped, eq. 9):
    z = RMSNorm_p(W^T x) per head                                                                            (eq. 8)
    x <- x - alpha * W [(softmax_row(A) + softmax_col(A)) z],  A = z z^T / sqrt(p)  ("bi-softmax", eq. 7, 9)
    x <- x + gamma * D act(RMSNorm_M(D^T x))                                                                  (eq. 11)
with per-token, per-channel step sizes alpha, gamma from `HyperSETStepSizes` (eq. 12). For a symmetric A the
column softmax is the row softmax transposed, so the bracket is exactly grad_z of the attention energy.

Each layer has exactly two matrices: W (`qkv_proj`: query = key = value, its transpose the output map) and D
(`ff_proj`: up- and down-projection), plus RMSNorm gains. Both uses of a matrix read one effective weight, so an
adapter that wraps the module (peft's LoRA) and the depth-wise LoRA of App. G.2 act on both.
"""

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import TreeSpec, register_dataclass, tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration_hyperset import HyperSETConfig
from .numerics import applied_bias, applied_weight

# Running statistics of one half-step's update rule (`DescentUpdate`): () for plain descent.
Moments = tuple[torch.Tensor, ...]


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """[sin(t f_k), cos(t f_k)] with f_k = exp(-ln(1e4) k / (dim/2 - 1)), k < dim/2: the step-size network's
    embedding of the iteration t (App. D.1; the code's frequencies), in float64 (cast by the caller), so that a
    float64 model is float64-accurate."""
    half = dim // 2
    frequencies = torch.exp(-math.log(1e4) * torch.arange(half, dtype=torch.float64, device=positions.device)
                            / max(half - 1, 1))
    angles = positions.double()[:, None] * frequencies[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    batch, length, width = x.shape
    return x.view(batch, length, heads, width // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    batch, heads, length, width = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * width)


def bisoftmax(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """(softmax_row(A) + softmax_col(A)) v with A = q k^T / sqrt(p), per head (eq. 9), without an N x N matrix kept
    for backward: the row half is SDPA's fused attention (it keeps its output and log-sum-exp), the column half
    `ColumnSoftmaxRead`, which recomputes its weights in backward. (Materialised, the two softmaxes and their sum kept
    three N x N tensors per head and iteration alive until backward: 2.6x the looped Transformer's training memory.)"""
    scale = query.shape[-1] ** -0.5
    row = F.scaled_dot_product_attention(query, key, value, scale=scale)
    return row + ColumnSoftmaxRead.apply(*_distinct(query, key, value), scale)


def _distinct(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors, a repeated one (the shared norm's q = k = v) as a view of itself: dynamo cannot trace an
    autograd.Function given one tensor twice (torch.compile(fullgraph=True) refuses it); a view is another input,
    and its gradient flows to the same tensor."""
    seen = set()
    distinct = []
    for tensor in tensors:
        distinct.append(tensor.view_as(tensor) if id(tensor) in seen else tensor)
        seen.add(id(tensor))
    return distinct


class ColumnSoftmaxRead(torch.autograd.Function):
    """softmax_col(A) v with A = q k^T * scale: the column softmax (over queries) is the row softmax of A^T = k q^T,
    so the read is S^T v with S = softmax_row(k q^T * scale), computed along contiguous rows (a softmax over dim -2
    runs 1.6x slower on CPU). Only q, k and v are kept for backward, where S is recomputed from one score product:
        dv = S dO,   dS = v dO^T,   dB = S * (dS - rowsum(S * dS)) = S * (dS - <v, dv>),
        dk = scale * dB q,   dq = scale * dB^T k      (B = k q^T * scale, rowsum(S * dS)_j = v_j . dv_j)."""

    @staticmethod
    def forward(ctx, query, key, value, scale):
        ctx.save_for_backward(query, key, value)
        ctx.scale = scale
        return _key_weights(query, key, scale).transpose(-1, -2) @ value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        query, key, value = ctx.saved_tensors
        weights = _key_weights(query, key, ctx.scale)
        grad_value = weights @ grad
        grad_scores = (value @ grad.transpose(-1, -2)).sub_((value * grad_value).sum(-1, keepdim=True)).mul_(weights)
        grad_query = grad_scores.transpose(-1, -2) @ key * ctx.scale if ctx.needs_input_grad[0] else None
        grad_key = grad_scores @ query * ctx.scale if ctx.needs_input_grad[1] else None
        return grad_query, grad_key, grad_value if ctx.needs_input_grad[2] else None, None


def _key_weights(query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax_row(k q^T * scale): each key's distribution over the queries, (..., keys, queries)."""
    return (key * scale @ query.transpose(-1, -2)).softmax(dim=-1)


def sigmoid_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """sigma'(A) v = sigma(A)(1 - sigma(A)) v, A = q k^T / sqrt(p) (App. G.1, Table 19)."""
    scores = torch.sigmoid(query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1]))
    return (scores * (1 - scores)) @ value


def linear_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     scale: str = "head_dim") -> torch.Tensor:
    """phi'(q) * (phi(v) (phi(q)^T phi(k)) s) with phi = sigmoid (App. G.1): O(N), a p x p summary. s = 1 / sqrt(p)
    (``scale="head_dim"``, Table 19) or 1 / sqrt(N) (``"tokens"``, the public MaskGIT code's)."""
    gate = torch.sigmoid(query)
    width = query.shape[-1] if scale == "head_dim" else query.shape[-2]
    summary = gate.transpose(-1, -2) @ torch.sigmoid(key) / math.sqrt(width)
    return (torch.sigmoid(value) @ summary) * gate * (1 - gate)


ATTENTIONS = {"bisoftmax": bisoftmax, "sigmoid": sigmoid_attention, "linear": linear_attention}


def gated_activation(h: torch.Tensor) -> torch.Tensor:
    """(sum_m phi(h_m)) phi'(h) with phi = sigmoid (App. G.1's gated feed-forward energy)."""
    gate = torch.sigmoid(h)
    return gate.sum(-1, keepdim=True) * gate * (1 - gate)


def projection_energy(z: torch.Tensor) -> torch.Tensor:
    """E_ATTN per sample with unit-gain normalisation (eq. 3-4, as measured in Fig. 5), from z = rms_norm(W_h^T x)
    of `unit_projections`, (batch, heads, tokens, p): sqrt(p) sum_{h,i} logsumexp_j(z_i . z_j / sqrt(p))."""
    scale = math.sqrt(z.shape[-1])
    return scale * torch.logsumexp(z @ z.transpose(-1, -2) / scale, dim=-1).sum(dim=(1, 2))


def feedforward_energy(x: torch.Tensor, weight: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """E_FF per sample with unit-gain normalisation (eq. 5): -1/2 sum_i ||ReLU(rms_norm(D^T x_i))||^2."""
    h = F.rms_norm(F.linear(x, weight), (weight.shape[0],), eps=eps)
    return -0.5 * F.relu(h).square().sum(dim=(1, 2))


def unit_projections(x: torch.Tensor, weight: torch.Tensor, heads: int, eps: float | None = None) -> torch.Tensor:
    """rms_norm(W_h^T x) with unit gains, (batch, heads, tokens, p)."""
    z = split_heads(F.linear(x, weight), heads)
    return F.rms_norm(z, (z.shape[-1],), eps=eps)


def effective_rank(z: torch.Tensor) -> torch.Tensor:
    """exp(entropy of sigma / sum sigma) of each (tokens x p) matrix, the singular values sigma (eq. 17)."""
    singular = torch.linalg.svdvals(z.float())
    weights = singular / singular.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.exp(-(weights * torch.log(weights.clamp_min(1e-30))).sum(-1))


def average_angle(z: torch.Tensor) -> torch.Tensor:
    """Mean pairwise angle between the tokens of each (tokens x p) matrix, in degrees. The public code's
    definition (mean of the arccos), not eq. 18's arccos of the mean cosine, so that the numbers compare with the
    code's figures (Fig. 6, App. D.5)."""
    unit = F.normalize(z.float(), dim=-1)
    cosines = (unit @ unit.transpose(-1, -2)).clamp(-1.0, 1.0)
    tokens = z.shape[-2]
    upper = torch.triu(torch.ones(tokens, tokens, dtype=torch.bool, device=z.device), diagonal=1)
    return torch.rad2deg(torch.arccos(cosines[..., upper])).mean(-1)


class DescentUpdate:
    """The update a half-step applies, from its descent direction g at iteration t = 1, 2, ... (`update_mode` of
    `HyperSETConfig`; the public code's ``adaptive_mode``): g itself (eq. 9, 11), heavy-ball momentum, RMSProp,
    RMSProp with momentum, or Adam with bias correction. ``moments`` are the rule's running statistics, () before
    the first iteration (zeros)."""

    def __init__(self, config: HyperSETConfig):
        self.mode = config.update_mode
        self.momentum = config.update_momentum
        self.decay = config.second_moment_decay
        self.eps = config.update_eps

    def __call__(self, g: torch.Tensor, moments: Moments, t: int) -> tuple[torch.Tensor, Moments]:
        if self.mode == "gd":
            return g, ()
        mu, eta = self.momentum, self.decay
        if not moments:
            moments = (torch.zeros_like(g),) * (1 if self.mode == "momentum" else 2)
        if self.mode == "momentum":
            velocity = mu * moments[0] + g
            return velocity, (velocity,)
        second = eta * moments[-1] + (1 - eta) * g.square()
        if self.mode == "rmsprop":
            return g / (second.sqrt() + self.eps), (second,)
        if self.mode == "rmsprop_momentum":
            velocity = mu * moments[0] + g / (second.sqrt() + self.eps)
            return velocity, (velocity, second)
        first = mu * moments[0] + (1 - mu) * g
        corrected = first / (1 - mu**t) / ((second / (1 - eta**t)).sqrt() + self.eps)
        return corrected, (first, second)


class IteratedLayer(GradientCheckpointingLayer):
    """A layer the model iterates: ``iteration(x, steps, lora, with_diagnostics, moments, t) -> (x', diagnostics,
    moments')`` with the iteration's `StepSizes`, written by a subclass as `iterate`; the model records a hidden
    state after every iteration of every such layer.

    `forward` takes the iteration's tensors flat and positional and returns them flat, x' first: reentrant
    checkpointing (``use_reentrant=True``, transformers' default) detaches and returns top-level tensors only, and
    an iteration's other tensors are nested (the step sizes' time embedding and condition, which every iteration
    shares; depth-wise LoRA; the update rule's moments, carried between iterations). Nested, their graph would be
    walked by every iteration's backward (an error the second time) and the moments would come back without one
    (their gradient silently lost)."""

    def iteration(self, *args, **kwargs):
        tensors, others = split_tensors((args, kwargs))
        *outputs, output_others = self(*tensors, others=others)
        return joined_tensors(outputs, output_others)

    def forward(self, *tensors, others):
        args, kwargs = joined_tensors(tensors, others)
        outputs, output_others = split_tensors(self.iterate(*args, **kwargs))
        return *outputs, output_others

    def iterate(self, x, steps, lora=None, with_diagnostics=False, moments=((), ()), t=1):
        raise NotImplementedError


TENSOR_PLACE = object()  # where `split_tensors` took a tensor out


def split_tensors(tree) -> tuple[list[torch.Tensor], tuple[list, TreeSpec]]:
    """The tensors of a nested structure (tuples, dicts, registered dataclasses), in order, and the rest of it."""
    leaves, layout = tree_flatten(tree)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    return tensors, ([TENSOR_PLACE if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], layout)


def joined_tensors(tensors, others: tuple[list, TreeSpec]):
    """The structure `split_tensors` took apart, with ``tensors`` in its tensors' places."""
    places, layout = others
    supply = iter(tensors)
    return tree_unflatten([next(supply) if leaf is TENSOR_PLACE else leaf for leaf in places], layout)


class HyperSETLayer(IteratedLayer):
    """One Hyper-SET layer: W, D and their RMSNorm gains (and, with ``step_head_per_layer``, its own step-size head);
    `forward` is one iteration (eq. 9 then eq. 11, each half-step through the `DescentUpdate` rule) and, on request,
    its traced quantities. W and D are read inside `forward` only, where a sharded (FSDP) layer holds them whole."""

    def __init__(self, config: HyperSETConfig):
        super().__init__()
        # the energies' RMSNorm eps (None: float32's machine epsilon, as the float32 model's norms use)
        self.energy_eps = config.rms_norm_eps or torch.finfo(torch.float32).eps
        self.heads = config.num_attention_heads
        attention = ATTENTIONS[config.attention_type]
        if config.attention_type == "linear":
            attention = functools.partial(attention, scale=config.linear_attention_scale)
        self.attention = attention
        self.activation = {"standard": {"relu": F.relu, "gelu": F.gelu}[config.hidden_act],
                           "softmax": lambda h: h.softmax(dim=-1), "gated": gated_activation}[config.ff_type]
        self.update = DescentUpdate(config)
        self.qkv_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.ff_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        gains = 1 if config.qkv_norm == "shared" else 3  # query, key, value
        self.qkv_norms = nn.ModuleList(nn.RMSNorm(config.head_dim, eps=config.rms_norm_eps) for _ in range(gains))
        self.ff_norm = nn.RMSNorm(config.intermediate_size, eps=config.rms_norm_eps)
        self.step_head = HyperSETStepSizes(config, time_path=False) if config.step_head_per_layer else None

    def weights(self, lora: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(W, D) as (out, in) weights, with an iteration's depth-wise LoRA updates added."""
        w, d = applied_weight(self.qkv_proj), applied_weight(self.ff_proj)
        if lora is not None:
            w, d = w + lora[0], d + lora[1]
        return w, d

    def attention_direction(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """W [attention of the normalised projections] (eq. 9: bi-softmax; App. G.1 alternatives): the step is
        x - alpha * this."""
        z = split_heads(F.linear(x, w), self.heads)
        normed = [norm(z) for norm in self.qkv_norms]
        query, key, value = normed if len(normed) == 3 else normed * 3
        return merge_heads(self.attention(query, key, value)) @ w

    def feedforward_direction(self, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """D act(RMSNorm(D^T x)) (eq. 11; `ff_type` picks act): the step is x + gamma * this."""
        return self.activation(self.ff_norm(F.linear(x, d))) @ d

    def iterate(self, x, steps: "StepSizes", lora: tuple[torch.Tensor, torch.Tensor] | None = None,
                with_diagnostics: bool = False, moments: tuple[Moments, Moments] = ((), ()), t: int = 1,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[Moments, Moments]]:
        """(x after iteration t (one-based) with the iteration's step sizes and depth-wise LoRA updates, its
        `diagnostics` or {}, the update rule's moments of both half-steps)."""
        w, d = self.weights(lora)
        attention_update, attention_moments = self.update(self.attention_direction(x, w), moments[0], t)
        attended = steps.step(x, attention_update, ATTENTION_HALF)
        feedforward_update, feedforward_moments = self.update(self.feedforward_direction(attended, d), moments[1], t)
        updated = steps.step(attended, feedforward_update, FEEDFORWARD_HALF)
        diagnostics = self.diagnostics(x, updated, steps, w, d) if with_diagnostics else {}
        return updated, diagnostics, (attention_moments, feedforward_moments)

    @torch.no_grad()
    def diagnostics(self, before, after, steps: "StepSizes", w, d) -> dict[str, torch.Tensor]:
        """The traced quantities of one iteration (`modeling_hyperset`'s docstring), per sample, in float32."""
        alpha, gamma = steps.sizes()
        after32 = after.float()
        z = unit_projections(after32, w.float(), self.heads, self.energy_eps)
        e_attn = projection_energy(z)
        e_ff = feedforward_energy(after32, d.float(), self.energy_eps)

        def per_sample(value):  # a per-token, per-channel step size (or a fixed scalar) averaged per sample
            return value.float().expand_as(after).mean(dim=(1, 2))

        return {
            "energy": e_attn + e_ff,
            "attention_energy": e_attn,
            "feedforward_energy": e_ff,
            "step_size": per_sample(alpha),
            "feedforward_step_size": per_sample(gamma),
            "residual": torch.linalg.vector_norm((after - before).float(), dim=-1).mean(-1),
            "effective_rank": effective_rank(z).mean(1),
            "average_angle": average_angle(z).mean(1),
        }


class TransformerBaselineLayer(IteratedLayer):
    """The paper's Transformer baseline (hyperset.txt §5: "we remove biases and dropout, use the Pre-Norm style with
    RMSNorm, and set the MLP ratio to 4 in Transformer. We use one-layer trainable parameters but vary the forward
    iterations for all models"): x <- x + O attn(Q, K, V of RMSNorm(x)); x <- x + D_down act(D_up RMSNorm(x)),
    full (non-causal) softmax attention, the MLP width `intermediate_size` (4d in the baseline presets) and act
    `hidden_act`. The step sizes and depth-wise LoRA are Hyper-SET's and are not used; the trace has the update size
    (``residual``) only, since this layer descends no energy."""

    def __init__(self, config: HyperSETConfig):
        super().__init__()
        width = config.hidden_size
        self.heads = config.num_attention_heads
        self.attention_norm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.mlp_norm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.up_proj = nn.Linear(width, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, width, bias=False)
        self.activation = {"relu": F.relu, "gelu": F.gelu}[config.hidden_act]

    def iterate(self, x, steps=None, lora=None, with_diagnostics: bool = False, moments=((), ()), t=1,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[Moments, Moments]]:
        normed = self.attention_norm(x)
        query, key, value = (split_heads(projection(normed), self.heads)
                             for projection in (self.q_proj, self.k_proj, self.v_proj))
        attended = x + self.o_proj(merge_heads(F.scaled_dot_product_attention(query, key, value)))
        updated = attended + self.down_proj(self.activation(self.up_proj(self.mlp_norm(attended))))
        if not with_diagnostics:
            return updated, {}, moments
        return updated, {"residual": torch.linalg.vector_norm((updated - x).detach().float(), dim=-1).mean(-1)}, moments


class HyperSETStepSizes(nn.Module):
    """Per-token, per-channel step sizes (alpha_t, gamma_t) = net(t, condition) (eq. 12, App. D.1 Table 6):
    c_t = MLP(sinusoid_te(t)) (or the raw sinusoid of width d when time_embed_dim = 0), then
    (alpha, gamma) = Linear_{d -> 2d}(GELU([RMSNorm](c_t + condition))), condition = x(0) or x_t, RMS-normalised
    with `condition_rmsnorm`. The time path (``time_path``) and the head (``head``) are its two parts: the model's
    network has both, or (``step_head_per_layer``) the time path only, each layer a head of its own.
    Zero-initialised (`step_zero_init`), so alpha = gamma = 0 at initialisation: the model is the identity."""

    def __init__(self, config: HyperSETConfig, time_path: bool = True, head: bool = True):
        super().__init__()
        width, eps = config.hidden_size, config.rms_norm_eps
        self.time_embed_dim = config.time_embed_dim
        self.time_mlp = None
        if time_path and config.time_embed_dim:
            norm = (lambda: nn.RMSNorm(width, eps=eps)) if config.step_net_rmsnorm else nn.Identity
            self.time_mlp = nn.Sequential(nn.Linear(config.time_embed_dim, width), norm(), nn.GELU(), norm(),
                                          nn.Linear(width, width), norm())
        if head:
            self.condition_norm = nn.RMSNorm(width, eps=eps) if config.condition_rmsnorm else None
            self.head_norm = nn.RMSNorm(width, eps=eps) if config.step_head_rmsnorm else nn.Identity()
            self.out_proj = nn.Linear(width, 2 * width)
        zeroed = self.modules() if config.step_zero_init == "all" else [getattr(self, "out_proj", None)]
        for linear in zeroed:
            if isinstance(linear, nn.Linear):
                linear.starts_at_zero = True  # read by the model's `_init_weights`

    def time_embeddings(self, iterations: int, like: torch.Tensor) -> torch.Tensor:
        """c_t for t = 1..iterations (the code's one-based t), (iterations, d): input-independent, so computed
        once per forward."""
        t = torch.arange(1, iterations + 1, device=like.device)
        embedded = sinusoid(t, self.time_embed_dim or like.shape[-1]).to(like.dtype)
        return embedded if self.time_mlp is None else self.time_mlp(embedded)

    def forward(self, time_embedding: torch.Tensor, condition: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(alpha, gamma) of the iteration whose c_t is ``time_embedding``, per token and channel."""
        return self.out_proj(self._hidden(time_embedding, condition)).chunk(2, dim=-1)

    def half(self, time_embedding: torch.Tensor, condition: torch.Tensor, half: int) -> torch.Tensor:
        """alpha (``half`` 0) or gamma (1) alone: the output layer's rows of that half only."""
        weight, bias = (None if tensor is None else tensor.chunk(2)[half]
                        for tensor in (applied_weight(self.out_proj), applied_bias(self.out_proj)))
        return F.linear(self._hidden(time_embedding, condition), weight, bias)

    def _hidden(self, time_embedding, condition):
        if self.condition_norm is not None:
            condition = self.condition_norm(condition)
        return F.gelu(self.head_norm(time_embedding + condition))


ATTENTION_HALF, FEEDFORWARD_HALF = 0, 1  # x - alpha * u (eq. 9), x + gamma * u (eq. 11)
HALF_STEP_SIGNS = (-1.0, 1.0)


class StepSizes:
    """The step sizes of one iteration and the half-steps that apply them to an update u: x - alpha u (eq. 9) and
    x + gamma u (eq. 11). `FixedStepSizes` (Table 4's constants) and `LearnedStepSizes` (eq. 12's network)."""

    def sizes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(alpha, gamma), for the trace."""
        raise NotImplementedError

    def step(self, x: torch.Tensor, update: torch.Tensor, half: int) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class FixedStepSizes(StepSizes):
    """Table 4's fixed alpha and gamma (0-d tensors)."""

    alpha: torch.Tensor
    gamma: torch.Tensor

    def sizes(self):
        return self.alpha, self.gamma

    def step(self, x, update, half):
        return torch.addcmul(x, self.sizes()[half], update, value=HALF_STEP_SIGNS[half])


@dataclass
class LearnedStepSizes(StepSizes):
    """alpha and gamma from a step-size head (the model's shared network, or a layer's own) at the iteration whose
    c_t is ``time_embedding``. Training makes each half-step one recomputed region (`checkpoint`): it keeps its
    inputs x, u and the head's, not alpha or gamma, which the products x -/+ size * u would keep per token and
    channel for every iteration (12 iterations of hyperset-small-in1k: 76 MiB) and backward recomputes from the
    head's inputs with its half of the output layer. Otherwise the head runs once per iteration."""

    head: HyperSETStepSizes
    time_embedding: torch.Tensor
    condition: torch.Tensor

    computed: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, init=False)  # (alpha, gamma)

    def sizes(self):
        if self.computed is None:
            self.computed = self.head(self.time_embedding, self.condition)
        return self.computed

    def step(self, x, update, half):
        if self.head.training and torch.is_grad_enabled():
            return checkpoint(self._recomputed_step, x, update, self.time_embedding, self.condition, half,
                              use_reentrant=False)
        return torch.addcmul(x, self.sizes()[half], update, value=HALF_STEP_SIGNS[half])

    def _recomputed_step(self, x, update, time_embedding, condition, half):
        size = self.head.half(time_embedding, condition, half)
        return torch.addcmul(x, size, update, value=HALF_STEP_SIGNS[half])


# step sizes cross `IteratedLayer.forward` as their tensors (the head a constant; `computed` is rebuilt)
register_dataclass(FixedStepSizes)
register_dataclass(LearnedStepSizes, field_names=["head", "time_embedding", "condition"],
                   drop_field_names=["computed"])


class DepthwiseLoRA(nn.Module):
    """Per-iteration low-rank updates of every layer's W and D (App. G.2): W + s A_r B_r, D + s A'_r B'_r for
    iteration r, shared by the layers, s = lora_alpha / lora_rank. Iterations beyond the R trained ones (test-time
    scaling) reuse the last update. A and B start at N(0, 0.02), as in the code (neither is zero)."""

    def __init__(self, config: HyperSETConfig):
        super().__init__()
        rank, width, steps = config.lora_rank, config.hidden_size, config.num_iterations
        self.scale = config.lora_scale
        self.qkv_down = nn.Parameter(torch.empty(steps, rank, width))
        self.qkv_up = nn.Parameter(torch.empty(steps, width, rank))
        self.ff_down = nn.Parameter(torch.empty(steps, rank, width))
        self.ff_up = nn.Parameter(torch.empty(steps, config.intermediate_size, rank))

    def forward(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = min(iteration, self.qkv_down.shape[0] - 1)
        return self.scale * self.qkv_up[r] @ self.qkv_down[r], self.scale * self.ff_up[r] @ self.ff_down[r]
