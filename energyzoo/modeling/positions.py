"""Positions every family shares: which tokens are real and their positions under a padding mask, and the fixed
sinusoidal position encoding (Vaswani et al. 2017, §3.5; Hyper-SET's classifier, EER's 0.15-scaled inputs). Pure
torch: this file imports no family file."""

import math

import torch


def sinusoidal_positions(positions: torch.Tensor, width: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 1e4^(2i / width)), PE(pos, 2i + 1) = cos(...) for any integer positions (any
    shape); returns float64 (callers cast it to their dtype, so a float64 model is float64-accurate) of shape
    ``(*positions.shape, width)``, computed on the fly so that any length works."""
    frequency = torch.exp(-math.log(1e4) * torch.arange(0, width, 2, dtype=torch.float64, device=positions.device)
                          / width)
    angles = positions.double().unsqueeze(-1) * frequency
    table = torch.zeros(*positions.shape, width, dtype=torch.float64, device=positions.device)
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles[..., : width // 2])
    return table


def positions_from_mask(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
    """The position of each of the last ``length`` tokens among the real tokens of its row (0 at padding), as
    `generate` counts them: a left-padded sequence sees the positions it has alone."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -length:]


def real_tokens(attention_mask: torch.Tensor | None, inputs_embeds: torch.Tensor, dense: bool = False
                ) -> torch.Tensor | None:
    """(batch, length) bool, True at the real tokens of the chunk ``inputs_embeds`` (batch, length, ...): the last
    ``length`` columns of a 2-D padding mask. Without one (no mask, or a 4-D mask, which says nothing per token):
    None, or with ``dense`` all True."""
    batch, length = inputs_embeds.shape[:2]
    if attention_mask is not None and attention_mask.dim() == 2:
        return attention_mask[:, -length:].bool()
    return torch.ones(batch, length, dtype=torch.bool, device=inputs_embeds.device) if dense else None
