"""FEM-LM: a Llama-style decoder whose attention is the two-level gated Free Energy Mixer (fem.txt).

Block (FEM §3, "FEM directly replaces the attention in a Transformer block"): RMSNorm -> FEM -> residual ->
RMSNorm -> SwiGLU -> residual, with Llama's module names so checkpoints, peft ``target_modules`` and habits
carry over (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import initialization as init
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.utils.output_capturing import capture_outputs

from .configuration_fem import FEMConfig, fem_layer_type
from .free_energy import (
    PreparedMask,
    attend,
    beta_to_value_shape,
    exp_branch,
    gated_free_energy,
    outer_gate_activation,
    restore_free_energy,
)
from .prior_gla import gla_free_energy_read
from .outputs import BaseModelOutputWithEnergies, CausalLMOutputWithEnergies, EnergyTrace
from .time_decay import TimeDecayConditioner


class _FEMStateMixin:
    """Per-sequence states a FEM cache layer keeps besides keys/values (tensors or tuples of tensors, or
    None), kept in step with beam search and batch edits."""

    state_names: tuple[str, ...] = ()

    def _map_states(self, fn) -> None:
        for name in self.state_names:
            state = getattr(self, name)
            if isinstance(state, tuple):
                setattr(self, name, tuple(fn(tensor) for tensor in state))
            elif state is not None:
                setattr(self, name, fn(state))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._map_states(lambda state: state.index_select(0, beam_idx.to(state.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._map_states(lambda state: state.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._map_states(lambda state: state[indices])

    def reset(self) -> None:
        super().reset()
        for name in self.state_names:
            setattr(self, name, None)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("FEM caches cannot be cropped: their recurrent states cannot be rewound.")


class FEMSoftmaxCacheLayer(_FEMStateMixin, DynamicLayer):
    """Decoding state of one FEM layer with the softmax prior: the prior's keys, the augmented values
    [v, exp(beta v - M)] of the one-pass read (FEM App. F.4), the shift M, and the time-decay conditioner's
    O(H_c) state (App. I, Prop. I.1).

    The shift follows the maximum of beta v per channel (with headroom, see `exp_branch`). When it moves,
    the cached exp values are rescaled by exp(M_old - M_new) (online-softmax style), so cached decoding
    computes the same read as one full forward while each step only exponentiates its own values. With the
    default budget (i), [v, exp(beta v)] has the Q/K head width: the value cache has the size of Llama's."""

    _layer_type = fem_layer_type("softmax")
    is_croppable = False
    state_names = ("time_decay_state", "exp_shift")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.time_decay_state: torch.Tensor | None = None
        self.exp_shift: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, exp_shift: torch.Tensor | None = None, **kwargs):
        """Append keys and augmented values; ``exp_shift`` is the shift the new exp values were taken at,
        and the cached exp values are brought to it first when it moved."""
        if exp_shift is not None:
            moved = self.exp_shift is not None and self.get_seq_length() > 0 and not torch.equal(exp_shift, self.exp_shift)
            if moved:
                half = self.values.shape[-1] // 2
                rescale = torch.exp(self.exp_shift - exp_shift).to(self.values.dtype)
                self.values = torch.cat([self.values[..., :half], self.values[..., half:] * rescale], dim=-1)
            self.exp_shift = exp_shift
        return super().update(key_states, value_states, *args, **kwargs)


