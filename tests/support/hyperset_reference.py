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
