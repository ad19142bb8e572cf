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
from transformers.cache_utils import Cache, DynamicCache
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

from .configuration_fem import FEMConfig
from .fem_cache import FEMAFTCacheLayer, FEMGLACacheLayer, FEMSoftmaxCacheLayer, FEMSSMCacheLayer
from .free_energy import (
    PreparedMask,
    attend,
    beta_to_value_shape,
    exp_branch,
    gated_free_energy,
    outer_gate_activation,
    restore_free_energy,
)
from .prior_aft import aft_free_energy_read
from .prior_gla import gla_free_energy_read
from .prior_ssm import ssm_free_energy_read
from .outputs import BaseModelOutputWithEnergies, CausalLMOutputWithEnergies, EnergyTrace
from .time_decay import TimeDecayConditioner


# The projections of a FEM layer, in the order the conditioner's modulators are laid out (FEM eq. 34a-d).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "temperature_proj", "outer_gate_proj", "decay_proj", "dt_proj", "bc_proj")
CACHE_LAYERS = {"softmax": FEMSoftmaxCacheLayer, "gla": FEMGLACacheLayer, "aft": FEMAFTCacheLayer, "ssm": FEMSSMCacheLayer}
SSM_INITIAL_STEP = 0.01  # Delta at initialisation (the middle of Mamba's [0.001, 0.1])


