"""The FEM read under the AFT-style linear-RNN prior (FEM App. H.3, eq. 30-31), chunkwise in PyTorch.

Per value channel e, with logits k_i and an optional input-conditioned decay g_tau <= 0 (LRNN-decay):
    s_t(i) = exp(k_i + sum_{i<tau<=t} g_tau),   p_t(i) = s_t(i) / sum_{r<=t} s_t(r)
(LRNN-softmax is g = 0). Values are read as [v, exp(beta v - M), 1] under the same weights, so
    mu = num_v / den,   f_max = beta^-1 (log(num_exp / den) + M)                 (FEM eq. 6, 9)

Stabilisation ("we stabilize with k_i - max_r k_r", H.3), done online: mu_t, the running maximum of the
decayed logits k_i + G_t - G_i, obeys mu_t = max(mu_{t-1} + g_t, k_t); inside a chunk it is
a_t + max(mu_prev, cummax_i(k_i - a_i)) with a the chunk-local cumulative decay. Every weight
exp(k_i + a_t - a_i - mu_t) and the carry exp(mu_prev + a_t - mu_t) is then <= 1, and cumulative decays
over the whole sequence are never formed, so nothing overflows or underflows for long sequences. The exp
branch uses a running per-channel maximum M of beta v (detached: it cancels exactly), rescaling the state
when it grows (online-softmax style), exactly as the GLA prior does; prefill, chunked prefill and one-token
decoding share the code. Padded positions (``valid`` False) get no weight and no decay.

Kernels: none is used, by choice. The recurrence is gated linear attention with key width 1 (one head per
channel, q = 1, k = exp(k_i), gate g), which fla's fused_recurrent_gla could run; but its chunk kernels tile keys
for matrix multiplies (widths of 16 and up), a kernel call would need one exp shift for all logits of the call
(which can underflow where the online log-max above cannot: the logits are unbounded, unlike beta v), and the read
is elementwise work plus cumulative sums with no matrix multiply for a kernel to speed up.
"""

import torch
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
    unit_inverse_temperature,
)
from .numerics import work_dtype

# Logit given to padded positions: far below any real logit, yet finite so that differences stay defined.
PADDING_LOGIT = -1e4


class FEMAFTCacheLayer(FEMRecurrentCacheLayer):
    """The AFT prior's decoding state (its read's state, the conditioner's, the tokens seen)."""

    _layer_type = fem_layer_type("aft")


def add_aft_modules(layer: nn.Module, config) -> None:
    """Per-channel logits k_i (k_proj of the value width; FEM H.3); no queries: the outer gate plays their role.
    With ``aft_decay`` (LRNN-decay) the layer adds the decay g of the value width (``decay_width``)."""
    layer.k_proj = nn.Linear(config.hidden_size, config.value_width, bias=config.attention_bias)


def aft_selection(layer, projected, position_embeddings, attention_mask, padding_mask):
    """The logits k_i and, with LRNN-decay, the decay g, shaped like the values (FEM H.3)."""
    config = layer.config
    decay = None if layer.decay_proj is None else log_decay(projected["decay_proj"], config.decay_normalizer)
    return (projected["k_proj"], decay), {"valid": padding_mask, "chunk_size": config.prior_chunk_size}


