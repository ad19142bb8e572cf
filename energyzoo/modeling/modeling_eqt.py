"""EqT-LLaMA: Llama whose chosen decoder layers' outputs are refined by the Equilibrium Refinement Module before
the next layer reads them (eqt.txt "Closed-Loop Transformers" §3, Algorithm 1).

At a refined site the decoder layer's output is the proposal f (eq. 6), and the ERM returns K proximal gradient
steps on the label-free energy L of `eqt_energy` (eq. 7-8):

    h_0 = f,   h_{k+1} = h_k - alpha [grad_h L(h_k) + (h_k - f) / gamma],   h* = h_K.

The model is written as a diff of transformers' Llama: `EqTLlamaModel` is a `LlamaModel` (its modules, names and
initialisation) with the ERM added and called inside Llama's layer loop, `EqTLlamaForCausalLM` Llama's head on it.
Llama's own weights, names and computations are untouched, so a Llama checkpoint loads directly (only the
``model.erm.*`` weights are new), and with K = 0 or every lambda = 0 the logits are Llama's exactly (h_k = f).
The refinement is per position and reads tokens at or before the position only, so the model stays causal; the
refined state feeds the next layer, whose keys and values are cached as usual, and the first layer's cache layer also
carries the token window the energies read (`eqt_cache`), so decoding refines only the new positions.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.initialization import normal_, ones_, zeros_
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaModel,
    LlamaPreTrainedModel,
)
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .caches import CacheKindsMixin, own_cache_layer
from .configuration_eqt import EqTLlamaConfig
from .eqt_cache import WINDOW_LAYERS, TokenWindow
from .eqt_energy import EnergyContext, EqTEnergyNetwork
from .errors import UserError
from .inputs import CausalLMLossMixin, check_token_inputs
from .numerics import applied_weight, own_parameter, widened, work_dtype
from .outputs import (
    BaseModelOutputWithEnergies,
    CausalLMOutputWithEnergies,
    passed_on,
    record_energies,
    recording_energies,
    records_energies,
)
from .positions import real_tokens
from .refinement import EarlyExit, refine, refinement_steps, takes_refinement_steps
from .transformers_compat import takes_cache, with_cache


@dataclass
class SiteInputs:
    """What the energies at one refined site read besides h: the proposal f, the forward's `EnergyContext` (None
    when the reverse and masked terms are off), the relevant memories (eq. 15), the confidence readout (the LM
    head's rows, (V, d) or the proposal's top-k per position) and the final norm's gain and epsilon."""

    proposal: torch.Tensor
    context: EnergyContext | None
    memories: torch.Tensor | None
    readout: torch.Tensor
    norm_weight: torch.Tensor
    norm_eps: float


@dataclass(frozen=True)
class EnergyTerm:
    """One term of eq. 11: the config field of its weight lambda, and ``evaluate(energy network, h, site inputs,
    with_gradient) -> (value per position, grad_h or None)``."""

    weight_field: str
    evaluate: Callable[[EqTEnergyNetwork, torch.Tensor, SiteInputs, bool], tuple]


ENERGY_TERMS = {
    "reverse": EnergyTerm("lambda_rev", lambda energy, h, site, grad: energy.reverse_energy(h, site.context, grad)),
    "masked": EnergyTerm("lambda_mask", lambda energy, h, site, grad: energy.masked_energy(h, site.context, grad)),
    "confidence": EnergyTerm("lambda_conf", lambda energy, h, site, grad: energy.confidence_energy(
        h, site.norm_weight, site.norm_eps, site.readout, grad)),
    "memory": EnergyTerm("lambda_mem", lambda energy, h, site, grad: energy.memory_energy(h, site.memories, grad)),
}


@dataclass
class EqTModelOutput(BaseModelOutputWithEnergies):
    """`BaseModelOutputWithEnergies` plus ``refined_energy``: the mean energy L(h*) over the refined sites and the
    real positions (eq. 18's second term), when the caller asked for it."""

    refined_energy: torch.Tensor | None = None


