"""The Free Energy Mixer read (FEM eq. 4-11, App. F-G), as functions every prior reuses.

For a selection prior p_t over past positions and values v_i, FEM reads per channel j
    mu_t      = E_{p_t}[v]                                   (the expectation baseline, eq. 6)
    F^max_t   = beta_max^-1 log E_{p_t}[exp(beta_max v)]     (the free energy at beta_max, eq. 4 / 9)
    F~_t      = (1 - lambda_t) mu_t + lambda_t F^max_t       (linearised temperature learning, eq. 7 / 10)
    o_t       = g_t * F~_t                                   (outer gate, eq. 11)
Both mu and F^max come from ONE pass of the prior over the augmented values [v, exp(beta v - M)]
(FEM App. F.4, G.2).

One read per prior, one shape of signature (``FEMAttention`` calls exactly these functions):

    <prior>_free_energy_read(value, beta, *selection, <mask>=..., state=None, <options>) -> FreeEnergyRead

``value`` is (batch, seq, heads, v_dim) and ``beta`` (heads, v_dim); ``selection`` are the prior's own
tensors (softmax: query, key; GLA: query, key, log decay; AFT: logits, log decay; SSM: step sizes, generator,
input/output matrices, skip); the mask is ``attention_mask`` for the softmax prior (as
`transformers.masking_utils.create_causal_mask` builds it for the attention function) and ``valid``
(batch, seq) for the recurrent priors; ``state`` is what a cache keeps between calls. The result holds mu
and f_max as (batch, seq, heads, v_dim) and the new state.

Numerics (FEM App. G.2 "numerical stability", and the public reference layer):
- the exp branch is shifted by M = max of beta * v over the keys, per (batch, head, channel), detached
  (it cancels exactly in the log, so values and gradients are exact);
- values are clipped to |beta v| <= ``EXP_ARGUMENT_CAP`` (40) before the read. Then every exp term lies in
  [e^-80, 1]: normal numbers in fp32 and bf16 (which share fp32's exponent range). Below the cap the read is
  exact; above it both mu and F^max are those of the clipped values (a documented saturation, as in the
  reference);
- fp16 cannot hold e^-80 (its smallest subnormal is ~e^-16.6): a read on fp16 inputs runs in fp32 (the
  softmax prior's keys and augmented values are then cached in fp32) and returns fp16. Reads run with
  autocast off, so mixed precision cannot push the exp branch back into fp16;
- the log is restored in fp32 (or the inputs' wider float). Rows whose partition is 0 - rows that see no
  key (padding), for which SDPA returns zeros - take f_max = mu there, and the log never sees a 0, so
  neither the forward nor the backward meets log(0). There is no Jensen clamp max(f_max, mu): rounding
  may put f_max a hair below mu, and a clamp would hide a collapsed branch.
"""

import functools
import importlib.util
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

EXP_ARGUMENT_CAP = 40.0
# A cached shift stays while new values exceed it by at most this much: exp(beta v - M) <= e^20 is far from
# overflow, and since |beta v| <= 40 the shift then moves only a few times in a whole generation.
EXP_SHIFT_HEADROOM = 20.0


class FreeEnergyRead(NamedTuple):
    """What every prior's read returns: mu and f_max, (batch, seq, heads, v_dim); the state a cache keeps;
    and the prior's probabilities (batch, heads, q_len, k_len) when the attention function materialises
    them (the softmax prior under eager attention), else None. ``f_max`` is None without an LSE branch."""

    mu: torch.Tensor
    f_max: torch.Tensor | None
    state: tuple | None
    weights: torch.Tensor | None = None


@functools.cache
def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def read_kernel(requested: str, tensor: torch.Tensor, library: str, package: str) -> str:
    """The implementation a recurrent read on ``tensor`` runs (``FEMConfig.kernel``): ``library`` (the prior's
    GPU kernel library) when named, or under "auto" when ``tensor`` is on CUDA, ``package`` is installed and the read
    works in float32 (the kernels' dtype: half precision reads are widened to it, float64 ones are not); "torch" (the
    chunkwise PyTorch form, the reference) otherwise. Never chosen by sequence length: prefill and decoding run the
    same implementation. Naming ``library`` where it cannot run is an error, not a fallback."""
    runnable = tensor.is_cuda and work_dtype(tensor.dtype) == torch.float32 and installed(package)
    if requested == library and not runnable:
        raise ValueError(
            f"FEMConfig.kernel={library!r} needs CUDA tensors of at most float32 precision and the {package} package "
            f"(pip install 'energyzoo[cuda]'); got {tensor.dtype} tensors on {tensor.device}, {package} "
            f"{'installed' if installed(package) else 'not installed'}. Use kernel='auto' or 'torch'."
        )
    return library if requested == library or (requested == "auto" and runnable) else "torch"


