"""The Free Energy Mixer read (FEM eq. 4-11, App. F-G), as functions any prior can reuse.

For a selection prior p_t over past positions and values v_i, FEM reads per channel j
    mu_t      = E_{p_t}[v]                                   (the expectation baseline, eq. 6)
    F^max_t   = beta_max^-1 log E_{p_t}[exp(beta_max v)]     (the free energy at beta_max, eq. 4 / 9)
    F~_t      = (1 - lambda_t) mu_t + lambda_t F^max_t       (linearised temperature learning, eq. 7 / 10)
    o_t       = g_t * F~_t                                   (outer gate, eq. 11)
Both mu and F^max come from ONE pass of the prior over the augmented values [v, exp(beta v - M)]
(FEM App. F.4, G.2).

Numerics (FEM App. G.2 "numerical stability", and the public reference layer):
- the exp branch is shifted by M = max over valid keys of beta * v, per (batch, head, channel), detached
  (it cancels exactly in the log, so gradients are exact);
- values are clipped to |beta v| <= ``EXP_ARGUMENT_CAP`` (40) before the read. Then beta v - M >= -80
  and exp never underflows to zero in fp32/bf16 for a valid row. Below the cap the read is exact; above
  it both mu and F^max are those of the clipped values (a documented saturation, as in the reference);
- the log is restored in fp32 (or the inputs' wider float); with the cap every exp term is >= e^-80, a
  normal float, so a row's partition is never 0 and its log never -inf;
- rounding can put F^max a hair below mu where Jensen says F^max >= mu; we return max(F^max, mu);
- query rows with no visible key (fully padded) return mu = F^max = 0 instead of NaN.
"""

import torch
import torch.nn.functional as F

try:  # optional CUDA kernel; the SDPA path below computes the same thing everywhere
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None

EXP_ARGUMENT_CAP = 40.0
# A cached shift stays while new values exceed it by at most this much: exp(beta v - M) <= e^20 is far from
# overflow, and since |beta v| <= 40 the shift then moves only a few times in a whole generation.
EXP_SHIFT_HEADROOM = 20.0


