"""The softmax-attention prior of FEM (App. H.1): p_t = softmax(q_t . k_i / sqrt(d_k)) over the past, with RoPE'd
queries and keys, read in one attention pass over the augmented values [v, exp(beta v - M)] (App. F.4).

The read runs through an attention function: PyTorch's SDPA by default, or transformers' attention function of
``config._attn_implementation`` (`attend`), so the prior takes transformers' masks and kernels as they are.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import DynamicLayer, StaticLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from .caches import CacheStatesMixin
from .errors import UserError
from .fem_cache import fem_layer_type
from .fem_free_energy import (
    FreeEnergyRead,
    PriorSpec,
    clip_values_for_exp,
    exp_shift,
    read_dtype,
    restore_free_energy,
    rotated_query_key,
)
from .numerics import cast, work_dtype


class SoftmaxPriorCache(CacheStatesMixin):
    """Decoding state of one FEM layer with the softmax prior: the prior's keys, the augmented values
    [v, exp(beta v - M)] of the one-pass read (FEM App. F.4) as ``keys`` / ``values``, the shift M, and the
    time-decay conditioner's O(H_c) state (App. I, Prop. I.1). The layer is its own prior state:
    `softmax_free_energy_read` extends it (`extend`) before it attends, so cached decoding computes the read of one
    full forward while each step only exponentiates its own values. With the default budget (i),
    [v, exp(beta v)] has the Q/K head width: the value cache has the size of Llama's (fp16 models cache in fp32,
    since fp16 cannot hold the exp branch). `FEMSoftmaxCacheLayer` grows (DynamicCache), `FEMSoftmaxStaticCacheLayer`
    writes into preallocated buffers (StaticCache, compiled decoding)."""

    _layer_type = fem_layer_type("softmax")
    state_names = ("time_decay_state", "exp_shift")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.time_decay_state: torch.Tensor | None = None
        self.exp_shift: torch.Tensor | None = None

    @property
    def prior_state(self) -> "SoftmaxPriorCache":
        return self

    def advance(self, prior_state: "SoftmaxPriorCache", new_tokens: int) -> None:
        """Nothing left to store: `extend` wrote the keys, values and shift, and `update` counted the tokens."""

    def extend(self, keys: torch.Tensor, values: torch.Tensor, shift: torch.Tensor | None):
        """Append the new positions' keys (batch, heads, new, qk_dim) and augmented values at shift M (batch, 1,
        heads, v_dim; None without the LSE branch), and return all keys and augmented values. The first call's M
        stays for the whole generation (`softmax_free_energy_read` reads it back): values are clipped to
        |beta v| <= EXP_ARGUMENT_CAP, so a later exp(beta v - M) is at most e^80, within the range of the dtypes
        the read runs in (`read_dtype`), and the cached exp values never need rescaling. A decoding step then writes
        only its keys and values (a write to M would also trip inductor's CPU outer-loop fusion,
        pytorch/pytorch#196570)."""
        if self.exp_shift is None:
            self.exp_shift = shift
        return self.update(keys, values)


class FEMSoftmaxCacheLayer(SoftmaxPriorCache, DynamicLayer):
    __doc__ = SoftmaxPriorCache.__doc__


class FEMSoftmaxStaticCacheLayer(SoftmaxPriorCache, StaticLayer):
    __doc__ = SoftmaxPriorCache.__doc__
    keeps_in_place = True


def add_query_key(layer: nn.Module, config) -> None:
    """q_proj and k_proj of the queries and keys (``config.head_dim`` per head), as in Llama."""
    width = config.num_attention_heads * config.head_dim
    layer.q_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
    layer.k_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)


def softmax_selection(layer, projected, position_embeddings, attention_mask, padding_mask):
    """RoPE'd queries and keys (FEM H.1); the mask is the causal mask transformers builds for the attention
    function, which `attend` runs."""
    query_key = rotated_query_key(projected, position_embeddings, layer.head_dim)
    return query_key, {"attention_mask": attention_mask, "attention": lambda *args: attend(layer, *args),
                       "value_limits": layer.value_limits() if layer.use_lse else None}


def attend(layer, query, key, value, attention_mask, scale):
    """The softmax prior's read through the attention function of ``config._attn_implementation``: PyTorch's
    SDPA for "sdpa" (transformers' SDPA wrapper returns a contiguous copy of the output, and FEM keeps slices of
    the read for backward, so that copy would stay alive beside the output SDPA saves), transformers' attention
    functions for the others."""
    implementation = layer.config._attn_implementation
    scale = scale or layer.scaling
    if implementation == "sdpa":
        return sdpa_attention(query, key, value, attention_mask, scale)
    if implementation == "flash_attention_2":
        if query.dtype != torch.bfloat16:
            raise UserError(
                f"FEM's softmax prior under attn_implementation={implementation!r} needs a bfloat16 model: fp16 "
                "cannot hold the exp branch (its values reach e^-80), and fp32 has no flash kernel. Use "
                "dtype=torch.bfloat16, or attn_implementation='sdpa'."
            )
        if value.shape[-1] > query.shape[-1]:  # transformers pads narrower values to the query width
            raise UserError(
                f"attn_implementation={implementation!r} needs [v, exp(beta v)] no wider than the queries (2 x "
                f"value_head_dim = {value.shape[-1]}, head_dim = {query.shape[-1]}): use value_ratio <= "
                "qk_ratio / 2."
            )
    if implementation == "eager" and attention_mask is not None and attention_mask.dtype == torch.float64:
        # transformers' eager softmax runs in fp32: a float64 mask's minimum would become -inf there, and
        # rows with no visible key NaN (then 0 * NaN in later layers reaches real tokens). (Half-precision
        # masks fit in fp32, and cannot hold fp32's minimum.)
        attention_mask = attention_mask.clamp_min(torch.finfo(torch.float32).min)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    return interface(layer, query, key, value, attention_mask, dropout=0.0, scaling=scale)


AttentionFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def sdpa_attention(query, key, value, attention_mask, scale):
    """softmax(q k^T * scale + mask) @ value with PyTorch's SDPA; inputs (batch, heads, seq, dim), output
    (batch, q_len, heads, v_dim) and no weights, as transformers' attention functions return them. A mask of
    None means causal (top-left aligned, as `create_causal_mask` only omits it when that is right)."""
    causal = attention_mask is None and query.shape[2] > 1
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scale)
    return out.transpose(1, 2), None


def softmax_free_energy_read(
    value: torch.Tensor,
    beta: torch.Tensor | None,
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    state: SoftmaxPriorCache | None = None,
    attention: AttentionFunction = sdpa_attention,
    scale: float | None = None,
    value_limits: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> FreeEnergyRead:
    """The FEM read under the softmax-attention prior (FEM eq. 4, 6, 9 with H.1's prior; App. F.4 one pass).

    Args:
        value: (batch, seq, heads, v_dim) values of the new positions.
        beta: beta_max > 0, (heads, v_dim); None reads mu only (no LSE branch, FEM's "L" switch off).
        query, key: (batch, heads, seq, qk_dim), RoPE already applied.
        attention_mask: None (causal, no padding) or a mask over (cached + new) keys as
            `create_causal_mask` builds it for ``attention``: boolean (True = may attend) or additive.
        state: the layer's `SoftmaxPriorCache` (keys (batch, heads, past, qk_dim), augmented values
            [v, exp(beta v - M)] (batch, heads, past, 2 v_dim) and their shift M (batch, 1, heads, v_dim)), which
            the read extends with the new positions before attending; None reads without a cache.
        attention: ``f(query, key, value, mask, scale) -> (out (batch, q_len, heads, dim), weights | None)``;
            FEMAttention passes transformers' attention function of ``config._attn_implementation``.
        scale: score scale, default 1/sqrt(qk_dim).
        value_limits: `fem_free_energy.value_limits` of ``beta``, where the caller keeps them between calls.

    Returns:
        `FreeEnergyRead` whose state is ``state`` itself, extended (at the shift it keeps,
        `SoftmaxPriorCache.extend`), so cached decoding computes the full forward's read.
    """
    out_dtype = value.dtype
    dtype = read_dtype(value.dtype)
    query, key, value = cast(query, dtype), cast(key, dtype), cast(value, dtype)
    shift = None
    if beta is not None:
        beta = cast(beta, work_dtype(dtype))
        value = clip_values_for_exp(value, beta, value_limits)
        scaled = beta * cast(value, beta.dtype)
        shift = exp_shift(scaled, dim=1) if state is None or state.exp_shift is None else state.exp_shift
        # In place is safe: the shift is detached and exp keeps its own output for backward.
        value = torch.cat([value, cast(scaled.sub_(shift).exp_(), dtype)], dim=-1)
    # (batch, seq, heads, dim) memory, the layout q and k have: SDPA is much slower on mixed layouts.
    value = value.transpose(1, 2)
    if state is not None:
        key, value = state.extend(key, value, shift)
    read, weights = attention(query, key, value, attention_mask, scale)
    if beta is None:
        return FreeEnergyRead(cast(read, out_dtype), None, state, weights)
    mu, shifted_partition = read.split(read.shape[-1] // 2, dim=-1)
    # an unmasked decoding step: the new token sees itself, so no row is empty
    unmasked_step = state is not None and query.shape[2] == 1 and attention_mask is None
    f_max = restore_free_energy(mu, shifted_partition, shift, beta, every_row_sees_a_key=unmasked_step)
    return FreeEnergyRead(cast(mu, out_dtype), cast(f_max, out_dtype), state, weights)


PRIOR = PriorSpec("softmax", "H.1", ("q_proj", "k_proj"), queries_and_keys=True, kernels=("auto",),
                  add_modules=add_query_key, selection=softmax_selection, read=softmax_free_energy_read,
                  cache_layers=(FEMSoftmaxCacheLayer, FEMSoftmaxStaticCacheLayer), attention_function=True,
                  quadratic=True, gpu_kernel=("flash_attention_2", "flash_attn"))