def chunk_slices(length: int, chunk_size: int | None) -> list[slice]:
    """The pieces a recurrent read walks through: chunks of ``chunk_size``, or (None) the whole sequence at once,
    as one kernel call takes it."""
    if chunk_size is None:
        return [slice(None)]
    return [slice(start, start + chunk_size) for start in range(0, length, chunk_size)]


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half precision, else the dtype itself (float64 stays float64): where exponentials, logs and
    normalisations are computed."""
    return torch.promote_types(dtype, torch.float32)


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in `work_dtype`: half precision goes to fp32, wider floats stay as they are."""
    return tensor.to(work_dtype(tensor.dtype))


def read_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the softmax prior's one-pass read runs in: the inputs' own, except fp16, which cannot hold
    exp values down to e^-80 (bf16 can: it has fp32's exponent range)."""
    return torch.float32 if dtype == torch.float16 else dtype


def clip_values_for_exp(value: torch.Tensor, beta: torch.Tensor, cap: float = EXP_ARGUMENT_CAP) -> torch.Tensor:
    """Clip values to |beta * v| <= cap, so that exp(beta v - M) stays within floating-point range."""
    limit = (cap / beta).to(value.dtype)
    return torch.clamp(value, -limit, limit)


def exp_shift(scaled: torch.Tensor, dim: int, running_shift: torch.Tensor | None = None) -> torch.Tensor:
    """M: the detached max of beta v over the keys (``dim``). When decoding, ``running_shift`` is the M the
    cached exp values were taken at; it is kept unless a channel outgrows it by more than
    ``EXP_SHIFT_HEADROOM``, so the cache rarely needs rescaling."""
    shift = scaled.detach().amax(dim=dim, keepdim=True)
    if running_shift is None:
        return shift
    return torch.where(shift > running_shift + EXP_SHIFT_HEADROOM, shift, running_shift)


def _restored(mu, shifted_partition, shift, beta):
    """f_max = where(Z > 0, (M + log Z) / beta, mu), in fp32 or wider, cast back to mu's dtype."""
    work = work_dtype(mu.dtype)
    partition = shifted_partition.to(work)
    positive = partition > 0
    f_max = (shift.to(work) + torch.log(torch.where(positive, partition, 1.0))) / beta.to(work)
    return torch.where(positive, f_max, mu.to(work)).to(mu.dtype)


class _RestoredFreeEnergy(torch.autograd.Function):
    """f_max = where(Z > 0, (M + log Z) / beta, mu) that keeps only its inputs for backward (Z, the shifted
    partition, is a slice of the softmax prior's read, which SDPA keeps anyway) and recomputes the rest there:
    as a plain expression, autograd would store two more fp32 tensors of the read's size per layer."""

    @staticmethod
    def forward(ctx, mu, shifted_partition, shift, beta):
        ctx.save_for_backward(shifted_partition, shift, beta)
        ctx.mu_dtype = mu.dtype
        return _restored(mu, shifted_partition, shift, beta)

    @staticmethod
    def backward(ctx, grad):
        shifted_partition, shift, beta = ctx.saved_tensors
        work = work_dtype(ctx.mu_dtype)
        partition = shifted_partition.to(work)
        positive = partition > 0
        grad = grad.to(work)
        inverse_beta = 1 / beta.to(work)
        safe_partition = torch.where(positive, partition, 1.0)
        grad_mu = grad_partition = grad_beta = None
        if ctx.needs_input_grad[0]:
            grad_mu = torch.where(positive, 0.0, grad).to(ctx.mu_dtype)
        if ctx.needs_input_grad[1]:  # d f / d Z = 1 / (beta Z)
            grad_partition = torch.where(positive, grad * inverse_beta / safe_partition, 0.0)
            grad_partition = grad_partition.to(shifted_partition.dtype)
        if ctx.needs_input_grad[3]:  # d f / d beta = -(M + log Z) / beta^2
            log_term = (shift.to(work) + torch.log(safe_partition)) * inverse_beta.square()
            grad_beta = torch.where(positive, -grad * log_term, 0.0).sum_to_size(beta.shape).to(beta.dtype)
        return grad_mu, grad_partition, None, grad_beta


def restore_free_energy(
    mu: torch.Tensor, shifted_partition: torch.Tensor, shift: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """f_max = beta^-1 (log E_p[exp(beta v - M)] + M), computed in fp32 (or wider), returned in mu's dtype.

    A zero partition (a row that sees no key) gives f_max = mu; the log is taken of 1 there instead, so
    its gradient is 0, not inf * 0 = NaN. The shift M is detached (it cancels exactly)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (mu, shifted_partition, beta)):
        return _RestoredFreeEnergy.apply(mu, shifted_partition, shift.detach(), beta)
    return _restored(mu, shifted_partition, shift, beta)  # nothing to save: no autograd.Function overhead


def normalized_free_energy(numerator_v, numerator_exp, denominator, shift, beta, empty=None):
    """(mu, f_max) of a recurrent prior from its three read streams [v, exp(beta v - M), 1]: the ones
    stream is the normaliser (FEM eq. 29, Prop. 2.9), mu = num_v / den, f_max from num_exp / den. Rows
    with a zero denominator (nothing visible) or marked ``empty`` give 0, with finite gradients."""
    empty = denominator <= 0 if empty is None else (denominator <= 0) | empty
    denominator = torch.where(empty, torch.ones_like(denominator), denominator)
    mu = torch.where(empty, torch.zeros_like(numerator_v), numerator_v / denominator)
    partition = torch.where(empty, torch.zeros_like(numerator_exp), numerator_exp / denominator)
    return mu, restore_free_energy(mu, partition, shift, beta)


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
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None,
    attention: AttentionFunction = sdpa_attention,
    scale: float | None = None,
) -> FreeEnergyRead:
    """The FEM read under the softmax-attention prior (FEM eq. 4, 6, 9 with H.1's prior; App. F.4 one pass).

    Args:
        value: (batch, seq, heads, v_dim) values of the new positions.
        beta: beta_max > 0, (heads, v_dim); None reads mu only (no LSE branch, FEM's "L" switch off).
        query, key: (batch, heads, seq, qk_dim), RoPE already applied.
        attention_mask: None (causal, no padding) or a mask over (cached + new) keys as
            `create_causal_mask` builds it for ``attention``: boolean (True = may attend) or additive.
        state: ``(keys, augmented_values, shift)`` of the cached positions: keys (batch, heads, past, qk_dim),
            the augmented values [v, exp(beta v - M)] (batch, heads, past, 2 v_dim) and their shift M
            (batch, 1, heads, v_dim); None when nothing is cached.
        attention: ``f(query, key, value, mask, scale) -> (out (batch, q_len, heads, dim), weights | None)``;
            FEMAttention passes transformers' attention function of ``config._attn_implementation``.
        scale: score scale, default 1/sqrt(qk_dim).

    Returns:
        `FreeEnergyRead` with the new state ``(all keys, all augmented values, M)``. When the shift moves
        (a new value outgrew the cached M by more than the headroom), the cached exp values are rescaled by
        exp(M_old - M_new) first (online-softmax style), so cached decoding computes the full forward's read.
    """
    out_dtype = value.dtype
    dtype = read_dtype(value.dtype)
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    shift = None
    if beta is not None:
        beta = beta.to(work_dtype(dtype))
        value = clip_values_for_exp(value, beta)
        scaled = beta * value.to(beta.dtype)
        shift = exp_shift(scaled, dim=1, running_shift=None if state is None else state[2])
        # In place is safe: the shift is detached and exp keeps its own output for backward.
        value = torch.cat([value, scaled.sub_(shift).exp_().to(dtype)], dim=-1)
    # (batch, seq, heads, dim) memory, the layout q and k have: SDPA is much slower on mixed layouts.
    value = value.transpose(1, 2)
    if state is not None:
        past_keys, past_values, past_shift = state
        # The shift rarely moves (headroom): eager decoding skips the O(cache) rescale then; compiled code
        # keeps one branch-free graph (the factor is 1 where the shift stayed).
        if shift is not None and (torch.compiler.is_compiling() or not torch.equal(shift, past_shift)):
            half = value.shape[-1] // 2
            rescale = torch.exp(past_shift - shift).transpose(1, 2).to(dtype)
            past_values = torch.cat([past_values[..., :half], past_values[..., half:] * rescale], dim=-1)
        key = torch.cat([past_keys, key], dim=2)
        value = torch.cat([past_values, value], dim=2)
    read, weights = attention(query, key, value, attention_mask, scale)
    if beta is None:
        return FreeEnergyRead(read.to(out_dtype), None, (key, value, None), weights)
    mu, shifted_partition = read.split(read.shape[-1] // 2, dim=-1)
    f_max = restore_free_energy(mu, shifted_partition, shift, beta)
    return FreeEnergyRead(mu.to(out_dtype), f_max.to(out_dtype), (key, value, shift), weights)


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
    gate = F.softplus(widened(logits))
    return F.rms_norm(gate, gate.shape[-1:], eps=eps).to(logits.dtype)
