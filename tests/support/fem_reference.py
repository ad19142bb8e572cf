"""Explicit float64 references for FEM, written from fem.txt and independent of energyzoo's code paths.

Every prior is built as an explicit probability table p_t(i) (O(T^2), no chunking, no streaming, no exp
shift), and the read is computed from it directly:
    mu_t = sum_i p_t(i) v_i,   f_t = beta^-1 log sum_i p_t(i) exp(beta v_i)     (FEM eq. 4, 6, 9)
`fem_layer_reference` rebuilds one whole FEM layer from a module's parameters: the time-decay conditioner
(App. I eq. 33), the (1 + c) modulation (eq. 34a-d), RoPE, the prior, the LSE branch, the lambda gate, the
outer gate and the output projection (eq. 35).

Layouts follow the reads': values (batch, seq, heads, v_dim); probability tables (batch, t, i, heads, 1)
for per-head priors and (batch, t, i, heads, v_dim) for per-channel ones. ``valid`` (batch, seq) marks real
tokens: padded keys get no weight and padded positions no decay, and padded query rows are empty (0).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

CAP = 40.0  # |beta v| <= 40 (fem.txt App. G.2; the public reference layer)


def _float64(*tensors):
    return tuple(None if t is None else t.double() for t in tensors)


def _valid(valid, batch, length):
    return torch.ones(batch, length, dtype=torch.bool) if valid is None else valid


def _normalise(scores, visible):
    """p_t(i) = s_t(i) / sum_r s_t(r) over visible keys; rows without any visible key are all 0."""
    scores = scores * visible
    total = scores.sum(dim=2, keepdim=True)
    return torch.where(total > 0, scores / torch.where(total > 0, total, 1.0), 0.0)


def _finite_row_max(log_scores):
    """Max over keys (dim 2) for stabilising exp; 0 for rows with no visible key (all -inf)."""
    top = log_scores.amax(dim=2, keepdim=True)
    return torch.where(torch.isfinite(top), top, 0.0)


def _causal_visibility(valid):
    """(batch, t, i, 1, 1): key i is real and i <= t, for real query rows t."""
    length = valid.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (causal[None] & valid[:, None, :] & valid[:, :, None])[..., None, None]


def softmax_prior(query, key, valid=None):
    """FEM H.1: softmax of q.k / sqrt(d) over visible keys; q, k (batch, heads, seq, d)."""
    query, key = _float64(query, key)
    batch, heads, length, dim = query.shape
    visible = _causal_visibility(_valid(valid, batch, length))
    scores = torch.einsum("bhtd,bhid->btih", query, key)[..., None] / math.sqrt(dim)
    scores = scores.masked_fill(~visible, float("-inf"))
    return _normalise(torch.exp(scores - _finite_row_max(scores)), visible)


def gla_prior(query, key, log_decay, valid=None, eps=1e-6):
    """FEM H.2: s_t(i) = sum_m exp(sum_{i<tau<=t} g_tau,m) q~_tm k~_im with q~ = ReLU(q) + eps (same for k);
    g (batch, heads, seq, 1 | d)."""
    query, key, log_decay = _float64(query, key, log_decay)
    batch, heads, length, dim = query.shape
    valid = _valid(valid, batch, length)
    query, key = torch.relu(query) + eps, torch.relu(key) + eps
    cumulative = (log_decay * valid[:, None, :, None]).cumsum(dim=2)  # (b, h, t, 1|m)
    pairwise = cumulative[:, :, :, None, :] - cumulative[:, :, None, :, :]  # (b, h, t, i, 1|m)
    causal = torch.ones(length, length, dtype=torch.bool).tril()[None, None, :, :, None]
    decay = torch.exp(pairwise.masked_fill(~causal, float("-inf")))
    scores = (query[:, :, :, None, :] * key[:, :, None, :, :] * decay).sum(-1)  # (b, h, t, i)
    return _normalise(scores.permute(0, 2, 3, 1)[..., None], _causal_visibility(valid))


def aft_prior(logits, log_decay=None, valid=None):
    """FEM H.3: p_t(i) proportional to exp(k_i + sum_{i<tau<=t} g_tau) per channel; logits and g shaped like
    the values (batch, seq, heads, v_dim)."""
    logits, log_decay = _float64(logits, log_decay)
    batch, length = logits.shape[:2]
    valid = _valid(valid, batch, length)
    log_decay = torch.zeros_like(logits) if log_decay is None else log_decay
    cumulative = (log_decay * valid[..., None, None]).cumsum(dim=1)
    log_scores = logits[:, None] + cumulative[:, :, None] - cumulative[:, None, :]  # (b, t, i, h, d)
    visible = _causal_visibility(valid)
    log_scores = log_scores.masked_fill(~visible, float("-inf"))
    return _normalise(torch.exp(log_scores - _finite_row_max(log_scores)), visible)


def ssm_prior(delta, generator, input_matrix, output_matrix, skip, valid=None):
    """FEM H.4: s_t(i) = exp(sum_{i<tau<=t} Delta_tau a)(C_t . B_i) Delta_i + D 1{i = t} per channel; delta
    shaped like the values, generator and skip (heads, v_dim), B and C (batch, seq, N)."""
    delta, generator, input_matrix, output_matrix, skip = _float64(delta, generator, input_matrix, output_matrix, skip)
    batch, length = delta.shape[:2]
    valid = _valid(valid, batch, length)
    delta = delta * valid[..., None, None]
    cumulative = (delta * generator).cumsum(dim=1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()[None, :, :, None, None]
    decay = torch.exp((cumulative[:, :, None] - cumulative[:, None]).masked_fill(~causal, float("-inf")))
    contraction = torch.einsum("btn,bin->bti", output_matrix, input_matrix)[..., None, None]
    diagonal = torch.eye(length, dtype=torch.float64)[None, :, :, None, None]
    scores = decay * contraction * delta[:, None] + diagonal * skip
    return _normalise(scores, _causal_visibility(valid))


@dataclass(frozen=True)
class PriorCase:
    """How the tests draw a prior's selection tensors and check them: the test side of the prior table (its product
    side is each ``fem_prior_<name>.py``'s ``PRIOR``). A new prior adds its float64 prior above and a row here.

    draw(generator, value, key_dim, gla_decay): its selection tensors (float64) for values ``value`` (batch, seq,
        heads, v_dim), in the order its read takes them.
    time_axes: the position axis of each selection tensor (None: not per position).
    stress: factors that make it sharp or fast-decaying (the long-sequence test).
    reference: its explicit float64 prior table from the same tensors (and ``valid``).
    of_layer(layer, projected, positions, valid): that table from a FEM layer's own tensors, in float64: its
        projections of the modulated input (``projected``: name -> (batch, seq, width)), parameters and config
        (FEM App. H, as `fem_layer_reference` reads a layer).
    state_shapes(config, batch): the shapes of its read's recurrent state, as its read documents them (FEM App. H);
        None for a state that grows with the sequence (keys and values).
    """

    draw: Callable[..., list[torch.Tensor]]
    time_axes: tuple[int | None, ...]
    stress: tuple[float, ...]
    reference: Callable[..., torch.Tensor]
    of_layer: Callable[..., torch.Tensor]
    state_shapes: Callable[..., list[tuple[int, ...]]] | None = None


def _draw_query_key(generator, value, key_dim, gla_decay=None):
    batch, length, heads, _ = value.shape
    tensors = [torch.randn(batch, heads, length, key_dim, generator=generator, dtype=torch.float64) for _ in "qk"]
    if gla_decay is not None:
        width = 1 if gla_decay == "head" else key_dim
        tensors.append(-torch.rand(batch, heads, length, width, generator=generator, dtype=torch.float64) * 0.5)
    return tensors


def _draw_aft(generator, value, key_dim, gla_decay):
    return [torch.randn(value.shape, generator=generator, dtype=torch.float64) * 3,
            -torch.rand(value.shape, generator=generator, dtype=torch.float64)]


def _draw_ssm(generator, value, key_dim, gla_decay, state_size=3):
    batch, length, heads, v_dim = value.shape

    def positive(*shape):
        return torch.nn.functional.softplus(torch.randn(*shape, generator=generator, dtype=torch.float64))

    return [positive(*value.shape), -positive(heads, v_dim), positive(batch, length, state_size),
            positive(batch, length, state_size), positive(heads, v_dim)]


def _per_head(layer, tensor):
    """(batch, seq, width) -> (batch, seq, heads, width / heads)."""
    return tensor.view(*tensor.shape[:2], layer.config.num_attention_heads, -1)


def _rotated(layer, projected, positions):
    """RoPE'd queries and keys, (batch, heads, seq, key_dim) (H.1-H.2)."""
    theta = layer.config.rope_parameters["rope_theta"]
    return (rope(_per_head(layer, projected[name]).transpose(1, 2), positions, theta) for name in ("q_proj", "k_proj"))


