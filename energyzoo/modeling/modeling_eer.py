"""EER: one transformer block looped T times over a latent sequence, trained with the energy-entropy regularised
loss (eer.txt §5-6, Table 1).

Residual dynamics (§5.1, the experiments): with X = E[x] + 0.15 PE(pos),

    Z_0 = 0,   Z_{t+1} = Z_t + F(Z_t + X),   F(U) = A + MLP(LN_2(U + A)),   A = softmax(causal(q k^T / (tau sqrt d))) v,

q, k, v = LN_1(U) W_{Q,K,V} (§5.1's attention plus §6's MLP and LayerNorm, as a pre-LN residual branch,
so that the update can vanish at a fixed point). The logits read LN_f(Z_T + X) (App. B.3's representation X + Z).
Hamiltonian dynamics (eq. 1, §4.3; ``loop_dynamics="hamiltonian"``): Z_0 = X, V_0 = 0,

    V_{k+1} = mu V_k + alpha (F_tau(Z_k; X) - Z_k) - beta grad_Z E_tau(Z_k; X),   Z_{k+1} = Z_k + V_{k+1},

with F_tau the causal cross-attention from Z to X and E_tau its negative log-partition (eq. 1; the paper gives neither
form, these are the simplest that fit it).

Causal (the paper never says; the induction task reads only the past), so each loop's keys and values are cached per
loop (cache layer t; the Hamiltonian dynamics cache X's once, in layer 0) and decoding is exact. The cache fits the loop
count it was filled with: decode with the same ``refinement_steps``. The attention output comes from the configured
implementation; eager (the default here: every training forward reads the maps) also gives the probabilities and
log-partition that the loss (`EERForCausalLM`), ``output_energies`` and ``output_attentions`` read, which other
implementations compute in a second pass over the logits (`eer_energy.attention_probabilities`) when asked.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .caches import CacheKindsMixin
from .configuration_eer import EERConfig
from .eer_energy import (
    additive_mask,
    attention_energy_gradient,
    attention_probabilities,
    contraction_bound,
    loop_terms,
    regularised_loss,
)
from .errors import UserError
from .inputs import CausalLMLossMixin, check_token_inputs
from .numerics import applied_weight, widened
from .outputs import EnergyTrace, passed_on, record_energies, recording_energies, records_energies
from .positions import positions_from_mask, real_tokens, sinusoidal_positions
from .refinement import refine, refinement_steps, takes_refinement_steps
from .transformers_compat import CACHE_FIELD, takes_cache, with_cache

REGULARISERS = ("kinetic", "potential", "entropy")


@dataclass
class EERModelOutput(BaseModelOutputWithPast):
    """`BaseModelOutputWithPast` (``hidden_states``: Z_0..Z_T; ``attentions``: one map per loop) plus the
    regularisers of eq. 3-5 averaged over the loops, when asked for, and the `EnergyTrace`."""

    kinetic: torch.Tensor | None = None
    potential: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    energies: EnergyTrace | None = None


@dataclass
class EERCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the loss's parts when ``labels`` are given: ``task_loss`` (cross-entropy) and
    the regularisers ``kinetic``, ``potential``, ``entropy`` (eq. 3-5, before their lambdas), and the `EnergyTrace`."""

    task_loss: torch.Tensor | None = None
    kinetic: torch.Tensor | None = None
    potential: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    energies: EnergyTrace | None = None


def eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float, **kwargs):
    """transformers' eager attention signature, with the probabilities in float32 (the regularisers read them) and
    an additive or boolean mask."""
    probabilities, _ = attention_probabilities(query, key, additive_mask(attention_mask), scaling)
    return (probabilities.to(value.dtype) @ value).transpose(1, 2), probabilities