class FEMAttention(nn.Module):
    """The two-level gated Free Energy Mixer in place of attention (FEM eq. 10-11, 34-35).

    o_t = g~_t * [(1 - lambda~_t) * E_{p~_t}[v~] + lambda~_t * beta_max^-1 log E_{p~_t}[exp(beta_max v~)]]
    with lambda = sigmoid (per channel), g = RMS-normalised softplus, beta_max = softplus per channel, ~ the
    time-decay modulation (1 + c) of App. I.2, and the prior p_t of ``config.prior``: softmax over RoPE'd
    q, k (H.1), gated linear attention over ReLU(RoPE(q)), ReLU(RoPE(k)) (H.2), AFT weights exp(k_i)
    per channel with optional decay (H.3), or a nonnegative SSM impulse response per channel (H.4).
    """

    def __init__(self, config: FEMConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.prior = config.prior
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.value_head_dim = config.value_head_dim
        qk_width, value_width = self.num_heads * self.head_dim, config.value_width
        hidden, bias = config.hidden_size, config.attention_bias
        if self.prior == "aft":  # per-channel logits, no queries (FEM H.3)
            self.k_proj = nn.Linear(hidden, value_width, bias=bias)
        elif self.prior == "ssm":  # Delta, B, C from the token; a, D per channel (FEM H.4)
            self.dt_proj = nn.Linear(hidden, value_width, bias=False)
            self.bc_proj = nn.Linear(hidden, 2 * config.ssm_state_size, bias=False)
            self.dt_bias = nn.Parameter(torch.full((value_width,), math.log(math.expm1(SSM_INITIAL_STEP))))
            self.ssm_generator_raw = nn.Parameter(torch.zeros(value_width))
            self.ssm_skip_raw = nn.Parameter(torch.zeros(value_width))
        else:
            self.q_proj = nn.Linear(hidden, qk_width, bias=bias)
            self.k_proj = nn.Linear(hidden, qk_width, bias=bias)
        self.v_proj = nn.Linear(hidden, value_width, bias=bias)
        self.o_proj = nn.Linear(value_width, hidden, bias=bias)
        if config.use_lse and config.use_temperature_gate:
            self.temperature_proj = nn.Linear(hidden, value_width, bias=bias)
        if config.use_outer_gate:
            self.outer_gate_proj = nn.Linear(hidden, value_width, bias=bias)
        if self.prior == "gla":
            per_head = {"head": 1, "channel": self.head_dim}[config.gla_decay]
            self.decay_proj = nn.Linear(hidden, per_head * self.num_heads, bias=True)
        elif self.prior == "aft" and config.aft_decay:
            self.decay_proj = nn.Linear(hidden, value_width, bias=True)
        if config.use_lse:
            self.beta_max_offset = math.log(math.expm1(config.beta_max_init))  # softplus^-1
            self.beta_max_raw = nn.Parameter(torch.zeros(value_width))
        self.projection_names = [name for name in PROJECTIONS if hasattr(self, name)]
        self.time_decay = (
            TimeDecayConditioner(
                hidden,
                config.time_decay_rank,
                sum(getattr(self, name).out_features for name in self.projection_names),
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
        projections = [getattr(self, name)(hidden_states) for name in self.projection_names]
        if self.time_decay is not None:
            initial_state = cache_layer.time_decay_state if cache_layer is not None else None
            features, final_state = self._recomputed_in_backward(
                self.time_decay, hidden_states, padding_mask, initial_state
            )
            if cache_layer is not None:
                cache_layer.time_decay_state = final_state
            projections = self.time_decay.modulate(projections, features)  # p (1 + c), eq. 34
        projected = dict(zip(self.projection_names, projections))
        gate_logits = [projected[name] for name in ("temperature_proj", "outer_gate_proj") if name in projected]
        beta = self.beta_max() if self.config.use_lse else None

        if self.prior in ("softmax", "gla"):  # the priors with queries and keys, rotated by RoPE
            query, key, value = (
                projected[name].view(batch, length, self.num_heads, -1).transpose(1, 2)
                for name in ("q_proj", "k_proj", "v_proj")
            )
            query, key = apply_rotary_pos_emb(query, key, *position_embeddings)
            beta = beta_to_value_shape(beta, value) if beta is not None else None
        if self.prior == "softmax":
            read = self._softmax_read(query, key, value, beta, attention_mask, cache_layer, past_key_values)
            output, mu, f_max, temperature_gate = self._recomputed_in_backward(
                self._softmax_output, *read, beta, *gate_logits
            )
        else:
            if self.prior == "gla":
                mu, f_max = self._gla_read(query, key, value, beta, projected["decay_proj"], padding_mask, cache_layer)
            else:
                mu, f_max = self._channel_prior_read(projected, beta, padding_mask, cache_layer)
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

    def _log_decay(self, decay_logits: torch.Tensor) -> torch.Tensor:
        """g = logsigmoid(x W_g) / normaliser <= 0, the priors' input-conditioned decay (FEM H.2, H.3)."""
        return F.logsigmoid(decay_logits.float()) / self.config.decay_normalizer

    def _recurrent_beta(self, beta, shape):
        """beta for the recurrent reads; without the LSE branch their f_max is computed at beta = 1 and dropped."""
        return beta.view(shape) if beta is not None else torch.ones(shape, device=self.v_proj.weight.device)

    def _gla_read(self, query, key, value, beta, decay_logits, padding_mask, cache_layer):
        """The GLA prior's read (FEM H.2) with its streaming state: ``(mu, f_max)``; f_max is None
        without the LSE branch."""
        batch, _, length, _ = query.shape
        log_decay = self._log_decay(decay_logits).view(batch, length, self.num_heads, -1).transpose(1, 2)
        state = cache_layer.prior_state if cache_layer is not None else None
        mu, f_max, state = gla_free_energy_read(
            query, key, value, self._recurrent_beta(beta, (1, self.num_heads, 1, self.value_head_dim)),
            log_decay, padding_mask, state, self.config.prior_chunk_size, self.config.feature_eps,
        )
        if cache_layer is not None:
            cache_layer.advance(state, length)
        return mu, (f_max if beta is not None else None)

    def _channel_prior_read(self, projected, beta, padding_mask, cache_layer):
        """The per-channel recurrent priors' read, AFT (FEM H.3) or SSM (H.4), on (batch, seq, value_width),
        returned per head as (batch, heads, seq, value_head_dim) views: ``(mu, f_max)``; f_max is None
        without the LSE branch."""
        value = projected["v_proj"]
        batch, length, width = value.shape
        read_beta = self._recurrent_beta(beta, (width,))
        state = cache_layer.prior_state if cache_layer is not None else None
        chunk_size = self.config.prior_chunk_size
        if self.prior == "aft":
            log_decay = self._log_decay(projected["decay_proj"]) if "decay_proj" in projected else None
            mu, f_max, state = aft_free_energy_read(
                projected["k_proj"], value, read_beta, log_decay, padding_mask, state, chunk_size
            )
        else:
            delta = F.softplus(projected["dt_proj"].float() + self.dt_bias)
            input_matrix, output_matrix = F.softplus(projected["bc_proj"].float()).chunk(2, dim=-1)
            mu, f_max, state = ssm_free_energy_read(
                value, read_beta, delta, -F.softplus(self.ssm_generator_raw), input_matrix, output_matrix,
                F.softplus(self.ssm_skip_raw), padding_mask, state, chunk_size,
            )
        if cache_layer is not None:
            cache_layer.advance(state, length)

        def per_head(x):
            return x.view(batch, length, self.num_heads, self.value_head_dim).transpose(1, 2)

        return per_head(mu), (per_head(f_max) if beta is not None else None)

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
        temperature_gate = torch.sigmoid(next(gate_logits)).view(heads) if hasattr(self, "temperature_proj") else None
        outer_gate = None
        if hasattr(self, "outer_gate_proj"):
            outer_gate = outer_gate_activation(next(gate_logits).view(heads), self.config.rms_norm_eps)
        output = gated_free_energy(mu, f_max, temperature_gate, outer_gate).reshape(batch, length, -1)
        return output, mu, f_max, temperature_gate

    def _cache_layer(self, past_key_values: Cache | None):
        if past_key_values is None:
            return None
        layers = past_key_values.layers
        layer = layers[self.layer_idx] if self.layer_idx < len(layers) else None
        expected = CACHE_LAYERS[self.prior]
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
        (App. K); the conditioner's output map at 0 so every modulator starts at 1; the SSM prior's a and D
        at -softplus(0) and softplus(0), its step sizes at Delta = 0.01 (Mamba's range)."""
        super()._init_weights(module)
        if isinstance(module, FEMAttention):
            for name in ("beta_max_raw", "ssm_generator_raw", "ssm_skip_raw"):
                if hasattr(module, name):
                    init.zeros_(getattr(module, name))
            if hasattr(module, "dt_bias"):
                init.constant_(module.dt_bias, math.log(math.expm1(SSM_INITIAL_STEP)))
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