def _log_decay(layer, projected):
    """log sigmoid(decay logits) / the decay normaliser, per head (H.2-H.3); None without a decay projection."""
    if "decay_proj" not in projected:
        return None
    return _per_head(layer, torch.nn.functional.logsigmoid(projected["decay_proj"]) / layer.config.decay_normalizer)


def _softmax_of_layer(layer, projected, positions, valid):
    return softmax_prior(*_rotated(layer, projected, positions), valid)


def _gla_of_layer(layer, projected, positions, valid):
    log_decay = _log_decay(layer, projected).transpose(1, 2)
    return gla_prior(*_rotated(layer, projected, positions), log_decay, valid, layer.config.feature_eps)


def _aft_of_layer(layer, projected, positions, valid):
    return aft_prior(_per_head(layer, projected["k_proj"]), _log_decay(layer, projected), valid)


def _ssm_of_layer(layer, projected, positions, valid):
    softplus = torch.nn.functional.softplus
    heads = layer.config.num_attention_heads
    delta = softplus(projected["dt_proj"] + layer.dt_bias.double())
    input_matrix, output_matrix = softplus(projected["bc_proj"]).chunk(2, dim=-1)
    generator = -softplus(layer.ssm_generator_raw.double()).view(heads, -1)
    skip = softplus(layer.ssm_skip_raw.double()).view(heads, -1)
    return ssm_prior(_per_head(layer, delta), generator, input_matrix, output_matrix, skip, valid)


