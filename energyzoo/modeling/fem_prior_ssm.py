"""The FEM read under a nonnegative impulse-response SSM prior (FEM App. H.4, eq. 32), chunkwise.

Per value channel e, a selective (Mamba-style) state space model with state size N:
    h_t = exp(Delta_t a) h_{t-1} + Delta_t B_t u_t,   y_t = C_t . h_t + D u_t
with Delta_t = softplus(.) > 0 (per channel), B_t, C_t = softplus(.) >= 0 (per token, shared by the
channels), a = -softplus(.) < 0 and D = softplus(.) >= 0 (per channel): "softplus for (Delta, B, C, D) and
negative-softplus for the diagonal generator" (H.4). Its impulse response is nonnegative,
    s_t(i) = exp(sum_{i<tau<=t} Delta_tau a) (C_t . B_i) Delta_i + D 1{i = t}  >= 0,
and the prior is p_t(i) = s_t(i) / sum_r s_t(r), the denominator being the same scan over a ones stream.
Values are read as [v, exp(beta v - M), 1] under it in one pass (FEM eq. 6, 9).

Choice: the generator is one scalar per channel (A = a I_N, as in Mamba-2) rather than Mamba-1's
per-(channel, state) diagonal; the decay then does not depend on the state index and the chunkwise form
needs an (L x L x channels) weight per chunk instead of one per state dimension. ``N`` is configurable.

Chunkwise form: inside a chunk exp(G_t - G_i) with G the chunk-local cumulative log decay (<= 0); across
chunks a state (channels x N x 3 streams) carried by a loop over chunks with factors exp(G) <= 1. The exp
branch keeps a running per-channel maximum M (detached: it cancels exactly), rescaling the state when it
grows (online-softmax style), so prefill, chunked prefill and one-token decoding share the code and agree.
Padded positions (``valid`` False) neither enter the state nor decay it.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .fem_cache import FEMRecurrentCacheLayer, fem_layer_type
from .fem_free_energy import (
    ExpStream,
    FreeEnergyRead,
    PriorSpec,
    chunk_slices,
    empty_shift,
    inverse_softplus,
    normalized_free_energy,
    read_kernel,
    unit_inverse_temperature,
)
from .numerics import widened, work_dtype

INITIAL_STEP = 0.01  # Delta at initialisation (the middle of Mamba's [0.001, 0.1])
MAMBA = ("mamba", "mamba_ssm")  # its GPU kernel: FEMConfig.kernel's name for it, the package that has it
MAMBA_CHUNK_SIZE = 256  # Mamba-2's chunk length for its SSD kernel (speed only; the result does not depend on it)


class FEMSSMCacheLayer(FEMRecurrentCacheLayer):
    """The SSM prior's decoding state (its read's state, the conditioner's, the tokens seen)."""

    _layer_type = fem_layer_type("ssm")


def add_ssm_modules(layer: nn.Module, config) -> None:
    """Delta and B, C from the token (dt_proj, bc_proj), the step-size bias, a and D per channel (FEM H.4)."""
    width = config.value_width
    layer.dt_proj = nn.Linear(config.hidden_size, width, bias=False)
    layer.bc_proj = nn.Linear(config.hidden_size, 2 * config.ssm_state_size, bias=False)
    layer.dt_bias = nn.Parameter(torch.full((width,), inverse_softplus(INITIAL_STEP)))
    layer.ssm_generator_raw = nn.Parameter(torch.zeros(width))
    layer.ssm_skip_raw = nn.Parameter(torch.zeros(width))


def init_ssm_parameters(layer: nn.Module) -> None:
    """a and D at -softplus(0) and softplus(0), the step sizes at Delta = 0.01 (Mamba's range)."""
    init.zeros_(layer.ssm_generator_raw)
    init.zeros_(layer.ssm_skip_raw)
    init.constant_(layer.dt_bias, inverse_softplus(INITIAL_STEP))


def ssm_selection(layer, projected, position_embeddings, attention_mask, padding_mask):
    """Delta = softplus, B, C = softplus, a = -softplus, D = softplus (FEM H.4)."""
    delta = F.softplus(widened(projected["dt_proj"]) + layer.dt_bias)
    input_matrix, output_matrix = F.softplus(widened(projected["bc_proj"])).chunk(2, dim=-1)
    generator, skip = -F.softplus(layer.ssm_generator_raw), F.softplus(layer.ssm_skip_raw)
    kernel = read_kernel(layer.config.kernel, delta, *MAMBA)
    options = {"kernel": kernel, "valid": padding_mask, "chunk_size": layer.config.prior_chunk_size}
    return (delta, generator, input_matrix, output_matrix, skip), options


