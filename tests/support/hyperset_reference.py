"""Float64 oracles for Hyper-SET's energies (hyperset.txt eq. 3-5), written out from the equations with none of the
layer's code."""

import math

import torch


def energy_of_projections(z: torch.Tensor) -> torch.Tensor:
    """E_ATTN as a function of the normalised per-head projections z (eq. 3-4): beta^-1 sum log sum exp(beta z.z)."""
    beta = 1 / math.sqrt(z.shape[-1])
    return torch.logsumexp(beta * z @ z.transpose(-1, -2), dim=-1).sum() / beta


def unit_gain_energies(x, layer, heads: int):
    """(E_ATTN, E_FF) per sample with the layer's weights and unit gains, written out from eq. 3-5."""
    batch, tokens, _ = x.shape
    z = (x @ layer.qkv_proj.weight.T).reshape(batch, tokens, heads, -1).transpose(1, 2)
    z = z * torch.rsqrt(z.square().mean(-1, keepdim=True))
    p = z.shape[-1]
    e_attn = math.sqrt(p) * torch.logsumexp(z @ z.transpose(-1, -2) / math.sqrt(p), -1).sum(dim=(1, 2))
    h = x @ layer.ff_proj.weight.T
    h = h * torch.rsqrt(h.square().mean(-1, keepdim=True))
    return e_attn, -0.5 * torch.relu(h).square().sum(dim=(1, 2))


def rms(x: torch.Tensor, gain: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) (* gain), eps the dtype's machine epsilon (torch's RMSNorm default)."""
    normed = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)
    return normed if gain is None else normed * gain


def sinusoid_table(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The step-size network's [sin, cos](t f_k), f_k = 1e4^(-k / (dim/2 - 1)), in float64 (App. D.1)."""
    k = torch.arange(dim // 2, dtype=torch.float64)
    angles = t.double()[:, None] * 1e4 ** (-k / (dim // 2 - 1))
    return torch.cat([angles.sin(), angles.cos()], -1)


def attention_direction(x, w, gains, heads, attention="bisoftmax", linear_scale="head_dim"):
    """W [A(q, k) v] with q, k, v the RMS-normalised per-head projections (eq. 9; App. G.1's linear attention
    phi'(q) (phi(v) phi(q)^T phi(k)) s with phi = sigmoid and s = 1/sqrt(p) or 1/sqrt(N))."""
    batch, tokens, width = x.shape
    z = (x @ w.T).reshape(batch, tokens, heads, -1).transpose(1, 2)
    q, k, v = (rms(z, gain) for gain in (gains * 3 if len(gains) == 1 else gains))
    p = z.shape[-1]
    if attention == "bisoftmax":
        scores = q @ k.transpose(-1, -2) / math.sqrt(p)
        y = (scores.softmax(-1) + scores.softmax(-2)) @ v
    else:
        s = 1 / math.sqrt(p if linear_scale == "head_dim" else tokens)
        gate = torch.sigmoid(q)
        y = (torch.sigmoid(v) @ (gate.transpose(-1, -2) @ torch.sigmoid(k)) * s) * gate * (1 - gate)
    return y.transpose(1, 2).reshape(batch, tokens, width) @ w


def feedforward_direction(x, d, gain, ff_type="standard"):
    """D act(RMSNorm(D^T x)) (eq. 11) with ReLU, or App. G.1's gated (sum phi(h)) phi'(h), phi = sigmoid."""
    h = rms(x @ d.T, gain)
    if ff_type == "standard":
        return torch.relu(h) @ d
    gate = torch.sigmoid(h)
    return (gate.sum(-1, keepdim=True) * gate * (1 - gate)) @ d


def update(mode, g, state, t, mu=0.9, eta=None, eps=1e-6):
    """The public code's adaptive_mode updates, written from its formulas: (update, state)."""
    if mode == "gd":
        return g, state
    eta = eta if eta is not None else (0.96 if mode == "adam" else 0.8)
    b, v, m = (state.get(name, torch.zeros_like(g)) for name in ("b", "v", "m"))
    if mode == "momentum":
        b = mu * b + g
        return b, {"b": b}
    v = eta * v + (1 - eta) * g**2
    if mode == "rmsprop":
        return g / (v.sqrt() + eps), {"v": v}
    if mode == "rmsprop_momentum":
        b = mu * b + g / (v.sqrt() + eps)
        return b, {"b": b, "v": v}
    m = mu * m + (1 - mu) * g
    return (m / (1 - mu**t)) / ((v / (1 - eta**t)).sqrt() + eps), {"m": m, "v": v}


def step_network(time_linears, time_gains, head, condition, c_t):
    """(alpha, gamma) = Linear(GELU([RMSNorm](c_t + [RMSNorm](condition)))) with c_t from the time path (eq. 12,
    App. D.1). ``head`` = (condition gain or None, head gain or None, out weight, out bias)."""
    condition_gain, head_gain, weight, bias = head
    if condition_gain is not None:
        condition = rms(condition, condition_gain)
    hidden = c_t + condition
    if head_gain is not None:
        hidden = rms(hidden, head_gain)
    return (torch.nn.functional.gelu(hidden) @ weight.T + bias).chunk(2, -1)


def time_path(t, dim, linears, gains):
    """c_t = Linear(GELU(Linear(sinusoid(t))) with optional RMSNorms after each (Table 6; the IC code's norms)."""
    if not linears:
        return sinusoid_table(t, dim)
    (w1, b1), (w2, b2) = linears
    g1, g2, g3 = gains
    h = sinusoid_table(t, dim) @ w1.T + b1
    h = torch.nn.functional.gelu(rms(h, g1) if g1 is not None else h)
    h = rms(h, g2) if g2 is not None else h
    h = h @ w2.T + b2
    return rms(h, g3) if g3 is not None else h