PRIOR_CASES = {
    "softmax": PriorCase(lambda generator, value, key_dim, gla_decay: _draw_query_key(generator, value, key_dim),
                         time_axes=(2, 2), stress=(50, 50), reference=softmax_prior, of_layer=_softmax_of_layer),
    "gla": PriorCase(_draw_query_key, time_axes=(2, 2, 2), stress=(1, 1, 40), reference=gla_prior,
                     of_layer=_gla_of_layer,
                     state_shapes=lambda config, batch: [
                         (batch, config.num_attention_heads, config.head_dim, 2 * config.value_head_dim + 1),
                         (batch, config.num_attention_heads, 1, config.value_head_dim)]),
    "aft": PriorCase(_draw_aft, time_axes=(1, 1), stress=(50, 20), reference=aft_prior, of_layer=_aft_of_layer,
                     state_shapes=lambda config, batch: [(batch, 3 * config.value_width),
                                                         (batch, config.value_width), (batch, config.value_width)]),
    "ssm": PriorCase(_draw_ssm, time_axes=(1, None, 1, 1, None), stress=(20, 1, 1, 1, 1), reference=ssm_prior,
                     of_layer=_ssm_of_layer,
                     state_shapes=lambda config, batch: [(batch, config.value_width, config.ssm_state_size, 3),
                                                         (batch, config.value_width)]),
}


def explicit_read(p, value, beta):
    """(mu, f): mu = E_p[v], f = beta^-1 log E_p[exp(beta v)] with v clipped to |beta v| <= 40 (so exp stays
    within float64 without any shift); rows with no probability mass read 0."""
    value, beta = _float64(value, beta)
    value = torch.maximum(torch.minimum(value, CAP / beta), -CAP / beta)
    mu = (p * value[:, None]).sum(dim=2)
    partition = (p * torch.exp(beta * value[:, None])).sum(dim=2)
    empty = p.sum(dim=2) == 0
    f = torch.log(torch.where(empty, 1.0, partition)) / beta
    return mu, torch.where(empty, 0.0, f)