class EquilibriumRefinement(nn.Module):
    """The ERM (eqt.txt §3.2, Algorithm 1) on the zoo's shared refinement loop (`refinement.refine`).

    - K: `erm_num_steps_train` in training, `erm_num_steps` otherwise; ``refinement_steps=K`` overrides both.
    - Early stop (§3.7): with `erm_tol`, a position stops once ||h_{k+1} - h_k|| / ||h_k|| <= erm_tol, decided from
      its own trajectory only.
    - Gradients (§3.5): "unrolled" differentiates through the K steps (the steps' energy gradients are explicit
      expressions, see `eqt_energy`). "implicit" runs the steps without a graph and differentiates the fixed point
      h* = T(h*), T(h) = h - alpha [grad L(h) + (h - f) / gamma], by the implicit function theorem: the incoming
      gradient v becomes y = (I - dT/dh^T)^-1 v (fixed-point iteration, `erm_implicit_iterations` steps, converging
      where the forward contracts), pushed through one step T(h*) into theta and f. That is
      dh*/dtheta = -(H + I/gamma)^-1 (d grad L / dtheta - (1/gamma) df/dtheta): eq. 19 with the path through f
      it omits, without which the decoder below would get no gradient.
    - Trace (``output_energies=True``): per step the four energy terms, the weighted energy, the proximal term
      ||h - f||^2 / (2 gamma), the relative update ||h_{k+1} - h_k|| / ||h_k|| as ``residual``, alpha as
      ``step_size``; and the ``iterations`` used. Means over the real positions.
    """

    def __init__(self, config: EqTLlamaConfig):
        super().__init__()
        self.config = config
        self.energy = EqTEnergyNetwork(config)

    def weights(self) -> dict[str, float]:
        return {name: getattr(self.config, term.weight_field) for name, term in ENERGY_TERMS.items()}

    def evaluate(self, hidden: torch.Tensor, inputs: SiteInputs, with_gradient: bool):
        """(L(h) per position, each term per position, grad_h L or None) for eq. 11's weighted energy."""
        terms, gradient = {}, None
        total = torch.zeros(hidden.shape[:-1], dtype=work_dtype(hidden.dtype),
                            device=hidden.device)
        for name, weight in self.weights().items():
            if weight == 0:
                continue
            value, grad = ENERGY_TERMS[name].evaluate(self.energy, hidden, inputs, with_gradient)
            terms[name] = value
            total = total + weight * value
            if with_gradient:  # summed in float32 at least, like the energies
                grad = weight * widened(grad)
                gradient = grad if gradient is None else gradient + grad
        if gradient is None and with_gradient:
            gradient = torch.zeros_like(widened(hidden))
        return total, terms, gradient

    def proximal_step(self, hidden: torch.Tensor, gradient: torch.Tensor, proposal: torch.Tensor) -> torch.Tensor:
        """T(h) = h - alpha [grad L(h) + (h - f) / gamma] (eq. 8), in float32 at least and returned in h's dtype,
        saturated at its largest finite value: near a zero state (a zero embedding, the pad id's, as the first token)
        the RMS-normalised and cosine energies have gradients of order 1/sqrt(rms_norm_eps) and 1/||h||, past float16's
        range, and the state a step lands on can be too (transformers clamps float16 hidden states the same way)."""
        config = self.config
        state = widened(hidden)
        following = state - config.erm_step_size * (gradient + (state - widened(proposal)) / config.erm_gamma)
        bound = torch.finfo(hidden.dtype).max
        return following.clamp(-bound, bound).to(hidden.dtype)

    def forward(self, inputs: SiteInputs, valid: torch.Tensor) -> torch.Tensor:
        config = self.config
        steps = refinement_steps(config.erm_num_steps_train if self.training else config.erm_num_steps)
        tracing = recording_energies()
        early_exit = None if config.erm_tol is None else EarlyExit(config.erm_tol)
        weight = valid.to(inputs.proposal.dtype)

        def masked_mean(value: torch.Tensor) -> torch.Tensor:
            return (value * weight).sum() / weight.sum().clamp_min(1)

        def one_step(index: int, state: tuple) -> tuple:
            (hidden,) = state
            total, terms, gradient = self.evaluate(hidden, inputs, with_gradient=True)
            following = self.proximal_step(hidden, gradient, inputs.proposal)
            residual = records = None
            if tracing or early_exit is not None:
                residual = (following - hidden).norm(dim=-1) / hidden.norm(dim=-1).clamp_min(1e-12)
            if tracing:
                records = {f"{name}_energy": masked_mean(terms.get(name, torch.zeros_like(total)))
                           for name in ENERGY_TERMS}
                proximal = (hidden - inputs.proposal).pow(2).sum(-1) / (2 * config.erm_gamma)
                records.update(energy=masked_mean(total), residual=masked_mean(residual),
                               proximal_energy=masked_mean(proximal),
                               step_size=torch.tensor(config.erm_step_size))
            return (following,), residual, records or {}

        implicit = config.erm_backprop == "implicit" and self.training and torch.is_grad_enabled() and steps > 0
        with torch.set_grad_enabled(torch.is_grad_enabled() and not implicit):
            result = refine(one_step, (inputs.proposal,), steps, early_exit=early_exit,
                            records="detached" if tracing else None)
        refined = result.state[0]
        if implicit:
            refined = self.implicit_gradient(refined, inputs)
        if tracing:
            iterations = result.iterations
            iterations = masked_mean(iterations) if iterations.dim() else iterations
            record_energies({**result.records, "iterations": iterations})
        return refined

    def implicit_gradient(self, fixed_point: torch.Tensor, inputs: SiteInputs) -> torch.Tensor:
        """T(h*) (= h* at the fixed point), whose backward solves y = v + dT/dh^T y before reaching theta and f."""
        anchor = fixed_point.detach().requires_grad_(True)
        mapped = self.proximal_step(anchor, self.evaluate(anchor, inputs, with_gradient=True)[2], inputs.proposal)

        def solve(incoming: torch.Tensor) -> torch.Tensor:
            handle.remove()  # the vector-Jacobian products below pass through `mapped` again
            solution = incoming
            for _ in range(self.config.erm_implicit_iterations):
                solution = incoming + torch.autograd.grad(mapped, anchor, solution, retain_graph=True)[0]
            return solution

        handle = mapped.register_hook(solve)
        return mapped