def beta_to_value_shape(beta: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-channel inverse temperature, shaped (heads, head_dim), (head_dim,) or (), against
    values shaped (batch, heads, seq, head_dim)."""
    if beta.dim() == 2:
        return beta[None, :, None, :]
    return beta


def clip_values_for_exp(value: torch.Tensor, beta: torch.Tensor, cap: float = EXP_ARGUMENT_CAP) -> torch.Tensor:
    """Clip values to |beta * v| <= cap, so that exp(beta v - M) stays within floating-point range."""
    limit = (cap / beta).to(value.dtype)
    return torch.clamp(value, -limit, limit)


def _bottom_right_causal_mask(query_len: int, key_len: int, device: torch.device) -> torch.Tensor:
    """Causal mask for queries that are the LAST `query_len` of `key_len` positions (cached decoding)."""
    offset = key_len - query_len
    query_positions = torch.arange(query_len, device=device)[:, None] + offset
    return torch.arange(key_len, device=device)[None, :] <= query_positions


def _visibility(attention_mask: torch.Tensor) -> torch.Tensor:
    """Boolean 'query may read key' from a boolean or additive float mask."""
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def attend(query, key, value, attention_mask=None, causal=True, scale=None):
    """softmax(q k^T * scale + mask) @ value; flash-attn on CUDA for unmasked fp16/bf16 when installed."""
    use_flash = (
        flash_attn_func is not None
        and query.is_cuda
        and attention_mask is None
        and query.dtype in (torch.float16, torch.bfloat16)
        and value.shape[-1] == query.shape[-1]
    )
    if use_flash:
        out = flash_attn_func(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scale, causal=causal
        )
        return out.transpose(1, 2)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, is_causal=causal and attention_mask is None, scale=scale
    )


class PreparedMask:
    """A mask normalised once for the reads below: the mask SDPA gets, whether SDPA applies the causal mask
    itself, which query rows see no key (they get zeros, not NaN), and which keys some query sees."""

    def __init__(self, query_len, key_len, attention_mask, causal, device):
        if causal and attention_mask is None and query_len == 1:
            causal = False  # the last position sees every key: no mask at all (cached decoding)
        if causal and (attention_mask is not None or query_len != key_len):
            causal_mask = _bottom_right_causal_mask(query_len, key_len, device)
            if attention_mask is None:
                attention_mask = causal_mask
            elif attention_mask.dtype == torch.bool:
                attention_mask = attention_mask & causal_mask
            else:
                attention_mask = attention_mask.masked_fill(~causal_mask, torch.finfo(attention_mask.dtype).min)
            causal = False
        self.empty_rows = None
        self.key_is_visible = None
        if attention_mask is not None:
            visible = _visibility(attention_mask)
            self.key_is_visible = visible.any(dim=-2).unsqueeze(-1)  # (b, h|1, k, 1)
            row_has_key = visible.any(dim=-1, keepdim=True)  # (b, h|1, q, 1)
            if not bool(row_has_key.all()):
                # An empty row would give NaN; let it read everything and zero its output afterwards.
                self.empty_rows = ~row_has_key
                if attention_mask.dtype == torch.bool:
                    attention_mask = attention_mask | self.empty_rows
                else:
                    attention_mask = attention_mask.masked_fill(self.empty_rows, 0.0)
        self.attention_mask = attention_mask
        self.causal = causal

    def zero_empty_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.empty_rows is None else tensor.masked_fill(self.empty_rows, 0.0)


def exp_branch(
    value: torch.Tensor,
    beta: torch.Tensor,
    key_is_visible: torch.Tensor | None = None,
    running_shift: torch.Tensor | None = None,
):
    """The augmented values of the one-pass read (FEM App. F.4): ``(value_clipped, exp_values, shift)``
    with exp_values = exp(beta v - M) and M the detached max of beta v per channel over the visible keys
    (when decoding, ``running_shift`` is the M of the values already cached; it is kept unless a channel
    outgrows it by more than ``EXP_SHIFT_HEADROOM``, so the cached exp values rarely need rescaling).
    ``beta`` is already broadcastable to ``value``; ``key_is_visible`` is (..., k_len, 1) or None."""
    work_dtype = torch.promote_types(value.dtype, torch.float32)  # fp32 for half precision, else v's own
    value = clip_values_for_exp(value, beta)
    scaled = beta * value.to(work_dtype)
    scaled_for_max = scaled if key_is_visible is None else scaled.masked_fill(~key_is_visible, -EXP_ARGUMENT_CAP)
    shift = scaled_for_max.amax(dim=-2, keepdim=True).detach()
    if running_shift is not None:
        shift = torch.where(shift > running_shift + EXP_SHIFT_HEADROOM, shift, running_shift)
    # In place is safe: the shift is detached and exp keeps its own output for backward.
    return value, scaled.sub_(shift).exp_().to(value.dtype), shift


def restore_free_energy(mu: torch.Tensor, shifted_partition: torch.Tensor, shift: torch.Tensor, beta: torch.Tensor):
    """f_max = beta^-1 (log E_p[exp(beta v - M)] + M) in fp32 (or wider), and >= mu.

    With |beta v| <= 40 every term exp(beta v - M) is >= e^-80, a normal float, so the partition of a
    row is never 0; and should a kernel ever flush it, the Jensen bound max(., mu) replaces -inf by mu."""
    work_dtype = torch.promote_types(mu.dtype, torch.float32)
    inverse_beta = 1 / beta
    f_max = torch.addcmul(shift * inverse_beta, torch.log(shifted_partition.to(work_dtype)), inverse_beta)
    return torch.maximum(f_max, mu.to(work_dtype)).to(mu.dtype)  # Jensen: fixes rounding only


def normalized_free_energy(numerator_v, numerator_exp, denominator, shift, beta, empty=None):
    """(mu, f_max) of a recurrent prior from its three read streams [v, exp(beta v - M), 1]: the ones
    stream is the normaliser (FEM eq. 29, Prop. 2.9), mu = num_v / den, f_max from num_exp / den. Rows
    with a zero denominator (nothing visible) or marked ``empty`` give 0."""
    empty = denominator <= 0 if empty is None else (denominator <= 0) | empty
    denominator = denominator.masked_fill(empty, 1.0)
    mu = numerator_v / denominator
    f_max = restore_free_energy(mu, numerator_exp / denominator, shift, beta)
    return mu.masked_fill(empty, 0.0), f_max.masked_fill(empty, 0.0)


def softmax_prior_read(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
):
    """The FEM read under the softmax-attention prior (FEM eq. 4, 6, 9 with H.1's prior; App. F.4 one pass).

    Args:
        q, k: (batch, heads, q_len / k_len, qk_dim) queries and keys (RoPE already applied).
        v: (batch, heads, k_len, v_dim) values.
        beta: inverse temperature beta_max > 0, shaped (heads, v_dim), (v_dim,) or a scalar tensor.
        attention_mask: optional mask broadcastable to (batch, heads, q_len, k_len): boolean (True = may
            attend) or additive float. Combined with ``causal``.
        causal: apply the causal mask; when q_len < k_len the queries are the last q_len positions.
        scale: score scale, default 1/sqrt(qk_dim).

    Returns:
        ``(mu, f_max)``, both (batch, heads, q_len, v_dim): mu = E_p[v] and
        f_max = beta^-1 log E_p[exp(beta v)] under the masked softmax prior p of q.k*scale, with
        f_max >= mu everywhere and no inf/NaN (see the module docstring for the numerics).
    """
    mask = PreparedMask(q.shape[-2], k.shape[-2], attention_mask, causal, q.device)
    beta = beta_to_value_shape(beta.to(torch.promote_types(v.dtype, torch.float32)), v)
    v, exp_values, shift = exp_branch(v, beta, mask.key_is_visible)
    read = attend(q, k, torch.cat([v, exp_values], dim=-1), mask.attention_mask, mask.causal, scale)
    mu, shifted_partition = read.split(v.shape[-1], dim=-1)
    f_max = restore_free_energy(mu, shifted_partition, shift, beta)
    return mask.zero_empty_rows(mu), mask.zero_empty_rows(f_max)


def gated_free_energy(
    mu: torch.Tensor,
    f_max: torch.Tensor | None = None,
    temperature_gate: torch.Tensor | None = None,
    outer_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """o = g * ((1 - lambda) mu + lambda f_max)  (FEM eq. 10-11).

    Ablations: ``f_max=None`` is the plain expectation read (no LSE branch); ``temperature_gate=None`` with
    an f_max means lambda = 1, the fixed-temperature free energy F(beta_max) (eq. 4); ``outer_gate=None``
    means g = 1.
    """
    if f_max is None:
        out = mu
    elif temperature_gate is None:
        out = f_max
    else:
        out = torch.lerp(mu, f_max, temperature_gate)
    return out if outer_gate is None else outer_gate * out


def outer_gate_activation(logits: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """g = RMSNorm(softplus(logits)) over the last (per-head channel) dimension, without gain (FEM §2.3.2):
    strictly positive and of unit RMS per head, so it rescales channels without distorting the norm of o."""
    gate = F.softplus(logits.float())
    return F.rms_norm(gate, gate.shape[-1:], eps=eps).to(logits.dtype)