class EERAttention(nn.Module):
    """Causal softmax attention with Llama's projection names (no bias and no output projection by default: §5.1's
    softmax(U W_Q (U W_K)^T / sqrt d) U W_V), at temperature tau: the logits are divided by tau sqrt(head_dim)."""

    def __init__(self, config: EERConfig):
        super().__init__()
        self.config = config
        self.head_dim = config.head_dim
        self.num_key_value_groups = 1
        self.is_causal = True
        self.scaling = 1 / (config.attention_temperature * math.sqrt(self.head_dim))
        width, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(width, width, bias=bias)
        self.k_proj = nn.Linear(width, width, bias=bias)
        self.v_proj = nn.Linear(width, width, bias=bias)
        self.o_proj = nn.Linear(width, width, bias=bias) if config.attention_output_projection else None

    def heads(self, hidden: torch.Tensor, projection: nn.Linear) -> torch.Tensor:
        """(batch, length, d) -> (batch, heads, length, head_dim)."""
        batch, length, _ = hidden.shape
        return projection(hidden).view(batch, length, -1, self.head_dim).transpose(1, 2)

    def keys_values(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(hidden, self.k_proj), self.heads(hidden, self.v_proj)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                keys_values: tuple[torch.Tensor, torch.Tensor], statistics_mask: torch.Tensor | None = None,
                wanted: "LoopOutputs | None" = None):
        """(output, probabilities, log-partition) of the queries of ``hidden`` over ``keys_values``. The output comes
        from the configured implementation, the probabilities from eager attention, or else (None) from a second
        pass over the logits with the additive ``statistics_mask`` where ``wanted`` asks for the statistics; the
        log-partition only for the trace (``wanted.tracing``)."""
        query = self.heads(hidden, self.q_proj)
        key, value = keys_values
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention)
        output, probabilities = interface(self, query, key, value, attention_mask, scaling=self.scaling, dropout=0.0)
        log_partition = None
        tracing = wanted is not None and wanted.tracing
        if (wanted is not None and wanted.statistics and probabilities is None) or tracing:
            probabilities, log_partition = attention_probabilities(query, key, statistics_mask, self.scaling, tracing)
        output = output.reshape(*hidden.shape[:-1], -1)
        if self.o_proj is not None:
            output = self.o_proj(output)
        return output, probabilities, log_partition


class EERMLP(nn.Module):
    """§6's MLP: d -> intermediate_size -> d with biases (GPT-2's), GELU."""

    def __init__(self, config: EERConfig):
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(hidden)))


class EERBlock(GradientCheckpointingLayer):
    """One loop of the residual dynamics, Z_{t+1} = Z_t + F(Z_t + X) (§5.1, with §6's MLP and LayerNorm), F =
    attention then MLP: pre-norm, F(S) = A + MLP(LN(S + A)), A = attn(LN(S)) (LN(S) -> S without
    ``attention_norm``); post-norm, Z_{t+1} = LN_2(Z_t + A + MLP(LN_1(S + A))), A = attn(S) (`EERConfig`)."""

    def __init__(self, config: EERConfig):
        super().__init__()
        self.post_norm = config.norm_placement == "post"
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) \
            if config.attention_norm else nn.Identity()
        self.self_attn = EERAttention(config)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = EERMLP(config)

    @takes_cache
    def forward(self, latent: torch.Tensor, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: Cache | None = None, loop: int = 0, statistics_mask: torch.Tensor | None = None,
                wanted: "LoopOutputs | None" = None):
        """(Z_{t+1}, the loop's attention probabilities or None, their log-partition or None); ``statistics_mask``
        and ``wanted`` are `EERAttention`'s."""
        state = latent + inputs
        normed = state if self.post_norm else self.input_layernorm(state)
        keys_values = self.self_attn.keys_values(normed)
        if cache is not None:
            keys_values = cache.update(*keys_values, loop)
        attended, probabilities, log_partition = self.self_attn(normed, attention_mask, keys_values, statistics_mask,
                                                                wanted)
        following = latent + attended + self.mlp(self.post_attention_layernorm(state + attended))
        if self.post_norm:
            following = self.input_layernorm(following)
        return following, probabilities, log_partition


class EERHamiltonianBlock(GradientCheckpointingLayer):
    """One step of eq. 1 (§4.3): the cross-attention F_tau(Z; X) of the latent to the inputs, and the steering and
    restoring forces on the velocity (eq. 1). Its keys and values are X's, computed once per forward."""

    def __init__(self, config: EERConfig):
        super().__init__()
        self.config = config
        self.self_attn = EERAttention(config)

    def forward(self, latent: torch.Tensor, velocity: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                wanted: "LoopOutputs", attention_mask: torch.Tensor | None = None,
                statistics_mask: torch.Tensor | None = None):
        """(Z_{k+1}, V_{k+1}, the attention probabilities, their log-partition); ``wanted`` asks for the statistics
        always (``hamiltonian``): the force of eq. 1 reads the probabilities."""
        config = self.config
        attended, probabilities, log_partition = self.self_attn(latent, attention_mask, (key, value), statistics_mask,
                                                                wanted)
        query_weight = applied_weight(self.self_attn.q_proj, latent)  # W_Q as q_proj acts, LoRA included
        gradient = attention_energy_gradient(probabilities, key, query_weight, self.self_attn.head_dim)
        velocity = (config.hamiltonian_momentum * velocity + config.hamiltonian_coupling * (attended - latent)
                    - config.hamiltonian_gravity * gradient.to(latent.dtype))
        return latent + velocity, velocity, probabilities, log_partition