class EqTLlamaPreTrainedModel(LlamaPreTrainedModel):
    config_class = EqTLlamaConfig
    config: EqTLlamaConfig
    # Llama's decoder layers only: the reverse encoder's layers (erm.energy.rev_layers) are not the model's layers
    _can_record_outputs = {
        "hidden_states": OutputRecorder(LlamaDecoderLayer, layer_name="layers"),
        "attentions": OutputRecorder(LlamaAttention, index=1, layer_name="layers"),
    }
    _supports_flash_attn = False  # the reverse encoder's sliding-window mask is an SDPA / eager mask
    # The cache's token window cannot be rewound (the tokens before it are not kept): generate() refuses assisted and
    # prompt-lookup decoding up front, with its message for stateful models, instead of failing when it crops.
    _is_stateful = True

    def set_attn_implementation(self, attn_implementation) -> None:
        """Llama's, and the reverse encoder follows (`EqTEnergyNetwork.follow_attention`)."""
        super().set_attn_implementation(attn_implementation)
        for module in self.modules():
            if isinstance(module, EqTEnergyNetwork):
                module.follow_attention(self.config._attn_implementation)

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, EqTEnergyNetwork):
            zeros_(module.rev_start)
            ones_(module.rev_norm_weight)
            normal_(module.memory_banks, std=1.0)
            normal_(module.rev_offset.weight, std=self.config.initializer_range)
            normal_(module.mask_offset.weight, std=self.config.initializer_range)