class _StateOnlyLayer(CacheLayerMixin):
    """A cache layer without keys or values: the batch and beam hooks have nothing of their own to move."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        pass

    def batch_repeat_interleave(self, repeats: int) -> None:
        pass

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        pass


class FEMRecurrentCacheLayer(_FEMStateMixin, _StateOnlyLayer):
    """Fixed-size decoding state of one FEM layer with a recurrent prior (FEM App. H.2-H.4): the prior's
    state (for GLA the decayed sums of k~ [v, exp(beta v - M), 1] and their shift M), the conditioner's
    state and the number of tokens seen. Its size does not grow with the sequence."""

    is_croppable = False
    state_names = ("time_decay_state", "prior_state")

    def __init__(self, **kwargs):
        super().__init__()
        self.time_decay_state: torch.Tensor | None = None
        self.prior_state: tuple[torch.Tensor, ...] | None = None
        self.seen_tokens = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise NotImplementedError("recurrent FEM layers hold a state, not keys and values")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("recurrent FEM layers hold a state, not keys and values; FEMAttention updates it")

    def advance(self, prior_state: tuple[torch.Tensor, ...], new_tokens: int) -> None:
        self.prior_state = prior_state
        self.seen_tokens += new_tokens

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen_tokens + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0


class FEMGLACacheLayer(FEMRecurrentCacheLayer):
    _layer_type = fem_layer_type("gla")


class FEMAttention(nn.Module):
    """The two-level gated Free Energy Mixer in place of attention (FEM eq. 10-11, 34-35).

    o_t = g~_t * [(1 - lambda~_t) * E_{p~_t}[v~] + lambda~_t * beta_max^-1 log E_{p~_t}[exp(beta_max v~)]]
    with the softmax prior p over RoPE'd q, k (H.1), lambda = sigmoid (per channel), g = RMS-normalised
    softplus, beta_max = softplus per channel, and ~ the time-decay modulation (1 + c) of App. I.2.
    """

    def __init__(self, config: FEMConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.value_head_dim = config.value_head_dim
        qk_width, value_width = self.num_heads * self.head_dim, config.value_width
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, qk_width, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, qk_width, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, value_width, bias=bias)
        self.o_proj = nn.Linear(value_width, config.hidden_size, bias=bias)
        self.temperature_proj = (
            nn.Linear(config.hidden_size, value_width, bias=bias)
            if config.use_lse and config.use_temperature_gate
            else None
        )
        self.outer_gate_proj = nn.Linear(config.hidden_size, value_width, bias=bias) if config.use_outer_gate else None
        decay_width = {"head": 1, "channel": self.head_dim}[config.gla_decay] * self.num_heads
        self.decay_proj = nn.Linear(config.hidden_size, decay_width, bias=True) if config.prior == "gla" else None
        if config.use_lse:
            self.beta_max_offset = math.log(math.expm1(config.beta_max_init))  # softplus^-1
            self.beta_max_raw = nn.Parameter(torch.zeros(value_width))
        # The conditioner modulates q, k, v, the gate logits and the prior's decay logits, in the order of
        # the projections (eq. 34a-d).
        gates = (self.temperature_proj is not None) + (self.outer_gate_proj is not None)
        modulated_width = 2 * qk_width + (1 + gates) * value_width + (decay_width if self.decay_proj is not None else 0)
        self.time_decay = (
            TimeDecayConditioner(
                config.hidden_size,
                config.time_decay_rank,
                modulated_width,
                config.time_decay_chunk_size,
                config.rms_norm_eps,
            )
            if config.use_time_decay
            else None
        )

    def beta_max(self) -> torch.Tensor:
        """Per-channel maximum inverse temperature, (heads, value_head_dim) (FEM eq. 9, App. K)."""
        return F.softplus(self.beta_max_raw.float() + self.beta_max_offset).view(self.num_heads, self.value_head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        energy_records: list | None = None,
        **kwargs,
    ) -> torch.Tensor:
        batch, length, _ = hidden_states.shape
        cache_layer = self._cache_layer(past_key_values)
        projections = [self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)]
        for gate in (self.temperature_proj, self.outer_gate_proj, self.decay_proj):
            if gate is not None:
                projections.append(gate(hidden_states))

        if self.time_decay is not None:
            initial_state = cache_layer.time_decay_state if cache_layer is not None else None
            features, final_state = self._recomputed_in_backward(
                self.time_decay, hidden_states, padding_mask, initial_state
            )
            if cache_layer is not None:
                cache_layer.time_decay_state = final_state
            projections = self.time_decay.modulate(projections, features)  # p (1 + c), eq. 34

        query, key, value = (x.view(batch, length, self.num_heads, -1).transpose(1, 2) for x in projections[:3])
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        gate_logits = projections[3:]
        beta = beta_to_value_shape(self.beta_max(), value) if self.config.use_lse else None
        if self.decay_proj is None:
            read = self._softmax_read(query, key, value, beta, attention_mask, cache_layer, past_key_values)
            output, mu, f_max, temperature_gate = self._recomputed_in_backward(
                self._softmax_output, *read, beta, *gate_logits
            )
        else:
            *gate_logits, decay_logits = gate_logits
            mu, f_max = self._gla_read(query, key, value, beta, decay_logits, padding_mask, cache_layer)
            output, mu, f_max, temperature_gate = self._recomputed_in_backward(
                self._gated_output, mu, f_max, *gate_logits
            )
        if energy_records is not None:
            energy_records.append(self._energy_record(mu, f_max, temperature_gate))
        return self.o_proj(output)

    def _softmax_read(self, query, key, value, beta, attention_mask, cache_layer, past_key_values):
        """The softmax prior's read of [v, exp(beta v - M)] (FEM H.1, App. F.4): ``(read, shift, mask)``."""
        length = query.shape[2]
        past_length = cache_layer.get_seq_length() if cache_layer is not None else 0
        mask = PreparedMask(length, past_length + length, attention_mask, attention_mask is None, query.device)
        shift = None
        if beta is not None:
            new_keys_visible = None if mask.key_is_visible is None else mask.key_is_visible[..., -length:, :]
            running_shift = cache_layer.exp_shift if cache_layer is not None else None
            value, exp_values, shift = exp_branch(value, beta, new_keys_visible, running_shift)
            # Concatenate in the (batch, seq, heads, dim) memory layout q and k have: SDPA is much slower on
            # mixed layouts.
            value = torch.cat([value.transpose(1, 2), exp_values.transpose(1, 2)], dim=-1).transpose(1, 2)
        if cache_layer is not None:
            key, value = past_key_values.update(key, value, self.layer_idx, exp_shift=shift)
        return attend(query, key, value, mask.attention_mask, mask.causal), shift, mask

    def _softmax_output(self, read, shift, mask: PreparedMask, beta, *gate_logits):
        f_max = None
        if beta is not None:
            read, shifted_partition = read.split(self.value_head_dim, dim=-1)
            f_max = mask.zero_empty_rows(restore_free_energy(read, shifted_partition, shift, beta))
        return self._gated_output(mask.zero_empty_rows(read), f_max, *gate_logits)

    def _gla_read(self, query, key, value, beta, decay_logits, padding_mask, cache_layer):
        """The GLA prior's read (FEM H.2) with its streaming state: ``(mu, f_max)``; f_max is None
        without the LSE branch."""
        batch, _, length, _ = query.shape
        log_decay = F.logsigmoid(decay_logits.float()) / self.config.gla_decay_normalizer
        log_decay = log_decay.view(batch, length, self.num_heads, -1).transpose(1, 2)
        read_beta = beta if beta is not None else torch.ones(1, self.num_heads, 1, self.value_head_dim)
        state = cache_layer.prior_state if cache_layer is not None else None
        mu, f_max, state = gla_free_energy_read(
            query, key, value, read_beta, log_decay, padding_mask, state,
            self.config.prior_chunk_size, self.config.feature_eps,
        )
        if cache_layer is not None:
            cache_layer.advance(state, length)
        return mu, (f_max if beta is not None else None)

    def _recomputed_in_backward(self, fn, *args):
        """Run ``fn``; when training, keep only its inputs for backward and recompute it there. Used for
        the cheap per-token work around the prior (conditioner, log restore, gates), whose intermediates
        would otherwise dominate FEM's activation memory."""
        if self.training and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _gated_output(self, mu, f_max, *gate_logits):
        """mu and f_max, (batch, heads, seq, value_head_dim), gated into the output (FEM eq. 10-11).

        Works in the (batch, seq, heads, dim) layout SDPA returns, so the heads merge without a copy."""
        batch, _, length, _ = mu.shape
        mu = mu.transpose(1, 2)
        f_max = f_max.transpose(1, 2) if f_max is not None else None
        gate_logits = iter(gate_logits)
        heads = (batch, length, self.num_heads, self.value_head_dim)
        temperature_gate = torch.sigmoid(next(gate_logits)).view(heads) if self.temperature_proj is not None else None
        outer_gate = None
        if self.outer_gate_proj is not None:
            outer_gate = outer_gate_activation(next(gate_logits).view(heads), self.config.rms_norm_eps)
        output = gated_free_energy(mu, f_max, temperature_gate, outer_gate).reshape(batch, length, -1)
        return output, mu, f_max, temperature_gate

    def _cache_layer(self, past_key_values: Cache | None):
        if past_key_values is None:
            return None
        layers = past_key_values.layers
        layer = layers[self.layer_idx] if self.layer_idx < len(layers) else None
        expected = FEMSoftmaxCacheLayer if self.decay_proj is None else FEMGLACacheLayer
        if not isinstance(layer, expected):
            raise TypeError(
                f"FEM layer {self.layer_idx} needs a {expected.__name__} cache layer (it keeps the FEM states); "
                f"got {type(layer).__name__}. Build caches with DynamicCache(config=model.config)."
            )
        return layer

    @torch.no_grad()
    def _energy_record(self, mu, f_max, temperature_gate) -> dict[str, torch.Tensor]:
        record = {}
        if f_max is not None:
            record["inverse_temperature"] = self.beta_max().detach()
            record["free_energy_gain"] = (f_max - mu).float().mean(dim=(-2, -1))  # KL(p||q)/beta, eq. 6: (b, s)
        if temperature_gate is not None:
            gate = temperature_gate.float().flatten(-2)
            record["temperature_gate"] = gate.mean(dim=-1)  # lambda, eq. 10: (b, s)
            record["temperature_gate_std"] = gate.std(dim=-1)
        return record


class FEMDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: FEMConfig, layer_idx: int):
        super().__init__()
        self.self_attn = FEMAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), **kwargs)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class FEMPreTrainedModel(PreTrainedModel):
    config_class = FEMConfig
    config: FEMConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["FEMDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _can_record_outputs = {"hidden_states": FEMDecoderLayer}

    def _init_weights(self, module):
        """N(0, 0.02) linear maps and embeddings, zero biases (FEM App. K); beta_max's raw parameter at 0
        (App. K); the conditioner's output map at 0 so every modulator starts at 1."""
        super()._init_weights(module)
        if isinstance(module, FEMAttention) and hasattr(module, "beta_max_raw"):
            init.zeros_(module.beta_max_raw)
        elif isinstance(module, TimeDecayConditioner):
            init.zeros_(module.out_proj)


class FEMModel(FEMPreTrainedModel):
    def __init__(self, config: FEMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(FEMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_energies: bool = False,
        **kwargs,
    ) -> BaseModelOutputWithEnergies:
        """``output_energies=True`` adds an `EnergyTrace` with, per layer, beta_max
        (``inverse_temperature``), the free-energy gain f_max - mu per token (``free_energy_gain``, the KL
        term of FEM eq. 6) and the inner gate lambda's mean and spread (``temperature_gate``)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None and not self.training:  # training builds no cache
            past_key_values = DynamicCache(config=self.config)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None and attention_mask is not None and attention_mask.dim() == 2:
            # Count real tokens only, as generate() does: RoPE followed by the GLA prior's ReLU features is
            # not shift-invariant, so a left-padded sequence must see the positions it has alone.
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -inputs_embeds.shape[1] :]
        elif position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)[None] + past_length
        causal_mask = None
        if self.config.prior == "softmax":  # recurrent priors are causal by construction and read padding_mask
            causal_mask = create_causal_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                position_ids=position_ids,
            )
        padding_mask = None
        if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
            padding_mask = attention_mask[:, -inputs_embeds.shape[1] :].bool()

        energy_records = [] if output_energies else None
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                attention_mask=causal_mask,
                padding_mask=padding_mask,
                past_key_values=past_key_values,
                energy_records=energy_records,
            )
        energies = None
        if output_energies:  # a copy: activation checkpointing may append again during backward
            energies = EnergyTrace(self.config.model_type, list(energy_records))
        return BaseModelOutputWithEnergies(
            last_hidden_state=self.norm(hidden_states),
            past_key_values=past_key_values,
            energies=energies,
        )


class FEMForCausalLM(FEMPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: FEMConfig):
        super().__init__(config)
        self.model = FEMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
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
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_energies=output_energies,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, kept, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithEnergies(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            energies=outputs.energies,
        )

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
            raise ValueError("from_llama needs a Llama without grouped-query attention (num_key_value_heads == heads).")
        fields = dict(
            vocab_size=llama_config.vocab_size,
            hidden_size=llama_config.hidden_size,
            intermediate_size=llama_config.intermediate_size,
            num_hidden_layers=llama_config.num_hidden_layers,
            num_attention_heads=llama_config.num_attention_heads,
            hidden_act=llama_config.hidden_act,
            max_position_embeddings=llama_config.max_position_embeddings,
            rms_norm_eps=llama_config.rms_norm_eps,
            tie_word_embeddings=llama_config.tie_word_embeddings,
            rope_parameters=dict(llama_config.rope_parameters),
            attention_bias=llama_config.attention_bias,
            mlp_bias=llama_config.mlp_bias,
            pad_token_id=llama_config.pad_token_id,
            bos_token_id=llama_config.bos_token_id,
            eos_token_id=llama_config.eos_token_id,
            qk_ratio=llama_config.head_dim * llama_config.num_attention_heads / llama_config.hidden_size,
            value_ratio=1.0,
        )
        fields.update(fem_overrides)
        model = cls(FEMConfig(**fields)).to(next(llama_model.parameters()).dtype)
        result = model.load_state_dict(llama_model.state_dict(), strict=False)
        if result.unexpected_keys:
            raise ValueError(f"Llama weights without a place in FEM-LM: {result.unexpected_keys[:4]}")
        return model
