"""Numerical plumbing every family shares: the precision that reductions, exponentials and logs run in, and the
weight matrix a (possibly wrapped) linear map applies. Pure torch: this file imports no family file."""

import torch
from torch import nn

WIDE = (torch.float32, torch.float64)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precision, else the dtype itself (float64 stays float64)."""
    return dtype if dtype in WIDE else torch.promote_types(dtype, torch.float32)


def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype``. A tensor already of that dtype is returned as it is, without the call into torch that
    `Tensor.to` makes even then: a cached decoding step runs dozens of these per layer."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in `work_dtype`: half precision goes to float32, wider floats stay as they are."""
    return cast(tensor, work_dtype(tensor.dtype))


def applied_weight(linear: nn.Module, like: torch.Tensor | None = None) -> torch.Tensor:
    """The (out, in) matrix a linear map applies. A plain `nn.Linear` gives its weight; a wrapped one (peft's LoRA
    adds W + s B A in its forward only) is read off its outputs on the identity, its bias removed, so that the
    update also reaches the uses of the matrix outside the forward (transposed, in norms). ``like`` gives the dtype
    and device of the identity (default: the base weight's)."""
    if type(linear) is nn.Linear:
        return linear.weight
    weight = linear.get_base_layer().weight if hasattr(linear, "get_base_layer") else linear.weight
    like = weight if like is None else like
    identity = torch.eye(weight.shape[1], dtype=like.dtype, device=like.device)
    return (linear(identity) - linear(torch.zeros_like(identity[:1]))).T
