"""FEM-LM: a Llama-style decoder whose attention is the two-level gated Free Energy Mixer (fem.txt).

Block (FEM §3, "FEM directly replaces the attention in a Transformer block"): RMSNorm -> FEM -> residual ->
RMSNorm -> SwiGLU -> residual, with Llama's module names so checkpoints, peft ``target_modules`` and habits
carry over (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``).
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.utils import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .caches import CacheKindsMixin, own_cache_layer
from .configuration_fem import PRIORS, FEMConfig
from .errors import UserError, UserTypeError
from .fem_compiled_decoding import CompiledDecoding
from .fem_free_energy import energy_record, gated_free_energy, inverse_softplus, outer_gate_activation, value_limits
from .fem_joint_linears import JointlyProjectedModule, join_projections_in
from .fem_parameter_cache import ParameterCache
from .fem_time_decay import TimeDecayConditioner
from .inputs import CausalLMLossMixin, check_classifier_labels, check_token_inputs
from .numerics import recomputed_in_backward, widened
from .outputs import (
    BaseModelOutputWithEnergies,
    CausalLMOutputWithEnergies,
    SequenceClassifierOutputWithEnergies,
    passed_on,
    record_energies,
    recording_energies,
    records_energies,
)
from .positions import positions_from_mask, real_tokens
from .transformers_compat import CACHE_FIELD, takes_cache, with_cache

# The projections of a FEM layer, in the order the conditioner's modulators are laid out (FEM eq. 34a-d): a new
# prior's own projections come last, so the layouts of the others stay as saved.
GATES = ("temperature_proj", "outer_gate_proj")
PROJECTIONS = tuple(dict.fromkeys(["q_proj", "k_proj", "v_proj", *GATES,
                                   *(name for spec in PRIORS.values() for name in spec.projections)]))
# Modules and parameters a layer may lack (a prior's or a switch's): None where it has none.
OPTIONAL = (*(name for name in PROJECTIONS if name != "v_proj"), "beta_max_raw", "time_decay",
            *(name for spec in PRIORS.values() for name in spec.parameters))
# The attention functions the softmax prior runs on.
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
# The Llama config fields a FEM-LM upcycled from it (`FEMForCausalLM.from_llama`) keeps as they are.
LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "attention_bias",
                "mlp_bias", "pad_token_id", "bos_token_id", "eos_token_id")


class FEMAttention(JointlyProjectedModule):
    """The two-level gated Free Energy Mixer in place of attention (FEM eq. 10-11, 34-35).

    o_t = g~_t * [(1 - lambda~_t) * E_{p~_t}[v~] + lambda~_t * beta_max^-1 log E_{p~_t}[exp(beta_max v~)]]
    with lambda = sigmoid (per channel), g = RMS-normalised softplus, beta_max = softplus per channel, ~ the
    time-decay modulation (1 + c) of App. I.2, and the prior p_t of ``config.prior`` (`FEMConfig.prior_spec`): softmax
    over RoPE'd q, k (H.1), gated linear attention over ReLU(RoPE(q)), ReLU(RoPE(k)) (H.2), AFT weights
    exp(k_i) per channel with optional decay (H.3), or a nonnegative SSM impulse response per channel (H.4).
    The prior contributes its projections, its selection tensors and its read, the one its float64 tests check.
    The softmax prior reads through the attention function of ``config._attn_implementation``: "sdpa"
    (default), "eager" (transformers'; materialises the prior's probabilities, returned with
    ``output_attentions=True``) or "flash_attention_2" (transformers' flash-attn path).
    """

    def __init__(self, config: FEMConfig, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.prior = config.prior_spec  # defined in fem_prior_<config.prior>.py
        self.head_dim, self.value_head_dim = config.head_dim, config.value_head_dim
        # read on every call: a config's attribute lookup costs a decoding step more than a module's
        self.use_lse, self.rms_norm_eps = config.use_lse, config.rms_norm_eps
        self.public_reference_eps = config.public_reference_eps
        self.is_causal, self.num_key_value_groups, self.scaling = True, 1, self.head_dim**-0.5  # attention functions
        for name in OPTIONAL:
            setattr(self, name, None)
        self.prior.add_modules(self, config)
        hidden, width, bias = config.hidden_size, config.value_width, config.attention_bias
        self.v_proj = nn.Linear(hidden, width, bias=bias)
        self.o_proj = nn.Linear(width, hidden, bias=bias)
        if config.use_lse:
            self.beta_max_offset = inverse_softplus(config.beta_max_init)
            self.beta_max_raw = nn.Parameter(torch.zeros(width))
            self.beta_max_cache, self.value_limits_cache = ParameterCache(self._beta_max_of), ParameterCache(
                self._value_limits_of)
            if config.use_temperature_gate:
                self.temperature_proj = nn.Linear(hidden, width, bias=bias)
        if config.use_outer_gate:
            self.outer_gate_proj = nn.Linear(hidden, width, bias=bias)
        if "decay_proj" in self.prior.layer_projections(config):
            self.decay_proj = nn.Linear(hidden, self.prior.decay_width(config), bias=True)
        names = [name for name in PROJECTIONS if getattr(self, name) is not None]
        if config.use_time_decay:
            self.time_decay = TimeDecayConditioner(hidden, config.time_decay_rank,
                                                   sum(getattr(self, name).out_features for name in names),
                                                   config.time_decay_chunk_size, config.rms_norm_eps,
                                                   config.time_decay_activation, config.time_decay_bias,
                                                   reference_numerics=config.public_reference_eps is not None)
        self.join_projections(names)

    def beta_max(self) -> torch.Tensor:
        """Per-channel maximum inverse temperature, (heads, value_head_dim) (FEM eq. 9, App. K); computed again
        only when its parameter changed, where no gradient is wanted (`fem_parameter_cache`)."""
        return self.beta_max_cache(self.beta_max_raw)

    def _beta_max_of(self, raw: torch.Tensor) -> torch.Tensor:
        return F.softplus(widened(raw) + self.beta_max_offset).view(-1, self.value_head_dim)

    def value_limits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The range the values are clipped to before the exp branch (`fem_free_energy.value_limits` of beta_max),
        kept as beta_max is."""
        return self.value_limits_cache(self.beta_max_raw)

    def _value_limits_of(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return value_limits(self._beta_max_of(raw))

    def parameters_replaced(self) -> None:
        if self.beta_max_raw is not None:
            self.beta_max_cache.forget()
            self.value_limits_cache.forget()

    @takes_cache
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        cache_layer: CacheLayerMixin | None = None,
        recording: bool | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns the block output and the prior's probabilities (eager softmax prior only, else None). The layer
        reads and updates its own layer of ``cache``, or ``cache_layer`` where the caller looked it up
        (`own_cache_layer`); ``recording``: whether to add its `EnergyTrace` entry (None: as the forward in progress
        says, `recording_energies`)."""
        batch, length, _ = hidden_states.shape
        if cache_layer is None:
            cache_layer = self.own_cache_layer(cache)
        if self.time_decay is None:
            projections = self.projected(hidden_states)
        else:
            initial_state = cache_layer.time_decay_state if cache_layer is not None else None
            features, final_state = recomputed_in_backward(self, self.time_decay, hidden_states, padding_mask,
                                                           initial_state)
            if cache_layer is not None:
                cache_layer.keep("time_decay_state", final_state)
            # p (1 + c), eq. 34. Recomputed in backward: the gradient of c needs the unmodulated projections,
            # which would otherwise be kept beside the modulated ones the prior keeps.
            projections = recomputed_in_backward(self, self.projected, hidden_states, self.time_decay, features)
        projected = dict(zip(self.projection_names, projections))
        heads = (batch, length, -1, self.value_head_dim)  # -1: this process's heads under tensor parallelism
        # the prior's selection and read: fem_prior_<config.prior>.py
        selection, options = self.prior.selection(self, projected, position_embeddings, attention_mask, padding_mask)
        device = hidden_states.device.type
        # the reads choose their own precision; autocast is left only when on (leaving it costs a decoding step)
        with torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else nullcontext():
            read = self.prior.read(projected["v_proj"].view(heads), self.beta_max() if self.use_lse else None,
                                   *selection, state=cache_layer.prior_state if cache_layer is not None else None,
                                   **options)
        if cache_layer is not None:
            cache_layer.advance(read.state, length)
        f_max = read.f_max if self.use_lse else None  # the recurrent reads give one at beta = 1 without
        gate_logits = [projected[name].view(heads) if name in projected else None for name in GATES]
        output, temperature_gate = recomputed_in_backward(self, self._gated_output, read.mu, f_max, *gate_logits)
        if recording_energies() if recording is None else recording:
            record_energies(energy_record(read.mu, f_max, self.beta_max, temperature_gate))
        return self.o_proj(output.reshape(batch, length, -1)), read.weights

    def own_cache_layer(self, cache: Cache | None) -> CacheLayerMixin | None:
        """This layer's own layer of ``cache`` (None without a cache)."""
        return own_cache_layer(cache, self.layer_idx, self.prior.cache_layers, "FEM")

    def _gated_output(self, mu, f_max, temperature_logits, outer_logits):
        """mu and f_max, (batch, seq, heads, value_head_dim), gated into the output (FEM eq. 10-11); also
        returns the temperature gate lambda (None without one)."""
        temperature_gate = None if temperature_logits is None else torch.sigmoid(temperature_logits)
        outer_gate = None if outer_logits is None else outer_gate_activation(
            outer_logits, self.rms_norm_eps, self.public_reference_eps)
        return gated_free_energy(mu, f_max, temperature_gate, outer_gate), temperature_gate


class FEMDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: FEMConfig, layer_idx: int):
        super().__init__()
        self.self_attn = FEMAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @takes_cache
    def forward(self, hidden_states: torch.Tensor, cache: Cache | None = None, output_attentions: bool = False,
                **kwargs) -> torch.Tensor:
        """The block; a decoding step runs it compiled where `COMPILED_DECODING` applies (``compile_decoding``)."""
        cache_layer = self.self_attn.own_cache_layer(cache)
        recording = recording_energies()
        if COMPILED_DECODING.applies(self, hidden_states, cache_layer, output_attentions, recording):
            return COMPILED_DECODING(self, hidden_states, cache_layer=cache_layer, recording=False, **kwargs)
        return decoder_block(self, hidden_states, cache_layer=cache_layer, recording=recording,
                             output_attentions=output_attentions, **kwargs)


def decoder_block(layer: FEMDecoderLayer, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
    """RMSNorm -> FEM -> residual -> RMSNorm -> SwiGLU -> residual (FEM §3): a function of the layer, so that one
    compiled copy serves every layer (`fem_compiled_decoding`)."""
    mixed, _ = layer.self_attn(layer.input_layernorm(hidden_states), **kwargs)
    hidden_states = hidden_states + mixed
    return hidden_states + layer.mlp(layer.post_attention_layernorm(hidden_states))


COMPILED_DECODING = CompiledDecoding(decoder_block)


class FEMPreTrainedModel(PreTrainedModel):
    config_class = FEMConfig
    config: FEMConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["FEMDecoderLayer"]
    _skip_keys_device_placement = [CACHE_FIELD]
    _supports_sdpa = True
    _supports_flash_attn = True
    _can_compile_fullgraph = True
    # FEM caches carry state that cannot be rewound to an earlier length (the recurrent priors' states, the
    # time-decay conditioner's): generate() then refuses assisted and prompt-lookup decoding up front, as for Mamba
    # and RWKV, instead of failing when it crops the cache.
    _is_stateful = True
    _can_record_outputs = {"hidden_states": FEMDecoderLayer, "attentions": FEMAttention}

    def _init_weights(self, module):
        """N(0, 0.02) linear maps and embeddings, zero biases (FEM App. K); beta_max's raw parameter at 0
        (App. K); the conditioner's output map at 0 so every modulator starts at 1; the SSM prior's a and D
        at -softplus(0) and softplus(0), its step sizes at Delta = 0.01 (Mamba's range)."""
        super()._init_weights(module)
        if isinstance(module, FEMAttention):
            if module.beta_max_raw is not None:
                init.zeros_(module.beta_max_raw)
            if module.prior.init_parameters is not None:
                module.prior.init_parameters(module)
        elif isinstance(module, TimeDecayConditioner):
            init.zeros_(module.out_proj)

    def tie_weights(self, *args, **kwargs):
        """transformers' tying, then every layer's projections joined again (`fem_joint_linears`): transformers ties
        after loading, which gives each parameter a tensor of its own."""
        super().tie_weights(*args, **kwargs)
        join_projections_in(self)

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """The softmax prior looks its attention function up per call (`fem_prior_softmax.attend`), which
        transformers' source heuristic would look for in this file."""
        return True

    def _check_and_adjust_attn_implementation(self, attn_implementation, is_init_check=False, allow_all_kernels=False):
        """A prior that reads through transformers' attention functions (softmax) runs on "sdpa" (default),
        "eager" or "flash_attention_2". The recurrent priors run their own chunkwise read and accept only the
        default."""
        if attn_implementation is not None:
            prior = self.config.prior
            on_attention_functions = self.config.prior_spec.attention_function
            allowed = ATTENTION_IMPLEMENTATIONS if on_attention_functions else ("sdpa",)
            if attn_implementation not in allowed:
                reason = (
                    f"the {prior} prior runs on transformers' attention functions"
                    if on_attention_functions
                    else f"the {prior} prior is a chunkwise recurrence, not softmax attention; its read has one "
                    "implementation (the default)"
                )
                raise UserError(  # opens with transformers' own words for an unsupported implementation
                    f'Specified `attn_implementation="{attn_implementation}"` is not supported by FEM-LM with '
                    f"prior={prior!r}: it supports attn_implementation in {list(allowed)} (or None); {reason}."
                )
        return super()._check_and_adjust_attn_implementation(attn_implementation, is_init_check, allow_all_kernels)


class FEMModel(FEMPreTrainedModel):
    def __init__(self, config: FEMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(FEMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.post_init()

    @takes_cache
    @records_energies
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithEnergies:
        """``output_energies=True`` adds an `EnergyTrace` with one entry per layer (`FEMAttention._energy_record`:
        ``energy`` the free-energy gain per token, ``temperature`` / ``inverse_temperature``, ``temperature_gate``).
        ``output_attentions=True`` returns the softmax prior's probabilities; it needs
        ``attn_implementation="eager"`` (the other attention functions never form them)."""
        check_token_inputs(type(self).__name__, input_ids, inputs_embeds, attention_mask,
                           self.embed_tokens.num_embeddings, self.config.hidden_size, cache)
        if kwargs.get("refinement_steps") is not None:
            raise UserTypeError("FEM-LM has no iterative refinement: refinement_steps does not apply to it")
        output_attentions = kwargs.get("output_attentions", self.config.output_attentions)
        if output_attentions and (
            not self.config.prior_spec.attention_function or self.config._attn_implementation != "eager"
        ):
            raise UserError(
                "output_attentions=True needs FEM's softmax prior with attn_implementation='eager' (got prior="
                f"{self.config.prior!r}, attn_implementation={self.config._attn_implementation!r}): the other "
                "attention functions and the recurrent priors never materialise the prior's probabilities."
            )
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        length = inputs_embeds.shape[1]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None and not self.training:  # training builds no cache
            cache = DynamicCache(config=self.config)
        padding_mask = real_tokens(attention_mask, inputs_embeds)
        if padding_mask is not None:
            if position_ids is None:
                # Count real tokens only, as generate() does: RoPE followed by the GLA prior's ReLU features is
                # not shift-invariant, so a left-padded sequence must see the positions it has alone.
                position_ids = positions_from_mask(attention_mask, length)
        if position_ids is None:
            past_length = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(length, device=inputs_embeds.device)[None] + past_length
        causal_mask = None
        if self.config.prior_spec.attention_function:  # the others are causal by construction, read padding_mask
            causal_mask = create_causal_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **with_cache(cache),
            )

        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                attention_mask=causal_mask,
                padding_mask=padding_mask,
                output_attentions=output_attentions,
                **with_cache(cache),  # the release's name: GradientCheckpointingLayer drops it when checkpointing
            )
        return BaseModelOutputWithEnergies(last_hidden_state=self.norm(hidden_states), **with_cache(cache))


class FEMForCausalLM(CausalLMLossMixin, CacheKindsMixin, FEMPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    other_caches_refused = ("its cache layers keep FEM states (augmented values with their exp shift, recurrent prior "
                            "states, the conditioner's state) that offloaded and quantized caches would leave behind")

    def __init__(self, config: FEMConfig):
        super().__init__(config)
        self.model = FEMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _decodes_with_causal_mask(self) -> bool:
        return self.config.prior_spec.attention_function

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
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithEnergies:
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_energies=output_energies,
            **kwargs,
        )
        logits, loss = self.head_logits_and_loss(outputs.last_hidden_state, labels, logits_to_keep, **kwargs)
        return CausalLMOutputWithEnergies(loss=loss, logits=logits, **passed_on(outputs))

    @classmethod
    def from_llama(cls, llama_model: nn.Module, **fem_overrides) -> "FEMForCausalLM":
        """Build a FEM-LM from a `LlamaForCausalLM`, copying every shared weight (upcycling).

        The shared parts (embeddings, q/k/v/o projections, MLPs, norms, head) are copied; FEM-only parts
        (gates, beta_max, conditioner) start from their initialisation. With ``use_time_decay``, ``use_lse``,
        ``use_temperature_gate`` and ``use_outer_gate`` all False and ``value_ratio=1`` the result computes
        exactly the Llama model. ``value_ratio`` defaults to 1 here so v_proj/o_proj copy as they are.
        """
        llama_config = llama_model.config
        if llama_config.num_key_value_heads != llama_config.num_attention_heads:
            raise UserError("from_llama needs a Llama without grouped-query attention (num_key_value_heads == heads).")
        fields = {name: getattr(llama_config, name) for name in LLAMA_FIELDS}
        fields.update(rope_parameters=dict(llama_config.rope_parameters), value_ratio=1.0,
                      qk_ratio=llama_config.head_dim * llama_config.num_attention_heads / llama_config.hidden_size)
        fields.update(fem_overrides)
        model = cls(FEMConfig(**fields)).to(next(llama_model.parameters()).dtype)
        result = model.load_state_dict(llama_model.state_dict(), strict=False)
        if result.unexpected_keys:
            raise UserError(f"Llama weights without a place in FEM-LM: {result.unexpected_keys[:4]}")
        return model


class FEMForSequenceClassification(FEMPreTrainedModel):
    """FEM-LM with a linear head on the hidden state of each sequence's last real token.

    Why not transformers' `GenericForSequenceClassification`: it finds the last token by comparing
    ``input_ids`` with the pad id, so a right-padded batch whose padding holds ordinary tokens pools the
    wrong position. Here the ``attention_mask`` decides (its last 1 per row); without a mask, the pad-id rule
    applies (and with no pad id, the last position)."""

    # a per-batch mean loss: `Trainer` must average the micro-batches of an accumulated step itself
    accepts_loss_kwargs = False

    def __init__(self, config: FEMConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = FEMModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_energies: bool = False,
        **kwargs,
    ) -> SequenceClassifierOutputWithEnergies:
        """`FEMModel`'s arguments (position_ids, inputs_embeds, cache, use_cache, ...) pass through."""
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, output_energies=output_energies, **kwargs
        )
        logits = self.score(outputs.last_hidden_state)
        batch, length = logits.shape[:2]
        positions = torch.arange(length, device=logits.device)
        if attention_mask is not None and attention_mask.dim() == 2:
            last = (positions * attention_mask[:, -length:].to(logits.device)).argmax(-1)
        elif input_ids is not None and self.config.pad_token_id is not None:
            last = (positions * (input_ids != self.config.pad_token_id).to(logits.device)).argmax(-1)
        else:
            last = torch.full((batch,), length - 1, device=logits.device)
        pooled_logits = logits[torch.arange(batch, device=logits.device), last]
        loss = None
        if labels is not None:
            check_classifier_labels(type(self).__name__, labels, self.config, batch)
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=pooled_logits, config=self.config)
        return SequenceClassifierOutputWithEnergies(loss=loss, logits=pooled_logits, **passed_on(outputs))