class EERPreTrainedModel(PreTrainedModel):
    config_class = EERConfig
    config: EERConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["EERBlock", "EERHamiltonianBlock"]
    _supports_sdpa = True
    _supports_flash_attn = False  # the statistics path is an eager mask; flash kernels take no probabilities
    _supports_flex_attn = False
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "hidden_states": [OutputRecorder(EERBlock, index=0), OutputRecorder(EERHamiltonianBlock, index=0)],
        "attentions": OutputRecorder(EERAttention, index=1),
    }
    _hidden_states_per_step = True  # Z_0..Z_T: num_hidden_layers is the loop count T

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """Eager unless asked otherwise: every training forward needs the loops' attention probabilities (the loss
        reads them), which eager computes together with the output; SDPA (``attn_implementation="sdpa"``) speeds
        plain inference, e.g. at long lengths, and costs a second pass over the logits when statistics are read."""
        return super().get_correct_attn_implementation(requested_attention or "eager", is_init_check)

    def _init_weights(self, module):
        """`initializer_range` None: PyTorch's own initialisation (see `EERConfig`); a number: transformers'; the
        token embedding N(0, `embedding_init_std`) when that is set."""
        if isinstance(module, nn.Embedding) and self.config.embedding_init_std is not None:
            init.normal_(module.weight, std=self.config.embedding_init_std)
        elif self.config.initializer_range is not None:
            super()._init_weights(module)
        elif isinstance(module, nn.Linear):
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                bound = 1 / math.sqrt(module.in_features)
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


@dataclass(frozen=True)
class LoopOutputs:
    """What a forward asks of its loops besides the latent: eq. 3-5's terms (``regularisers``, kept in the graph), the
    `EnergyTrace` (``tracing``), the attention probabilities (``attentions``); the Hamiltonian form reads the
    probabilities in every loop (``hamiltonian``)."""

    regularisers: bool
    tracing: bool
    attentions: bool
    hamiltonian: bool

    @property
    def statistics(self) -> bool:
        """Whether the loops compute the attention statistics (probabilities, log-partition) at all."""
        return self.regularisers or self.tracing or self.attentions or self.hamiltonian

    @property
    def records(self) -> str | None:
        """What `refine` keeps of the loops' records."""
        return "graph" if self.regularisers else "detached" if self.tracing else None


@dataclass(frozen=True)
class LoopInputs:
    """What every loop of one forward reads besides the latent: X (the inputs with their positions), the mask of the
    attention implementation and the additive one of the statistics (None when none are needed), the cache, the
    real positions, and what the forward asks of its loops."""

    inputs: torch.Tensor
    mask: torch.Tensor | None
    statistics_mask: torch.Tensor | None
    cache: Cache | None
    valid: torch.Tensor
    wanted: LoopOutputs


class LoopRecords:
    """One loop's records, as ``wanted`` asks for them: eq. 3-5's terms (`loop_terms`), and for the trace the attention
    free energy -tau log Z, the update size and the contraction bound of Theorem 3.2.1 (whose projections, LoRA
    included, are read once per forward)."""

    def __init__(self, config: EERConfig, attention: EERAttention, loop: LoopInputs):
        self.config, self.loop = config, loop
        projections = (attention.q_proj, attention.k_proj, attention.v_proj)
        self.weights = [applied_weight(projection, loop.inputs) for projection in projections] \
            if loop.wanted.tracing else None

    def __call__(self, previous, following, probabilities, log_partition) -> dict:
        wanted, valid = self.loop.wanted, self.loop.valid
        if not (wanted.regularisers or wanted.tracing):
            return {}
        records = loop_terms(previous, following, probabilities, valid, self.config.tsallis_q)
        if wanted.tracing:
            rows = valid.to(probabilities.dtype).unsqueeze(1)
            count = rows.sum().clamp_min(1) * probabilities.shape[1]
            records.update(
                energy=(-self.config.attention_temperature * log_partition * rows).sum() / count,
                residual=(widened(following - previous).norm(dim=-1) * valid).sum() / valid.sum().clamp_min(1),
                contraction_bound=contraction_bound(*self.weights, probabilities, valid.to(probabilities.dtype),
                                                    self.config.tsallis_q).mean())
        return records


