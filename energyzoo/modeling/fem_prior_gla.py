"""The FEM read under the gated-linear-attention prior (FEM App. H.2, eq. 28-29), chunkwise in PyTorch.

    q~ = ReLU(RoPE(q)) + eps,  k~ = ReLU(RoPE(k)) + eps,  g_tau <= 0 (per head or per key channel)
    s_t(i) = exp(sum_{i<tau<=t} g_tau) <q~_t, k~_i>,   p_t(i) = s_t(i) / sum_r s_t(r)
Values are read as [v, exp(beta v - M), 1] in ONE linear-attention pass: the ones column gives the
normaliser (eq. 29, "a one-pass implementation appends a constant channel"), so
    mu = num_v / den,   f_max = beta^-1 (log(num_exp / den) + M)            (FEM eq. 6, 9)

Chunkwise form (no loop over tokens): inside a chunk the decay between positions is exp(G_t - G_i) with G
the within-chunk cumulative log decay (an exponent <= 0); across chunks a state S (key dim x value
columns) is carried by a loop over chunks, decayed by exp(G_last) and read by exp(G_t) q~_t, again
exponents <= 0, so long cumulative decays never underflow to a wrong value.

Streaming numerics: M (detached: it cancels exactly) is a running per-channel maximum of beta v, raised chunk
by chunk; when it grows, the state's exp columns are rescaled by exp(M_old - M_new) (online-softmax style).
The same code serves prefill, chunked prefill and one-token decoding, which therefore agree. Values are
clipped to |beta v| <= 40 as for the softmax prior (`fem_free_energy.clip_values_for_exp`). Padded positions
(``valid`` False) get k~ = 0 and no decay: they neither enter nor change the state.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .fem_cache import FEMRecurrentCacheLayer, fem_layer_type
from .fem_free_energy import (
    ExpStream,
    FreeEnergyRead,
    PriorSpec,
    chunk_slices,
    empty_shift,
    log_decay,
    normalized_free_energy,
    read_kernel,
    rotated_query_key,
    unit_inverse_temperature,
)
from .fem_prior_softmax import add_query_key
from .numerics import work_dtype

FLA = ("fla", "fla")  # its GPU kernel: FEMConfig.kernel's name for it, the package that has it

class FEMGLACacheLayer(FEMRecurrentCacheLayer):
    """The GLA prior's decoding state (its read's state, the conditioner's, the tokens seen)."""

    _layer_type = fem_layer_type("gla")


def add_gla_modules(layer: nn.Module, config) -> None:
    """Queries and keys (their ReLU features are the read's); the decay projection g (FEM H.2) has one decay per
    head or per key channel (``config.gla_decay``)."""
    add_query_key(layer, config)
    layer.decay_per_head = decays_per_head(config)


def decays_per_head(config) -> int:
    return config.head_dim if config.gla_decay == "channel" else 1


def gla_selection(layer, projected, position_embeddings, attention_mask, padding_mask):
    """RoPE'd queries and keys and the decay g, (batch, heads, seq, 1 or key_dim) (FEM H.2)."""
    config = layer.config
    query, key = rotated_query_key(projected, position_embeddings, layer.head_dim)
    batch, _, length, _ = query.shape
    decay = log_decay(projected["decay_proj"], config.decay_normalizer)
    decay = decay.view(batch, length, -1, layer.decay_per_head).transpose(1, 2)
    kernel = read_kernel(config.kernel, query, *FLA)
    return (query, key, decay), {"eps": config.feature_eps, "kernel": kernel, "valid": padding_mask,
                                 "chunk_size": config.prior_chunk_size}


def fla_scan(q, k, values, log_decay, state):
    """The whole sequence in one call of flash-linear-attention's GLA kernels: `chunk_gla` for a prefill,
    `fused_recurrent_gla` for one decoded token. fla (0.6) takes (batch, seq, heads, dim) where this file has
    (batch, heads, seq, dim); its default scale is key_dim^-1/2, FEM's GLA scores are the unscaled <q~, k~>
    (scale 1); its gate is per key channel (a per-head decay is broadcast) and its state (batch, heads, key_dim,
    columns) is this file's. Same recurrence: S_t = exp(g_t) S_{t-1} + k_t values_t^T, out_t = q_t S_t."""
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    kernel = fused_recurrent_gla if q.shape[2] == 1 else chunk_gla
    out, new_state = kernel(*(tensor.transpose(1, 2) for tensor in (q, k, values, log_decay.expand_as(k))),
                            scale=1.0, initial_state=state, output_final_state=True)
    return out.transpose(1, 2), new_state


def gla_features(x: torch.Tensor, eps: float) -> torch.Tensor:
    """ReLU(x) + eps: nonnegative query/key features (FEM H.2)."""
    return F.relu(x) + eps


