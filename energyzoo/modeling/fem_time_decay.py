"""The low-rank time-decay conditioner (TDC) of FEM (FEM App. I, eq. 33-34).

    x^_t = LN(x_t);  s_t = softplus(x^_t W_f);  u_t = x^_t W_x;  a_t = softplus(x^_t W_s)
    h~_t = sum_{i<=t} exp(-sum_{i<tau<=t} s_tau) * u_i            (eq. 33; streaming: h~_t = e^{-s_t} h~_{t-1} + u_t)
    h_t  = SiLU(norm(a_t)) * LN(h~_t);   c_t = h_t W_c             (W_c zero-initialised)
The conditioner output c_t is split into modulators (1 + c_t) of the prior's q and k, the values, the
temperature-gate logit and the outer-gate logit (eq. 34a-d).

Choices where the paper leaves room: norm(a) rescales to unit RMS (unit l2 norm times sqrt(H_c), as the
public reference does) so SiLU sees O(1) inputs; the decayed sum is evaluated chunkwise in log space
(App. I "implementation notes") instead of the f_t^-1 division, which overflows for long sequences. For weights
ported from the public reference layer, `FEMConfig.time_decay_activation` = "identity" drops the SiLU and
`time_decay_bias` adds biases to W_f, W_x, W_s, as that layer has them (App. I has neither), and
`FEMConfig.public_reference_eps` computes that layer's own numerics: norm(a) as softplus(a) + 1e-8 l2-normalised
(eps 1e-8) times sqrt(H_c), and eq. 33 as h~_t = D_t sum_{i<=t} u_i / (D_i + 1e-12) with D_t = exp(-sum_{i<=t} s_i)
(`floored_envelope`): the floor makes it a different function once the decay passes about 28 nats, so converted
weights keep their meaning only with it.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .numerics import cast, own_parameter, widened, work_dtype

REFERENCE_ENVELOPE_FLOOR = 1e-12  # the public reference layer's D + 1e-12
REFERENCE_SHORTCUT_EPS = 1e-8  # its softplus(a) + 1e-8, l2-normalised with eps 1e-8


def decayed_cumsum(
    log_decay: torch.Tensor,
    inputs: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = exp(log_decay_t) * h_{t-1} + inputs_t for every t, without a loop over positions.

    Args:
        log_decay: (batch, length, channels), <= 0.
        inputs: (batch, length, channels).
        initial_state: (batch, channels) state before the first position (a cache), or None for zeros.
        chunk_size: positions per chunk; the inner work is a masked (chunk x chunk) matrix per chunk, and
            chunk boundaries are carried by the same function one level up (recursively), so every
            exponent evaluated is <= 0 and nothing overflows, whatever the length.

    Returns:
        ``(states, final_state)``: (batch, length, channels) and (batch, channels).
    """
    batch, length, channels = inputs.shape
    work = work_dtype(inputs.dtype)
    log_decay, inputs = cast(log_decay, work), cast(inputs, work)
    chunk = max(2, min(chunk_size, length))  # chunks of one would carry their ends up forever
    num_chunks = -(-length // chunk)
    padding = num_chunks * chunk - length
    if padding:  # zero decay and zero input leave the state unchanged
        log_decay = F.pad(log_decay, (0, 0, 0, padding))
        inputs = F.pad(inputs, (0, 0, 0, padding))
    log_decay = log_decay.reshape(batch, num_chunks, chunk, channels)
    inputs = inputs.reshape(batch, num_chunks, chunk, channels)

    cumulative = log_decay.cumsum(dim=2)  # log decay from the chunk start, per position
    pairwise = cumulative[:, :, :, None, :] - cumulative[:, :, None, :, :]  # (b, n, t, i, c): decay i -> t
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=inputs.device).tril()[:, :, None]
    weights = torch.exp(pairwise.masked_fill(~causal, float("-inf")))
    within_chunk = (weights * inputs[:, :, None, :, :]).sum(dim=3)

    if initial_state is None:
        initial_state = inputs.new_zeros(batch, channels)
    initial_state = cast(initial_state, work)
    if num_chunks == 1:
        carried = initial_state[:, None]
    else:
        chunk_ends, _ = decayed_cumsum(cumulative[:, :, -1], within_chunk[:, :, -1], initial_state, chunk_size)
        carried = torch.cat([initial_state[:, None], chunk_ends[:, :-1]], dim=1)
    states = within_chunk + torch.exp(cumulative) * carried[:, :, None, :]
    states = states.reshape(batch, num_chunks * chunk, channels)[:, :length]
    return states, states[:, -1]


