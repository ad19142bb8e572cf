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
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .errors import UserError
from .numerics import cast, widened, work_dtype

EXP_ARGUMENT_CAP = 40.0


class FreeEnergyRead(NamedTuple):
    """What every prior's read returns: mu and f_max, (batch, seq, heads, v_dim); the state a cache keeps;
    and the prior's probabilities (batch, heads, q_len, k_len) when the attention function materialises
    them (the softmax prior under eager attention), else None. ``f_max`` is None without an LSE branch."""

    mu: torch.Tensor
    f_max: torch.Tensor | None
    state: tuple | None
    weights: torch.Tensor | None = None


@dataclass(frozen=True)
class PriorSpec:
    """A selection prior of FEM App. H, everything about it in one row: each ``fem_prior_<name>.py`` exports its own
    (``PRIOR``) and `configuration_fem.PRIORS` lists them, so a layer, the config's checks, the tensor-parallel plan,
    the bench and the tests read a prior's facts here and never test its name.

    name: ``FEMConfig.prior``'s value. paper: the section of fem.txt App. H that defines it.
    projections: the layer's projections of the token that feed the selection (beside v_proj and the gates).
    queries_and_keys: whether it reads RoPE'd queries and keys (without them, rope_parameters have no effect).
    kernels: the read implementations ``FEMConfig.kernel`` may name.
    gpu_kernel: (its GPU kernel's name, the package that has it) where it has one: the name ``FEMConfig.kernel`` takes
        (the softmax prior's is an attention implementation, ``attn_implementation``); `energyzoo doctor` checks each.
    add_modules(layer, config): sets the layer's projections and parameters of ``projections`` but the decay.
    decay_width(config): the output width of its decay projection g (H.2-H.3; bias on), where ``projections`` has
        ``decay_proj``. The layer adds that one after the values and gates: the order post_init draws a seed's
        weights in since the decay priors came (tests/test_fem.py pins it).
    selection(layer, projected, position_embeddings, attention_mask, padding_mask) -> (tensors, options): the
        read's selection arguments from the layer's projections (``projected``: name -> output).
    read(value, beta, *tensors, state=..., **options) -> `FreeEnergyRead`.
    cache_layers: the (dynamic, static) cache layers that keep the read's state while decoding (one class twice
        where the state has a fixed size: a recurrence).
    switched: projection -> the boolean config field without which a layer has none.
    attention_function: whether it reads through transformers' attention functions (``attn_implementation``, the
        causal mask they take, and the probabilities eager attention returns); the others are causal by
        construction, read the padding mask and accept only "sdpa" (the default) as ``attn_implementation``.
    quadratic: whether its read's work grows with the square of the length (the bench bounds the others' growth).
    replicated: its projections kept whole on every process under tensor parallelism (the SSM's B / C, shared by
        all channels); its other projections are split by output columns.
    parameters: its per-channel parameters (split by output columns under tensor parallelism).
    init_parameters(layer): the initial values of its bare parameters, if it has any.
    """

    name: str
    paper: str
    projections: tuple[str, ...]
    queries_and_keys: bool
    kernels: tuple[str, ...]
    add_modules: Callable[[torch.nn.Module, Any], None]
    selection: Callable[..., tuple[tuple, dict]]
    read: Callable[..., FreeEnergyRead]
    cache_layers: tuple[type, type]
    switched: dict[str, str] = field(default_factory=dict)
    attention_function: bool = False
    quadratic: bool = False
    replicated: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()
    init_parameters: Callable[[torch.nn.Module], None] | None = None
    decay_width: Callable[[Any], int] | None = None
    gpu_kernel: tuple[str, str] | None = None

    @property
    def recurrent(self) -> bool:
        """Whether its decoding state has a fixed size (one cache-layer class for dynamic and static caches)."""
        return self.cache_layers[0] is self.cache_layers[1]

    def layer_projections(self, config) -> tuple[str, ...]:
        """The projections a layer of ``config`` has."""
        return tuple(name for name in self.projections if getattr(config, self.switched.get(name, ""), True))


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
        raise UserError(
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


def read_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the softmax prior's one-pass read runs in: the inputs' own, except fp16, which cannot hold
    exp values down to e^-80 (bf16 can: it has fp32's exponent range)."""
    return torch.float32 if dtype == torch.float16 else dtype


def value_limits(beta: torch.Tensor, cap: float = EXP_ARGUMENT_CAP) -> tuple[torch.Tensor, torch.Tensor]:
    """(-cap / beta, cap / beta): the range `clip_values_for_exp` keeps."""
    limit = cap / beta
    return -limit, limit


def clip_values_for_exp(value: torch.Tensor, beta: torch.Tensor,
                        limits: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Clip values to |beta * v| <= cap, so that exp(beta v - M) stays within floating-point range. ``limits``:
    `value_limits` of ``beta``, where the caller keeps them between calls (a FEM layer's decoding steps)."""
    low, high = value_limits(beta) if limits is None else limits
    return torch.clamp(value, cast(low, value.dtype), cast(high, value.dtype))


class ExpStream(NamedTuple):
    """The values of a streaming read (FEM eq. 6, 9 under a recurrent prior) in the work dtype: ``v`` clipped to
    |beta v| <= cap (`clip_values_for_exp`), ``scaled`` = beta v, and ``for_max``, beta v detached with padding at
    -cap, so that padding never raises the running shift M."""

    v: torch.Tensor
    scaled: torch.Tensor
    for_max: torch.Tensor

    @classmethod
    def of(cls, value: torch.Tensor, beta: torch.Tensor, keep: torch.Tensor | None) -> "ExpStream":
        """``keep``: broadcastable to ``value``, False at padding (None: no padding)."""
        v = clip_values_for_exp(value, beta)
        scaled = beta * v
        for_max = scaled.detach() if keep is None else scaled.detach().masked_fill(~keep, -EXP_ARGUMENT_CAP)
        return cls(v, scaled, for_max)

    def raised_shift(self, shift: torch.Tensor, piece: slice, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(M', exp(M - M')): the running shift raised to the maximum of beta v over a chunk (``piece`` of ``dim``),
        and the factor that carries the exp stream's sums from M to M' (online-softmax style)."""
        chunk = self.for_max[(slice(None),) * dim + (piece,)]
        new_shift = torch.maximum(shift, chunk.amax(dim=dim, keepdim=shift.dim() == chunk.dim()))
        return new_shift, torch.exp(shift - new_shift)


def empty_shift(shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """M of a read that has seen nothing: -cap, below every clipped beta v."""
    return torch.full(shape, -EXP_ARGUMENT_CAP, dtype=like.dtype, device=like.device)


def exp_shift(scaled: torch.Tensor, dim: int) -> torch.Tensor:
    """M: the detached max of beta v over the keys (``dim``), the shift of exp(beta v - M) (it cancels in f_max)."""
    return scaled.detach().amax(dim=dim, keepdim=True)


def _restored(mu, shifted_partition, shift, beta, every_row_sees_a_key=False):
    """f_max = where(Z > 0, (M + log Z) / beta, mu), in fp32 or wider, cast back to mu's dtype; without the guard
    where every Z > 0 is known (three operator calls instead of six)."""
    work = work_dtype(mu.dtype)
    partition = cast(shifted_partition, work)
    if every_row_sees_a_key:
        return cast(partition.log().add_(cast(shift, work)).div_(cast(beta, work)), mu.dtype)
    positive = partition > 0
    # in place on the one new buffer: nothing here is watched by autograd (see `_RestoredFreeEnergy`)
    f_max = torch.where(positive, partition, 1.0).log_().add_(cast(shift, work)).div_(cast(beta, work))
    return cast(torch.where(positive, f_max, cast(mu, work)), mu.dtype)


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
    mu: torch.Tensor, shifted_partition: torch.Tensor, shift: torch.Tensor, beta: torch.Tensor,
    every_row_sees_a_key: bool = False,
) -> torch.Tensor:
    """f_max = beta^-1 (log E_p[exp(beta v - M)] + M), computed in fp32 (or wider), returned in mu's dtype.

    A zero partition (a row that sees no key) gives f_max = mu; the log is taken of 1 there instead, so
    its gradient is 0, not inf * 0 = NaN. The shift M is detached (it cancels exactly). ``every_row_sees_a_key``
    (a decoding step: each new token sees itself, and exp(beta v - M) >= e^-80 > 0) drops that guard where nothing
    is differentiated."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (mu, shifted_partition, beta)):
        return _RestoredFreeEnergy.apply(mu, shifted_partition, shift.detach(), beta)
    return _restored(mu, shifted_partition, shift, beta, every_row_sees_a_key)  # no autograd.Function overhead


def normalized_free_energy(numerator_v, numerator_exp, denominator, shift, beta, empty=None):
    """(mu, f_max) of a recurrent prior from its three read streams [v, exp(beta v - M), 1]: the ones
    stream is the normaliser (FEM eq. 29, Prop. 2.9), mu = num_v / den, f_max from num_exp / den. Rows
    with a zero denominator (nothing visible) or marked ``empty`` give 0, with finite gradients."""
    empty = denominator <= 0 if empty is None else (denominator <= 0) | empty
    denominator = torch.where(empty, torch.ones_like(denominator), denominator)
    mu = torch.where(empty, torch.zeros_like(numerator_v), numerator_v / denominator)
    partition = torch.where(empty, torch.zeros_like(numerator_exp), numerator_exp / denominator)
    return mu, restore_free_energy(mu, partition, shift, beta)


def inverse_softplus(value: float) -> float:
    """softplus^-1(y) = y + log(1 - e^-y), without the overflow of log(e^y - 1) for large y."""
    return value + math.log(-math.expm1(-value))


def unit_inverse_temperature(value: torch.Tensor) -> torch.Tensor:
    """beta = 1 per (head, channel) of ``value`` (batch, seq, heads, v_dim): the recurrent reads always carry the
    exp stream in their state, so without an LSE branch they read at beta = 1 and the caller drops f_max."""
    return torch.ones(value.shape[-2:], dtype=work_dtype(value.dtype), device=value.device)


def rotated_query_key(projected: dict, position_embeddings, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys, (batch, heads, seq, head_dim), from ``projected``'s q_proj and k_proj, RoPE applied."""
    batch, length, _ = projected["q_proj"].shape
    query, key = (
        projected[name].view(batch, length, -1, head_dim).transpose(1, 2) for name in ("q_proj", "k_proj")
    )
    return apply_rotary_pos_emb(query, key, *position_embeddings)


def log_decay(decay_logits: torch.Tensor, normalizer: float) -> torch.Tensor:
    """g = logsigmoid(x W_g) / normaliser <= 0, the priors' input-conditioned decay (FEM H.2, H.3)."""
    return F.logsigmoid(widened(decay_logits)) / normalizer


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


REFERENCE_GATE_NORM_EPS = 1e-5  # the public reference layer l2-normalises its outer gate with eps 1e-5


def outer_gate_activation(logits: torch.Tensor, eps: float = 1e-6, reference_eps: float | None = None) -> torch.Tensor:
    """g = RMSNorm(softplus(logits)) over the last (per-head channel) dimension, without gain (FEM §2.3.2):
    strictly positive and of unit RMS per head, so it rescales channels without distorting the norm of o.
    ``reference_eps``: the public reference layer's form instead, softplus(logits) + reference_eps l2-normalised
    (eps 1e-5) times sqrt(d_v) (`FEMConfig.public_reference_eps`)."""
    gate = F.softplus(widened(logits))
    if reference_eps is None:
        return cast(F.rms_norm(gate, gate.shape[-1:], eps=eps), logits.dtype)
    gate = F.normalize(gate + reference_eps, dim=-1, eps=REFERENCE_GATE_NORM_EPS) * gate.shape[-1] ** 0.5
    return cast(gate, logits.dtype)


@torch.no_grad()
def energy_record(mu, f_max, beta_max: Callable[[], torch.Tensor], temperature_gate) -> dict[str, torch.Tensor]:
    """A FEM layer's `EnergyTrace` entry: ``energy`` the free-energy gain F(beta_max) - mu = KL(p* || p) / beta_max
    (FEM eq. 6) per token, averaged over channels; ``temperature`` 1 / beta_max and ``inverse_temperature`` beta_max
    per channel (eq. 9; ``beta_max()`` is called here, without autograd, so that recording saves nothing for
    backward); the inner gate lambda's mean and spread per token (``temperature_gate``, eq. 10)."""
    record = {}
    if f_max is not None:
        beta = beta_max()
        record.update(energy=widened(f_max - mu).mean(dim=(-2, -1)), temperature=1 / beta, inverse_temperature=beta)
    if temperature_gate is not None:
        gate = widened(temperature_gate).flatten(-2)
        record["temperature_gate"] = gate.mean(dim=-1)  # lambda, eq. 10: (b, s)
        record["temperature_gate_std"] = gate.std(dim=-1)
    return record