class ResidualStep:
    """`refine`'s step of the residual dynamics (§5.1): Z_{t+1} = block(Z_t, X) from Z_0 = 0, loop t caching its keys
    and values in cache layer t."""

    def __init__(self, block: EERBlock, loop: LoopInputs, records: LoopRecords):
        self.block, self.loop, self.records = block, loop, records
        self.start = (torch.zeros_like(loop.inputs),)

    def __call__(self, index: int, state: tuple):
        loop = self.loop
        following, probabilities, log_partition = self.block(
            state[0], loop.inputs, attention_mask=loop.mask, loop=index, **with_cache(loop.cache),
            statistics_mask=loop.statistics_mask, wanted=loop.wanted)
        return (following,), None, self.records(state[0], following, probabilities, log_partition)


class HamiltonianStep:
    """`refine`'s step of the damped heavy-ball dynamics of eq. 1 (§4.3) from Z_0 = X, V_0 = 0: the keys and values
    are X's, computed (and cached, in layer 0) once per forward."""

    def __init__(self, block: EERHamiltonianBlock, loop: LoopInputs, records: LoopRecords):
        self.block, self.loop, self.records = block, loop, records
        keys_values = block.self_attn.keys_values(loop.inputs)
        self.keys_values = loop.cache.update(*keys_values, 0) if loop.cache is not None else keys_values
        self.start = (loop.inputs, torch.zeros_like(loop.inputs))

    def __call__(self, index: int, state: tuple):
        loop = self.loop
        latent, velocity, probabilities, log_partition = self.block(
            state[0], state[1], *self.keys_values, loop.wanted, attention_mask=loop.mask,
            statistics_mask=loop.statistics_mask)
        return (latent, velocity), None, self.records(state[0], latent, probabilities, log_partition)


class EERModel(EERPreTrainedModel):
    """The embedding, the looped block and the final LayerNorm. ``hidden_states`` are Z_0..Z_T,
    ``last_hidden_state`` is LN_f(Z_T + X)."""

    def __init__(self, config: EERConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        hamiltonian = config.loop_dynamics == "hamiltonian"
        self.block = EERHamiltonianBlock(config) if hamiltonian else EERBlock(config)
        self.step_type = HamiltonianStep if hamiltonian else ResidualStep
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    @takes_cache
    @records_energies
    @takes_refinement_steps
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        return_regularisers: bool = False,
        **kwargs,
    ) -> EERModelOutput:
        """Runs the T loops. ``position_ids`` default to each token's index among the real tokens (from
        ``attention_mask``), so a left-padded sequence gets the encoding it has alone. ``return_regularisers`` adds
        the loop means of eq. 3-5 over the real positions (what `EERForCausalLM`'s loss reads)."""
        config = self.config
        check_token_inputs(type(self).__name__, input_ids, inputs_embeds, attention_mask,
                           self.embed_tokens.num_embeddings, config.hidden_size, cache)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        batch, length, _ = inputs_embeds.shape
        use_cache = config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache()  # grows a layer per loop, whatever T this call runs
        past_seen = cache.get_seq_length() if cache is not None else 0
        loops = self._loops()
        self._check_cache(cache, past_seen, loops)
        if position_ids is None:
            position_ids = self._position_ids(attention_mask, past_seen, length, inputs_embeds.device)
        positions = sinusoidal_positions(position_ids, config.hidden_size).expand(batch, -1, -1)
        inputs = inputs_embeds + config.position_embedding_scale * positions.to(inputs_embeds.dtype)
        wanted = LoopOutputs(return_regularisers, recording_energies(),
                             bool(kwargs.get("output_attentions", config.output_attentions)),
                             config.loop_dynamics == "hamiltonian")
        mask = create_causal_mask(config=config, inputs_embeds=inputs, attention_mask=attention_mask,
                                  position_ids=position_ids, allow_is_causal_skip=not wanted.statistics,
                                  **with_cache(cache))
        statistics_mask = additive_mask(mask) if wanted.statistics else None
        valid = real_tokens(attention_mask, inputs, dense=True)

        loop = LoopInputs(inputs, mask, statistics_mask, cache, valid, wanted)
        step = self.step_type(self.block, loop, LoopRecords(config, self.block.self_attn, loop))
        result = refine(step, step.start, loops, records=wanted.records)
        latent = result.state[0]
        regularisers = {}
        if wanted.regularisers:
            regularisers = {name: result.records[name].mean() if loops else latent.new_zeros(())
                            for name in REGULARISERS}
        if wanted.tracing:
            record_energies({**result.records, "iterations": result.iterations,
                             "temperature": torch.tensor(config.attention_temperature)})
        readout = latent + inputs if config.readout_with_inputs else latent
        return EERModelOutput(last_hidden_state=self.norm(readout), **with_cache(cache),
                              **regularisers)

    def _loops(self) -> int:
        """T: the call's ``refinement_steps``; else `num_loops`, or in training a draw from `num_loops_range` when set
        (§5.3), drawn only then (an overridden count draws nothing from the RNG)."""
        override = refinement_steps(None)
        if override is not None:
            return override
        span = self.config.num_loops_range
        if self.training and span is not None:
            return int(torch.randint(span[0], span[1] + 1, ()).item())
        return self.config.num_loops

    def _check_cache(self, cache: Cache | None, past_seen: int, loops: int) -> None:
        """A filled cache must hold every loop this call runs (one layer per loop; one in the Hamiltonian form)."""
        if cache is None or torch.compiler.is_compiling():  # a compiled step's counts are tensors; eager checked them
            return
        needed = 1 if self.config.loop_dynamics == "hamiltonian" else loops
        fixed = getattr(cache, "layer_class_to_replicate", None) is None
        if (past_seen and (len(cache.layers) < needed or cache.get_seq_length(needed - 1) != past_seen)) or \
                (fixed and len(cache.layers) < needed):
            raise UserError(
                f"EER keeps one cache layer per loop; this cache has {len(cache.layers)} layers for {past_seen} past "
                f"tokens, but the call runs {loops} loops. Decode with the refinement_steps the cache was filled with, "
                "and pass a DynamicCache() (which grows per loop) rather than DynamicCache(config=...).")

    @staticmethod
    def _position_ids(attention_mask, past_seen: int, length: int, device) -> torch.Tensor:
        """Each token's index among the real tokens when a 2-D mask is given; past_seen + arange otherwise."""
        if attention_mask is not None and attention_mask.dim() == 2:
            return positions_from_mask(attention_mask, length)
        return torch.arange(past_seen, past_seen + length, device=device).unsqueeze(0)