def ssm_free_energy_read(
    value: torch.Tensor,
    beta: torch.Tensor | None,
    delta: torch.Tensor,
    generator: torch.Tensor,
    input_matrix: torch.Tensor,
    output_matrix: torch.Tensor,
    skip: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    chunk_size: int = 16,
    kernel: str = "torch",
) -> FreeEnergyRead:
    """FEM read (mu, f_max) under the SSM prior, with the streaming state (signature: `fem_free_energy`).

    Args:
        value: (batch, seq, heads, v_dim) values; beta: (heads, v_dim) inverse temperature (None: 1).
        delta: step sizes Delta > 0 shaped like value; generator: a < 0 shaped like beta.
        input_matrix, output_matrix: (batch, seq, N) B_t and C_t, >= 0; skip: D >= 0 shaped like beta.
        valid: (batch, seq) bool, False at padding; None means all valid.
        state: ``(h, M)`` from a previous call: h (batch, channels, N, 3) the states of the streams
            [v, exp(beta v - M), 1]; M (batch, channels) the exp shift. None starts empty.
        kernel: "torch" (the chunkwise form above, the reference) or "mamba" (`mamba_scan`: one SSD kernel call
            for the whole sequence, with one shift M for it, the running maximum over the call, which
            |beta v| <= 40 keeps exact: exp(beta v - M) >= e^-80 is a normal float32).

    Returns:
        `FreeEnergyRead` (mu, f_max shaped like value; rows with nothing visible are 0) and ``(h, M)``.
    """
    shape = value.shape
    v, delta = value.flatten(2), delta.flatten(2)
    beta = unit_inverse_temperature(value) if beta is None else beta
    beta, generator, skip = beta.flatten(), generator.flatten(), skip.flatten()
    batch, length, channels = v.shape
    out_dtype = v.dtype
    work = work_dtype(v.dtype)
    beta, generator, skip = beta.to(work), generator.to(work), skip.to(work)
    keep = None if valid is None else valid[..., None]
    v, scaled, _ = stream = ExpStream.of(v.to(work), beta, keep)
    delta, input_matrix, output_matrix = delta.to(work), input_matrix.to(work), output_matrix.to(work)
    if keep is not None:
        delta = delta * keep  # no decay and no input at padding
    if state is None:
        hidden = v.new_zeros(batch, channels, input_matrix.shape[-1], 3)
        shift = empty_shift((batch, channels), v)
    else:
        hidden, shift = (tensor.to(work) for tensor in state)

    mus, f_maxes = [], []
    scan = mamba_scan if kernel == "mamba" else _chunk_scan
    for piece in chunk_slices(length, None if kernel == "mamba" else chunk_size):
        shift, exp_rescale = stream.raised_shift(shift, piece, dim=1)
        hidden = hidden * torch.stack([torch.ones_like(shift), exp_rescale, torch.ones_like(shift)], -1)[:, :, None]
        exp_stream = torch.exp(scaled[:, piece] - shift[:, None])
        streams = torch.stack([v[:, piece], exp_stream, torch.ones_like(exp_stream)], 2)
        if valid is not None:
            streams = streams * valid[:, piece, None, None]  # (b, t, 3, c)
        out, hidden = scan(streams, delta[:, piece], generator, input_matrix[:, piece], output_matrix[:, piece], skip,
                           hidden)

        empty = None if valid is None else ~valid[:, piece, None]
        mu, f_max = normalized_free_energy(*out.unbind(dim=2), shift[:, None], beta, empty)
        mus.append(mu)
        f_maxes.append(f_max)
    mu = torch.cat(mus, dim=1).to(out_dtype).view(shape)
    f_max = torch.cat(f_maxes, dim=1).to(out_dtype).view(shape)
    return FreeEnergyRead(mu, f_max, (hidden, shift))


def _chunk_scan(streams, delta, generator, input_matrix, output_matrix, skip, hidden):
    """One chunk of the scan in PyTorch: streams (b, t, 3, c) -> outputs (b, t, 3, c) and the carried state
    (b, c, N, 3), with exp(G_t - G_i) inside the chunk and the state's factor exp(G_t) across it."""
    size = streams.shape[1]
    cumulative = (delta * generator).cumsum(dim=1)  # G_t, (b, t, c) <= 0
    causal = torch.ones(size, size, dtype=torch.bool, device=streams.device).tril()[None, :, :, None]
    decay = torch.exp((cumulative[:, :, None] - cumulative[:, None]).masked_fill(~causal, float("-inf")))
    contraction = output_matrix @ input_matrix.transpose(1, 2)  # C_t . B_i, (b, t, i)
    weights = decay * contraction[..., None] * delta[:, None]  # (b, t, i, c)
    out = torch.einsum("btic,bisc->btsc", weights, streams) + skip * streams
    out = out + torch.einsum("btn,btc,bcns->btsc", output_matrix, torch.exp(cumulative), hidden)
    to_end = torch.exp(cumulative[:, -1:] - cumulative) * delta  # (b, i, c)
    hidden = torch.exp(cumulative[:, -1])[:, :, None, None] * hidden + torch.einsum(
        "bic,bin,bisc->bcns", to_end, input_matrix, streams
    )
    return out, hidden


def mamba_scan(streams, delta, generator, input_matrix, output_matrix, skip, hidden):
    """The whole sequence in one call of mamba-ssm's SSD chunk scan (`mamba_chunk_scan_combined`, the Mamba-2
    kernel, whose generator is one scalar per head as FEM's is per channel). Each value channel is one of its
    heads, and the three streams [v, exp(beta v - M), 1] are that head's three "head dims": they share the
    channel's Delta and a, so the normalising scan (the ones stream) runs in the same call. B and C are one group
    shared by all heads; D is the per-head skip. Layouts: x (b, t, heads, 3), state (b, heads, 3, N) where
    this file has (b, t, 3, c) and (b, c, N, 3). dt is passed as Delta itself (no softplus, no bias, no limit)."""
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    out, hidden = mamba_chunk_scan_combined(
        streams.transpose(2, 3), delta, generator, input_matrix[:, :, None], output_matrix[:, :, None],
        chunk_size=MAMBA_CHUNK_SIZE, D=skip, initial_states=hidden.transpose(2, 3), return_final_states=True,
    )
    return out.transpose(2, 3), hidden.transpose(2, 3)


PRIOR = PriorSpec("ssm", "H.4", ("dt_proj", "bc_proj"), queries_and_keys=False, kernels=("auto", "torch", "mamba"),
                  add_modules=add_ssm_modules, selection=ssm_selection, read=ssm_free_energy_read,
                  cache_layers=(FEMSSMCacheLayer,) * 2, replicated=("bc_proj",),
                  parameters=("dt_bias", "ssm_generator_raw", "ssm_skip_raw"), init_parameters=init_ssm_parameters,
                  gpu_kernel=MAMBA)