def _linear_attention_chunk(q, k, values, log_decay, state):
    """One chunk: out_t = sum_{i<=t in chunk} exp(G_t - G_i) <q_t, k_i> values_i + exp(G_t) q_t . S_prev.

    q, k: (b, h, L, m); values: (b, h, L, c); log_decay: (b, h, L, 1 or m); state: (b, h, m, c).
    Returns (out (b, h, L, c), new state)."""
    cumulative = log_decay.cumsum(dim=2)  # G_t within the chunk, <= 0
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    if log_decay.shape[-1] == 1:  # per-head decay: a scalar factor per (t, i)
        decay = torch.exp((cumulative - cumulative.transpose(2, 3)).masked_fill(~causal, float("-inf")))
        scores = (q @ k.transpose(2, 3)) * decay
    else:  # per-channel decay: the factor depends on the key channel
        pairwise = cumulative[:, :, :, None, :] - cumulative[:, :, None, :, :]
        decay = torch.exp(pairwise.masked_fill(~causal[:, :, None], float("-inf")))
        scores = torch.einsum("bhtm,bhim,bhtim->bhti", q, k, decay)
    out = scores @ values + (q * torch.exp(cumulative)) @ state
    last = cumulative[:, :, -1:, :]
    new_state = torch.exp(last).transpose(2, 3) * state + (k * torch.exp(last - cumulative)).transpose(2, 3) @ values
    return out, new_state


def gla_free_energy_read(
    value: torch.Tensor,
    beta: torch.Tensor | None,
    query: torch.Tensor,
    key: torch.Tensor,
    log_decay: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    chunk_size: int = 64,
    eps: float = 1e-6,
    kernel: str = "torch",
) -> FreeEnergyRead:
    """FEM read (mu, f_max) under the GLA prior, with the streaming state (signature: `fem_free_energy`).

    Args:
        value: (batch, seq, heads, v_dim) values; beta: (heads, v_dim) inverse temperature (None: 1).
        query, key: (batch, heads, seq, key_dim), RoPE already applied (features are taken here).
        log_decay: (batch, heads, seq, 1) per-head or (batch, heads, seq, key_dim) per-channel g <= 0.
        valid: (batch, seq) bool, False at padding; None means all valid.
        state: ``(S, M)`` from a previous call: S (batch, heads, key_dim, 2 v_dim + 1), the decayed sums
            of k~ [v, exp(beta v - M), 1]; M (batch, heads, 1, v_dim) their exp shift. None starts empty.
        kernel: "torch" (the chunkwise form above, the reference) or "fla" (`fla_scan`: one kernel call for the
            whole sequence, with one shift M for it: the running maximum over the call, which |beta v| <= 40
            keeps exact, exp(beta v - M) >= e^-80 being a normal float32).

    Returns:
        `FreeEnergyRead` (mu, f_max shaped like value; rows with nothing visible are 0) and ``(S, M)``.
    """
    batch, length, heads, v_dim = value.shape
    out_dtype = value.dtype
    work = work_dtype(value.dtype)
    beta = (unit_inverse_temperature(value) if beta is None else beta).to(work)[None, :, None, :]
    q_features = gla_features(query.to(work), eps)
    k_features = gla_features(key.to(work), eps)
    keep = None if valid is None else valid[:, None, :, None]
    v, scaled, _ = stream = ExpStream.of(value.to(work).transpose(1, 2), beta, keep)
    log_decay = log_decay.to(work)
    if keep is not None:
        k_features = k_features * keep
        log_decay = log_decay * keep
    if state is None:
        num_state = v.new_zeros(batch, heads, query.shape[-1], 2 * v_dim + 1)
        shift = empty_shift((batch, heads, 1, v_dim), v)
    else:
        num_state, shift = (tensor.to(work) for tensor in state)
    ones = torch.ones_like(v[..., :1])

    mus, f_maxes = [], []
    scan = fla_scan if kernel == "fla" else _linear_attention_chunk
    for piece in chunk_slices(length, None if kernel == "fla" else chunk_size):
        shift, exp_rescale = stream.raised_shift(shift, piece, dim=2)
        num_state = num_state * torch.cat([torch.ones_like(shift), exp_rescale, ones[:, :, :1]], dim=-1)
        values = torch.cat([v[:, :, piece], torch.exp(scaled[:, :, piece] - shift), ones[:, :, piece]], dim=-1)
        out, num_state = scan(q_features[:, :, piece], k_features[:, :, piece], values, log_decay[:, :, piece],
                              num_state)
        mu, f_max = normalized_free_energy(*out.split([v_dim, v_dim, 1], dim=-1), shift, beta)
        mus.append(mu)
        f_maxes.append(f_max)
    mu = torch.cat(mus, dim=2).transpose(1, 2).to(out_dtype)
    f_max = torch.cat(f_maxes, dim=2).transpose(1, 2).to(out_dtype)
    return FreeEnergyRead(mu, f_max, (num_state, shift))


PRIOR = PriorSpec("gla", "H.2", ("q_proj", "k_proj", "decay_proj"), queries_and_keys=True,
                  kernels=("auto", "torch", "fla"), add_modules=add_gla_modules, selection=gla_selection,
                  read=gla_free_energy_read, cache_layers=(FEMGLACacheLayer,) * 2,
                  decay_width=lambda config: decays_per_head(config) * config.num_attention_heads, gpu_kernel=FLA)
