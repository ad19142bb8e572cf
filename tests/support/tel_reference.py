"""A float64 oracle for the Thermodynamic Equilibrium Layer: tel.txt Algorithm 1 written out step by step, with
none of the layer's code."""

import math

import torch
import torch.nn.functional as F

from energyzoo import TELSettings

PHI = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu, "tanh": torch.tanh}


def naive_algorithm_1(anchor, settings: TELSettings, etas, tau0, training):
    """TEL Algorithm 1 written out directly (Gaussian estimator, global temperature, EMA over steps)."""
    phi = PHI[settings.tel_activation]
    low, high = math.log(settings.tel_temperature_min), math.log(settings.tel_resolved_temperature_max)
    tau = min(max(tau0, low), high)
    decay = 0.5 ** (1 / settings.tel_entropy_ema_half_life)
    y, smoothed = anchor, None
    for i in range(settings.tel_steps):
        temperature = math.exp(tau)
        force = phi(y)
        y = y - etas[i] * ((y - anchor) - temperature * force)
        if training:
            per_channel = 0.5 * torch.log(force.reshape(-1, force.shape[-1]).var(dim=0, unbiased=False) + 1e-6)
            estimate = float(per_channel.mean().clamp(-settings.tel_entropy_clip, settings.tel_entropy_clip))
            smoothed = estimate if smoothed is None else decay * smoothed + (1 - decay) * estimate
            drive = settings.tel_entropy_scale * smoothed + settings.tel_entropy_shift
            tau = min(max(tau + settings.tel_dual_step * drive, low), high)
    return y