class EqTLlamaModel(EqTLlamaPreTrainedModel, LlamaModel):
    """`LlamaModel` (its modules, names and initialisation) plus ``erm``, called after each layer of
    `config.erm_sites`: the one change to Llama's forward is the refinement inside its layer loop."""

    def __init__(self, config: EqTLlamaConfig):
        super().__init__(config)
        self.erm = EquilibriumRefinement(config)
        self.post_init()

    def post_init(self):
        """Once the ERM exists (Llama's ``__init__`` ends in its own call): the weights are drawn once, in module
        order, so a seed gives the model it gave when EqT-LLaMA built Llama's modules itself."""
        if "erm" in self._modules:
            super().post_init()

    @takes_cache
    @records_energies
    @takes_refinement_steps
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        readout_weight: torch.Tensor | None = None,
        return_refined_energy: bool = False,
        **kwargs,
    ) -> EqTModelOutput:
        """Llama's forward with the ERM after the refined layers. ``readout_weight`` is the (V, d) readout of the
        confidence energy (eq. 14; `EqTLlamaForCausalLM` passes its LM head, the bare model its token embedding);
        ``return_refined_energy`` adds L(h*) for eq. 18's loss. ``hidden_states`` are the decoder layers' outputs
        (the proposals f at refined layers)."""
        config = self.config
        check_token_inputs(type(self).__name__, input_ids, inputs_embeds, attention_mask,
                           self.embed_tokens.num_embeddings, config.hidden_size, cache)
        if input_ids is None and (config.lambda_rev or config.lambda_mask):
            raise UserError("EqT-LLaMA's reverse and masked energies (eq. 12-13) read the token ids: pass input_ids, "
                             "or set lambda_rev = lambda_mask = 0 to refine from inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        use_cache = config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=config)
        if position_ids is None:
            past_seen_tokens = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            position_ids = position_ids.unsqueeze(0)
        causal_mask = create_causal_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                         position_ids=position_ids, **with_cache(cache))
        valid, context = self._energy_inputs(input_ids, inputs_embeds, attention_mask, cache)
        readout = own_parameter(self.embed_tokens, "weight") if readout_weight is None else readout_weight

        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        energies = []
        for index, decoder_layer in enumerate(self.layers[: config.num_hidden_layers]):
            hidden_states = decoder_layer(
                hidden_states,
                attention_mask=causal_mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                use_cache=use_cache,
                **with_cache(cache),
                **kwargs,
            )
            if index in config.erm_sites:  # the one change to Llama's loop: the ERM refines this layer's output
                hidden_states = self._refine(config.erm_sites.index(index), hidden_states, valid, context, readout,
                                             energies if return_refined_energy else None)
        refined_energy = None
        if return_refined_energy:
            per_position = sum(energies) / len(energies)
            refined_energy = (per_position * valid).sum() / valid.sum().clamp_min(1)
        return EqTModelOutput(last_hidden_state=self.norm(hidden_states), **with_cache(cache),
                              refined_energy=refined_energy)

    def _refine(self, site: int, proposal: torch.Tensor, valid: torch.Tensor, context, readout: torch.Tensor,
                energies: list | None) -> torch.Tensor:
        """h* of the ERM at refined site ``site`` from the layer's output f (eq. 6-8); appends L(h*) to ``energies``
        (eq. 18's loss) when given; in training, the site's memory bank follows h* (eq. 15-16)."""
        inputs = self._site_inputs(site, proposal, context, readout)
        refined = self.erm(inputs, valid)
        if energies is not None:
            energies.append(self.erm.evaluate(refined, inputs, with_gradient=False)[0])
        if self.training:
            self.erm.energy.update_memory(site, refined, valid)
        return refined

    def _energy_inputs(self, input_ids, inputs_embeds, attention_mask, cache):
        """The chunk's real-token flags, and the `EnergyContext` of eq. 12-13 over the chunk and the token window
        kept in the cache (which it advances)."""
        config = self.config
        batch, length = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        valid = real_tokens(attention_mask, inputs_embeds, dense=True)
        if input_ids is None:
            return valid, None
        input_ids = input_ids.long()  # the window's ids index gathers and one-hot targets, whatever int type came in
        keep = config.erm_context_length
        layer = self._window_layer(cache)
        if layer is not None and layer.ids is not None:
            previous_ids, previous_valid, previous_keys, real_seen = layer.states()
        else:  # an empty window when caching (slots flagged as padding, keyed -1 like left padding), else none
            slots = keep if layer is not None else 0
            previous_ids = input_ids.new_zeros(batch, slots)
            previous_valid, previous_keys = valid.new_zeros(batch, slots), previous_ids - 1
            real_seen = torch.zeros(batch, dtype=torch.long, device=device)
        keys = real_seen[:, None] + valid.long().cumsum(-1) - 1
        ids = torch.cat([previous_ids, input_ids], dim=1)
        all_valid = torch.cat([previous_valid, valid], dim=1)
        all_keys = torch.cat([previous_keys, keys], dim=1)
        if layer is not None:
            layer.store(ids, all_valid, all_keys, real_seen + valid.sum(-1), keep=keep)
        if not (config.lambda_rev or config.lambda_mask):
            return valid, None
        return valid, self.erm.energy.context(own_parameter(self.embed_tokens, "weight"), ids, all_valid, all_keys,
                                              length)

    @staticmethod
    def _window_layer(cache: Cache | None) -> TokenWindow | None:
        """The first decoder layer's cache layer, which keeps the token window (`eqt_cache`)."""
        return own_cache_layer(cache, 0, WINDOW_LAYERS, "EqT-LLaMA")

    def _site_inputs(self, site: int, proposal: torch.Tensor, context, readout: torch.Tensor) -> SiteInputs:
        config = self.config
        memories = self.erm.energy.relevant_memories(site, proposal) if config.lambda_mem else None
        if config.erm_confidence_topk is not None and config.lambda_conf:
            with torch.no_grad():  # the candidate set of eq. 14 is fixed by the proposal, like its argmax
                logits = self.norm(proposal) @ readout.T
                candidates = logits.topk(config.erm_confidence_topk, dim=-1).indices
            readout = readout[candidates]
        return SiteInputs(proposal, context, memories, readout, own_parameter(self.norm, "weight"),
                          self.norm.variance_epsilon)