def decayed_step(decay_logits: torch.Tensor, inputs: torch.Tensor, state: torch.Tensor,
                 keep: torch.Tensor | None = None) -> torch.Tensor:
    """One decoding step of eq. 33, h~_t = e^{-s_t} h~_{t-1} + u_t with e^{-softplus(f)} = sigmoid(-f): (batch, 1,
    rank) from (batch, 1, rank) logits and inputs and the (batch, rank) state; a padded token (``keep`` False) leaves
    the state as it was. Five operator calls where `decayed_cumsum` takes eleven."""
    work = work_dtype(inputs.dtype)
    decay = torch.sigmoid(-cast(decay_logits, work))
    inputs = cast(inputs, work)
    if keep is not None:
        decay = torch.where(keep, decay, 1.0)
        inputs = inputs * keep
    return torch.addcmul(inputs, decay, cast(state, work)[:, None])


def floored_envelope(log_decay: torch.Tensor, inputs: torch.Tensor, initial_state: torch.Tensor | None,
                     floor: float = REFERENCE_ENVELOPE_FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    """The public reference layer's evaluation of eq. 33: D_t = exp(sum_{i<=t} log_decay_i) and
    h~_t = D_t sum_{i<=t} inputs_i / (D_i + floor). It equals eq. 33 while D_t is far above ``floor``; past that the
    floor caps 1 / D_i and old inputs fade faster than eq. 33 says. Any length: the state carried between calls is
    (the cumulative log decay, the running sum), (batch, 2, channels), so a decoding step continues the same sums.

    Returns ``(states, final_state)`` as `decayed_cumsum` does."""
    work = work_dtype(inputs.dtype)
    log_decay, inputs = cast(log_decay, work), cast(inputs, work)
    if initial_state is None:
        initial_state = inputs.new_zeros(inputs.shape[0], 2, inputs.shape[-1])
    log_start, sum_start = cast(initial_state, work).unbind(dim=1)
    cumulative = log_start[:, None] + log_decay.cumsum(dim=1)
    envelope = torch.exp(cumulative)
    sums = sum_start[:, None] + (inputs / (envelope + floor)).cumsum(dim=1)
    return envelope * sums, torch.stack([cumulative[:, -1], sums[:, -1]], dim=1)


def held_output_columns(linear: nn.Linear) -> tuple[int, slice]:
    """The full output width of ``linear`` and the columns of it this process computes: all of them, or under
    tensor parallelism (a weight sharded on its rows, as a DTensor) this process's contiguous shard."""
    mesh = getattr(linear.weight, "device_mesh", None)
    if mesh is None or linear.weight.placements[0].is_replicate():
        return linear.out_features, slice(None)
    shard = -(-linear.out_features // mesh.size())  # torch's chunking: the last shard may be shorter
    start = mesh.get_local_rank() * shard
    return linear.out_features, slice(start, min(start + shard, linear.out_features))


class TimeDecayConditioner(nn.Module):
    """FEM App. I time-decay conditioner, producing ``out_features`` modulation channels per token;
    ``reference_numerics``: the public reference layer's shortcut normalisation and envelope floor (module
    docstring)."""

    def __init__(self, hidden_size: int, rank: int, out_features: int, chunk_size: int = 8, eps: float = 1e-6,
                 activation: str = "silu", bias: bool = False, reference_numerics: bool = False):
        super().__init__()
        self.activation = F.silu if activation == "silu" else None  # None: the public reference's, no SiLU
        self.rank = rank
        self.chunk_size = chunk_size
        self.eps = eps
        self.reference_numerics = reference_numerics
        self.input_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.in_proj = nn.Linear(hidden_size, 3 * rank, bias=bias)  # [W_f | W_x | W_s] in one matmul
        self.state_norm = nn.LayerNorm(rank, eps=eps)
        # W_c as a bare parameter: zero-initialised (FEM App. K), so every modulator starts at exactly 1.
        self.out_proj = nn.Parameter(torch.zeros(rank, out_features))

    def forward(
        self,
        hidden_states: torch.Tensor,
        padding_mask: torch.Tensor | None = None,
        initial_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(h, final_state)``: the features h (batch, seq, rank) with c = h W_c, and the O(H_c)
        streaming state h~ at the last position (Prop. I.1), (batch, rank) (with the reference's numerics
        `floored_envelope`'s (batch, 2, rank)). Padded positions
        (``padding_mask`` False) neither decay nor feed the state, so a left-padded sequence conditions like
        the unpadded one."""
        decay_logits, inputs, shortcut_logits = self.in_proj(self.input_norm(hidden_states)).chunk(3, dim=-1)
        keep = None if padding_mask is None else padding_mask[..., None]
        if hidden_states.shape[1] == 1 and initial_state is not None and not self.reference_numerics:
            states = decayed_step(decay_logits, inputs, initial_state, keep)
            final_state = states[:, 0]
        else:
            log_decay = -F.softplus(widened(decay_logits))
            if keep is not None:
                log_decay = log_decay * keep
                inputs = inputs * keep
            if self.reference_numerics:
                states, final_state = floored_envelope(log_decay, inputs, initial_state)
            else:
                states, final_state = decayed_cumsum(log_decay, inputs, initial_state, self.chunk_size)
            # a tensor of its own, laid out as a decoding step's: a cache keeping the strided view would keep every
            # position's state, and compiled decoding would compile again for the other strides
            final_state = final_state.clone(memory_format=torch.contiguous_format)
        shortcut = self._normalised_shortcut(F.softplus(widened(shortcut_logits)))
        if self.activation is not None:
            shortcut = self.activation(shortcut)
        features = cast(shortcut, hidden_states.dtype) * self.state_norm(cast(states, hidden_states.dtype))
        return features, final_state

    def _normalised_shortcut(self, shortcut: torch.Tensor) -> torch.Tensor:
        """norm(a_t) of eq. 33: unit RMS, or the reference's l2 normalisation times sqrt(H_c) of softplus + 1e-8."""
        if not self.reference_numerics:
            return F.rms_norm(shortcut, (self.rank,), eps=self.eps)
        shortcut = shortcut + REFERENCE_SHORTCUT_EPS
        return F.normalize(shortcut, dim=-1, eps=REFERENCE_SHORTCUT_EPS) * self.rank**0.5

    def modulate(
        self, tensors: list[torch.Tensor], features: torch.Tensor, projections: list[nn.Linear] | None = None
    ) -> list[torch.Tensor]:
        """x_i * (1 + c_i) for consecutive column blocks c_i of c = h W_c, one per tensor (FEM eq. 34a-d).
        ``projections``, the Linear maps that gave the tensors, say which columns of each a tensor holds when the
        tensors are shards (tensor parallelism: W_c stays whole on every process, being low-rank); None when they
        are whole. (FEMAttention recomputes this and the projections in backward.)

        Under autograd c comes from one matmul and each x_i * (1 + c_i) is a new tensor. Without it (inference) each
        block c_i is computed on its own and applied to x_i in place: a full forward then allocates neither the
        (tokens x all projections) matrix c nor a second copy of each projection: fresh buffers, whose first touch
        (page faults, on CPU) costs more than this arithmetic."""
        if projections is None:
            columns = [(tensor.shape[-1], slice(None)) for tensor in tensors]
        else:
            columns = [held_output_columns(linear) for linear in projections]
        weight = cast(own_parameter(self, "out_proj"), features.dtype)  # read outside forward: an offloaded one too
        widths = [width for width, _ in columns]
        if torch.is_grad_enabled() and any(t.requires_grad for t in (weight, features, *tensors)):
            modulators = (features @ weight).split(widths, dim=-1)
        else:
            modulators = (features @ block for block in weight.split(widths, dim=-1))  # one at a time
        return [_modulated(x, modulator if held == slice(None) else modulator[..., held])
                for x, modulator, (_, held) in zip(tensors, modulators, columns, strict=True)]


    def modulate_joint(self, joint: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """x (1 + c) for all projections at once: ``joint`` holds them side by side in the column order of c (FEM
        eq. 34a-d), so one product and one multiply-add do what `modulate` does per tensor."""
        return _modulated(joint, features @ cast(own_parameter(self, "out_proj"), features.dtype))


def _modulated(x: torch.Tensor, modulator: torch.Tensor) -> torch.Tensor:
    """x (1 + c) = x + x c; in place where autograd is not watching (x is then a projection nobody else holds)."""
    modulator = cast(modulator, x.dtype)
    if torch.is_grad_enabled() and (x.requires_grad or modulator.requires_grad):
        return torch.addcmul(x, x, modulator)
    return x.addcmul_(x, modulator)
