"""Cumulative parity (eqt.txt §5.1.1), generated from a seed."""

import torch

PARITY_END_TOKEN = 2  # bits are tokens 0 and 1; the end token closes a sequence (and pads)



def cumulative_parity_split(examples: int, length: int, validation_fraction: float, seed: int):
    """eqt.txt §5.1.1 (eq. 44) as causal-LM data: ``examples`` random bit strings b_1..b_L followed by the end
    token, labelled so that the logits at b_t's position predict y_t = b_1 xor ... xor b_t (labels[t + 1] = y_t:
    causal LMs score the label one position ahead). Returns (train ids, train labels, validation ids, validation
    labels)."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (examples, length), generator=generator)
    ids = torch.cat([bits, torch.full((examples, 1), PARITY_END_TOKEN)], dim=1)
    labels = torch.cat([torch.full((examples, 1), -100), bits.cumsum(-1) % 2], dim=1)
    cut = examples - max(1, int(examples * validation_fraction))
    return ids[:cut], labels[:cut], ids[cut:], labels[cut:]