def aft_free_energy_read(
    value: torch.Tensor,
    beta: torch.Tensor | None,
    logits: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    *,
    valid: torch.Tensor | None = None,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    chunk_size: int = 16,
) -> FreeEnergyRead:
    """FEM read (mu, f_max) under the AFT prior, with the streaming state (signature: `fem_free_energy`).

    Args:
        value: (batch, seq, heads, v_dim) values; beta: (heads, v_dim) inverse temperature (None: 1).
        logits: the k_i of eq. 30, one per value channel, shaped like value.
        log_decay: g <= 0 (LRNN-decay) shaped like value, or None for LRNN-softmax.
        valid: (batch, seq) bool, False at padding; None means all valid.
        state: ``(N, mu, M)`` from a previous call: N (batch, 3 channels) the weighted sums of
            [v, exp(beta v - M), 1] normalised by exp(mu); mu (batch, channels) the running log-max;
            M (batch, channels) the exp shift. None starts empty.

    Returns:
        `FreeEnergyRead` (mu, f_max shaped like value; rows with nothing visible are 0) and ``(N, mu, M)``.
    """
    shape = value.shape
    v, logits = value.flatten(2), logits.flatten(2)
    log_decay = None if log_decay is None else log_decay.flatten(2)
    beta = (unit_inverse_temperature(value) if beta is None else beta).flatten()
    batch, length, channels = v.shape
    out_dtype = v.dtype
    work = work_dtype(v.dtype)
    beta = beta.to(work)
    keep = None if valid is None else valid[..., None]
    v, scaled, _ = stream = ExpStream.of(v.to(work), beta, keep)
    logits = logits.to(work)
    log_decay = torch.zeros_like(v) if log_decay is None else log_decay.to(work)
    if keep is not None:
        logits = logits.masked_fill(~keep, PADDING_LOGIT)
        log_decay = log_decay * keep
    if state is None:
        sums = v.new_zeros(batch, 3 * channels)
        log_max = torch.full((batch, channels), float("-inf"), dtype=work, device=v.device)
        shift = empty_shift((batch, channels), v)
    else:
        sums, log_max, shift = (tensor.to(work) for tensor in state)

    mus, f_maxes = [], []
    for piece in chunk_slices(length, chunk_size):
        size = scaled[:, piece].shape[1]
        shift, exp_rescale = stream.raised_shift(shift, piece, dim=1)
        sums = torch.cat(
            [sums[:, :channels], sums[:, channels : 2 * channels] * exp_rescale, sums[:, 2 * channels :]], -1
        )
        streams = torch.cat(
            [v[:, piece], torch.exp(scaled[:, piece] - shift[:, None]), torch.ones_like(v[:, piece])], -1
        )

        local_decay = log_decay[:, piece].cumsum(dim=1)  # a_t <= 0
        adjusted = logits[:, piece] - local_decay  # k_i - a_i
        running = torch.maximum(log_max[:, None], torch.cummax(adjusted, dim=1).values)
        chunk_log_max = local_decay + running  # mu_t
        causal = torch.ones(size, size, dtype=torch.bool, device=v.device).tril()[None, :, :, None]
        exponent = adjusted[:, None, :, :] + (local_decay - chunk_log_max)[:, :, None, :]  # (b, t, i, c)
        weights = torch.exp(exponent.masked_fill(~causal, float("-inf")))
        carry = torch.exp(log_max[:, None] + local_decay - chunk_log_max)  # (b, t, c); 0 when nothing seen
        streams = streams.view(batch, size, 3, channels)  # the three streams share each channel's weights
        out = torch.einsum("btic,bisc->btsc", weights, streams) + carry[:, :, None] * sums.view(batch, 1, 3, channels)
        out = out.reshape(batch, size, 3 * channels)
        sums, log_max = out[:, -1], chunk_log_max[:, -1]

        empty = None if valid is None else ~valid[:, piece, None]
        mu, f_max = normalized_free_energy(*out.split(channels, dim=-1), shift[:, None], beta, empty)
        mus.append(mu)
        f_maxes.append(f_max)
    mu = torch.cat(mus, dim=1).to(out_dtype).view(shape)
    f_max = torch.cat(f_maxes, dim=1).to(out_dtype).view(shape)
    return FreeEnergyRead(mu, f_max, (sums, log_max, shift))


PRIOR = PriorSpec("aft", "H.3", ("k_proj", "decay_proj"), queries_and_keys=False, kernels=("auto", "torch"),
                  add_modules=add_aft_modules, selection=aft_selection, read=aft_free_energy_read,
                  cache_layers=(FEMAFTCacheLayer,) * 2, switched={"decay_proj": "aft_decay"},
                  decay_width=lambda config: config.value_width)