class EERForCausalLM(CausalLMLossMixin, CacheKindsMixin, EERPreTrainedModel, GenerationMixin):
    """EER with its LM head (with bias). With ``labels`` the loss is eq. 2, CE + lambda_P L_pot + lambda_K L_kin +
    lambda_S |S_q - eta|, computed here so that plain `Trainer` and peft train it; the parts come back in the output.
    Labels are aligned with the inputs (label i answers input i, the induction task's format) unless
    ``label_alignment="shifted"`` (the usual next-token loss); ``shift_labels`` (targets already aligned with the
    logits, what sequence-parallel trainers pass) override both. ``generate(max_new_tokens=1)`` gives the last-token
    answer of §4.2; longer generation would feed answers back as inputs, which the induction task never does."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # eq. 2's regularisers are per-batch means: `Trainer` must average the micro-batches of an accumulated step itself
    accepts_loss_kwargs = False
    other_caches_refused = "its cache holds one layer per loop of the call, and only those two build them so"

    def __init__(self, config: EERConfig):
        super().__init__(config)
        self.model = EERModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
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
    ) -> EERCausalLMOutput:
        """``refinement_steps``: the loop count T for this call (None: the config's); `generate` passes it to every
        step. ``output_energies``: an `EnergyTrace` with, per loop, ``kinetic``, ``potential``, ``entropy`` (eq. 3-5),
        ``energy`` (E_tau, the attention's free energy -tau log sum exp), ``residual`` (mean ||Z_{t+1} - Z_t||) and
        ``contraction_bound`` (Theorem 3.2.1), plus ``temperature`` and ``iterations``."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_energies=output_energies,
            refinement_steps=refinement_steps,
            return_regularisers=labels is not None,
            **kwargs,
        )
        # targets the caller already aligned (``shift_labels``, as sequence-parallel trainers pass) come first
        loss_kwargs = {"shift_labels": labels, **kwargs} if self.config.label_alignment == "aligned" else kwargs
        logits, task_loss = self.head_logits_and_loss(outputs.last_hidden_state, labels, logits_to_keep,
                                                      **loss_kwargs)
        regularisers = {name: outputs[name] for name in REGULARISERS} if labels is not None else {}
        loss = None if task_loss is None else regularised_loss(task_loss, regularisers, self.config)
        return EERCausalLMOutput(loss=loss, logits=logits, task_loss=task_loss, **regularisers, **passed_on(outputs))

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """A `DynamicCache()` growing one layer per loop (the config-sized one would fix the loop count), or
        transformers' `StaticCache` of one layer per configured loop (``num_loops``; decode with that loop count);
        other cache kinds are refused up front."""
        if generation_config.cache_implementation in (None, "dynamic") and generation_config.use_cache is not False \
                and model_kwargs.get(CACHE_FIELD) is None:
            model_kwargs[CACHE_FIELD] = DynamicCache()
            return None
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