class EqTLlamaForCausalLM(CausalLMLossMixin, CacheKindsMixin, EqTLlamaPreTrainedModel, GenerationMixin):
    """EqT-LLaMA with Llama's LM head. Loss (eq. 18): mean next-token cross-entropy + ``energy_loss_weight`` *
    mean L(h*) over the refined sites and real positions, so plain `Trainer` and peft train it.

    Warm start: ``EqTLlamaForCausalLM.from_pretrained(llama_dir, **erm_fields)`` loads a Llama checkpoint (config
    and weights); transformers reports the ``model.erm.*`` weights as newly initialised. `from_llama` does the same
    from a model in memory."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # Llama's: a tied checkpoint shards the weight the head reads
    # eq. 18's energy term is a per-batch mean: `Trainer` must average the micro-batches of an accumulated step itself
    accepts_loss_kwargs = False
    other_caches_refused = ("its first cache layer also keeps the energies' token window, which offloaded and "
                            "quantized caches would leave behind")

    def __init__(self, config: EqTLlamaConfig):
        super().__init__(config)
        self.model = EqTLlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @takes_cache
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_energies: bool = False,
        refinement_steps: int | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithEnergies:
        """Llama's arguments, plus ``output_energies`` (the ERM's `EnergyTrace`) and ``refinement_steps`` (K for
        this call, None: the config's; `generate(..., refinement_steps=K)` passes it to every step)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_energies=output_energies,
            refinement_steps=refinement_steps,
            readout_weight=applied_weight(self.lm_head),  # the matrix it applies: quantized or offloaded too
            return_refined_energy=labels is not None,
            **kwargs,
        )
        logits, loss = self.head_logits_and_loss(outputs.last_hidden_state, labels, logits_to_keep, **kwargs)
        if loss is not None:
            loss = loss + self.config.energy_loss_weight * outputs.refined_energy  # eq. 18
        return CausalLMOutputWithEnergies(loss=loss, logits=logits, **passed_on(outputs))

    @classmethod
    def from_llama(cls, llama_model: nn.Module, **erm_fields) -> "EqTLlamaForCausalLM":
        """EqT-LLaMA over a `LlamaForCausalLM` in memory: its config plus ``erm_fields``, its weights copied, the
        ERM initialised."""
        config = EqTLlamaConfig(**{**llama_model.config.to_dict(), "model_type": "eqt-llama", **erm_fields})
        model = cls(config).to(next(llama_model.parameters()).dtype)
        result = model.load_state_dict(llama_model.state_dict(), strict=False)
        if result.unexpected_keys or any(not key.startswith("model.erm.") for key in result.missing_keys):
            raise UserError(f"Llama weights do not fit EqT-LLaMA: unexpected {result.unexpected_keys[:4]}, "
                             f"missing {[k for k in result.missing_keys if not k.startswith('model.erm.')][:4]}")
        return model