def rope(x, positions, theta):
    """Rotary embedding of x (batch, heads, seq, d) at integer positions (batch, seq), written out: pairs
    (x_j, x_{j + d/2}) rotated by the angle position * theta^(-2j/d). The angles and their cos/sin are taken
    in fp32, the precision transformers' rotary embedding uses whatever the model's dtype (so float64
    comparisons can be tight); the rotation itself is float64."""
    half = x.shape[-1] // 2
    frequencies = 1.0 / theta ** (torch.arange(half, dtype=torch.float32) * 2 / x.shape[-1])
    angles = positions.float()[:, None, :, None] * frequencies
    cos, sin = torch.cos(angles).double(), torch.sin(angles).double()
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def time_decay_features(conditioner, x, valid):
    """FEM App. I: h_t = SiLU(norm(a_t)) * LN(h~_t) with h~_t = sum_{i<=t} exp(-sum_{i<tau<=t} s_tau) u_i
    (eq. 33, explicit), s = softplus(x^ W_f), u = x^ W_x, a = softplus(x^ W_s), x^ = LN(x); padded
    positions neither decay nor feed the sum. norm(a) has unit RMS."""
    norm = conditioner.input_norm
    x_hat = torch.nn.functional.layer_norm(x, x.shape[-1:], norm.weight.double(), norm.bias.double(), norm.eps)
    decay_logits, inputs, shortcut_logits = (x_hat @ conditioner.in_proj.weight.double().T).chunk(3, dim=-1)
    keep = valid[..., None].double()
    steps = torch.nn.functional.softplus(decay_logits) * keep
    inputs = inputs * keep
    cumulative = steps.cumsum(dim=1)
    length = x.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()[None, :, :, None]
    kernel = torch.exp(-(cumulative[:, :, None] - cumulative[:, None])).masked_fill(~causal, 0.0)  # K_{t,i}
    summed = (kernel * inputs[:, None]).sum(dim=2)
    shortcut = torch.nn.functional.softplus(shortcut_logits)
    shortcut = shortcut / torch.sqrt(shortcut.square().mean(-1, keepdim=True) + conditioner.eps)
    state_norm = conditioner.state_norm
    normalised = torch.nn.functional.layer_norm(summed, summed.shape[-1:], state_norm.weight.double(),
                                                state_norm.bias.double(), state_norm.eps)
    return torch.nn.functional.silu(shortcut) * normalised


def fem_layer_reference(layer, hidden, valid=None, positions=None):
    """One FEM layer (`FEMAttention` parameters) in float64 from fem.txt: returns (output, mu, f) with mu and
    f the read of the modulated values (FEM eq. 33-35). ``hidden`` (batch, seq, hidden) is the layer input."""
    config = layer.config
    x = hidden.double()
    batch, length, _ = x.shape
    valid = _valid(valid, batch, length)
    if positions is None:
        positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    heads, value_dim = config.num_attention_heads, config.value_head_dim
    projected = {}
    for name in layer.projection_names:
        linear = getattr(layer, name)
        projected[name] = x @ linear.weight.double().T + (0 if linear.bias is None else linear.bias.double())
    if layer.time_decay is not None:  # eq. 34a-d: every projection times (1 + its block of c = h W_c)
        c = time_decay_features(layer.time_decay, x, valid) @ layer.time_decay.out_proj.double()
        blocks = c.split([projected[name].shape[-1] for name in layer.projection_names], dim=-1)
        projected = {name: projected[name] * (1 + block) for name, block in zip(layer.projection_names, blocks)}

    value = _per_head(layer, projected["v_proj"])
    if config.use_lse:
        beta = torch.nn.functional.softplus(layer.beta_max_raw.double() + math.log(math.expm1(config.beta_max_init)))
        beta = beta.view(heads, value_dim)
    else:
        beta = torch.ones(heads, value_dim, dtype=torch.float64)
    p = PRIOR_CASES[config.prior].of_layer(layer, projected, positions, valid)  # FEM App. H
    mu, f = explicit_read(p, value, beta)
    if not config.use_lse:
        mixed = mu
    elif config.use_temperature_gate:
        lam = torch.sigmoid(_per_head(layer, projected["temperature_proj"]))
        mixed = (1 - lam) * mu + lam * f  # eq. 10
    else:
        mixed = f  # lambda = 1: F(beta_max), eq. 4
    if config.use_outer_gate:
        gate = torch.nn.functional.softplus(_per_head(layer, projected["outer_gate_proj"]))
        gate = gate / torch.sqrt(gate.square().mean(-1, keepdim=True) + config.rms_norm_eps)
        mixed = gate * mixed  # eq. 11
    o_proj = layer.o_proj
    output = mixed.reshape(batch, length, -1) @ o_proj.weight.double().T
    if o_proj.bias is not None:
        output = output + o_proj.bias.double()
    return output, mu, f


def public_reference_layer(state: dict, x: torch.Tensor, heads: int, prior: str = "softmax", eps: float = 1e-6,
                           cap: float = 40.0) -> torch.Tensor:
    """The public reference layer's forward (LJC-FVNR/FreeEnergyMixer `FreeEnergyMixer`, RoPE off), written from its
    equations in float64 with its key names: the conditioner without SiLU, with biases where the layer has them and
    with its envelope floor D + 1e-12, the l2-normalised shortcut and gate, beta = softplus(p) + eps, values clipped
    to |beta v| <= cap, and the causal softmax prior or (zero queries) the AFT prior's per-channel weights exp(k) of
    the query width repeated over the value width."""
    import torch.nn.functional as F

    def linear(name, inputs):
        return inputs @ state[f"{name}.weight"].T + state.get(f"{name}.bias", 0)

    def split(tensor):
        return tensor.reshape(*tensor.shape[:2], heads, -1)

    batch, length, _ = x.shape
    v, q, k = (split(linear(name, x)) for name in ("W_v", "W_q", "W_k"))
    lam, gate = linear("W_lambda", x), linear("W_gate", x) if "W_gate.weight" in state else None
    if "tdc.fwd.in_f.weight" in state:
        normed = F.layer_norm(x, x.shape[-1:], state["tdc.fwd.norm.weight"], state.get("tdc.fwd.norm.bias"), 1e-5)
        shortcut = F.softplus(linear("tdc.fwd.shortcut", normed)) + 1e-8
        shortcut = F.normalize(shortcut, dim=-1, eps=1e-8) * math.sqrt(shortcut.shape[-1])
        decay = torch.exp(torch.cumsum(-F.softplus(linear("tdc.fwd.in_f", normed)), 1))
        state_ = torch.cumsum(linear("tdc.fwd.x_f", normed) / (decay + 1e-12), 1) * decay
        hidden = shortcut * F.layer_norm(state_, state_.shape[-1:], state["tdc.fwd.ln.weight"],
                                         state.get("tdc.fwd.ln.bias"), 1e-5)
        c = hidden @ state["tdc.fwd.out_proj"]
        widths = [v.shape[-2] * v.shape[-1], q.shape[-2] * q.shape[-1], k.shape[-2] * k.shape[-1], lam.shape[-1]]
        c_v, c_q, c_k, c_lam, *c_gate = c.split(widths + ([gate.shape[-1]] if gate is not None else []), -1)
        v, q, k = v * (1 + split(c_v)), q * (1 + split(c_q)), k * (1 + split(c_k))
        lam = lam * (1 + c_lam)
        gate = gate * (1 + c_gate[0]) if gate is not None else None
    lam = split(torch.sigmoid(lam))
    beta = (F.softplus(state["_beta_param"]) + eps).view(heads, -1)
    v = torch.clamp(v, -cap / beta, cap / beta)
    if prior == "softmax":
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        mu = torch.einsum("bhij,bjhd->bihd", weights, v)
        f_max = torch.log(torch.einsum("bhij,bjhd->bihd", weights, torch.exp(beta * v))) / beta
    else:
        key = torch.exp(k.repeat(1, 1, 1, v.shape[-1] // k.shape[-1]))
        mu = torch.cumsum(key * v, 1) / torch.cumsum(key, 1)
        f_max = torch.log(torch.cumsum(key * torch.exp(beta * v), 1) / torch.cumsum(key, 1)) / beta
    out = (1 - lam) * mu + lam * f_max
    if gate is not None:
        gate = F.softplus(split(gate)) + eps
        out = out * F.normalize(gate, dim=-1, eps=1e-5) * math.sqrt(gate.shape[-1])
    return linear("W_o", out.reshape(batch, length, -1))
