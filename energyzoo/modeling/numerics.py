"""Numerical plumbing every family shares: the precision that reductions, exponentials and logs run in, and the
weights a module applies, read through the module (wrapped, quantized or offloaded as it may be). Pure torch: this file
imports no family file."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

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


def recomputed_in_backward(module: nn.Module, fn, *args):
    """``fn(*args)``; when ``module`` trains under autograd, only ``args`` are kept for backward and ``fn`` runs again
    there: for cheap per-token work whose intermediates would otherwise dominate a layer's activation memory."""
    if module.training and torch.is_grad_enabled():
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def own_parameter(module: nn.Module, name: str) -> torch.Tensor:
    """``module``'s own parameter (or buffer) ``name`` with its data, for a read outside the module's forward. Where
    accelerate's big-model dispatch offloads the module (``device_map`` with CPU or disk offload, or
    ``load_checkpoint_and_dispatch``), its hook keeps the tensor on the meta device except while the module runs; the
    hook then loads it for this read and puts the module back, and the loaded tensor is returned."""
    tensor = getattr(module, name)
    hook = getattr(module, "_hf_hook", None)
    if hook is None or tensor.device.type != "meta":
        return tensor
    hook.pre_forward(module)
    try:
        return getattr(module, name)
    finally:
        hook.post_forward(module, None)


def _plain_linear(linear: nn.Module) -> bool:
    """An `nn.Linear` whose weight is a plain tensor: not wrapped (peft), not quantized (torchao's weight tensors,
    torch.ao's dynamic modules)."""
    return type(linear) is nn.Linear and type(linear.weight) is nn.Parameter


def applied_weight(linear: nn.Module, like: torch.Tensor | None = None) -> torch.Tensor:
    """The (out, in) matrix a linear map applies, read through the module so that every kind of linear map works:
    a plain `nn.Linear` gives its weight (loaded by its offload hook where dispatching keeps it on the meta device,
    `own_parameter`); any other (peft's LoRA adds W + s B A in its forward only; torchao's and torch.ao's int8
    modules hold quantized weights no product outside their forward takes) is read off its outputs on the identity,
    its bias removed, so that the matrix its forward applies also reaches the uses outside the forward (transposed, in
    norms). ``like`` gives the dtype and device of the identity (default: those of the module's first floating
    parameter with data, else float32 on the CPU)."""
    if _plain_linear(linear):
        return own_parameter(linear, "weight")
    identity = _identity(linear, like)
    return (linear(identity) - linear(torch.zeros_like(identity[:1]))).T


def applied_bias(linear: nn.Module, like: torch.Tensor | None = None) -> torch.Tensor | None:
    """The bias a linear map adds (None for a plain `nn.Linear` without one), read as `applied_weight` reads its
    matrix: any other map's output for a zero input."""
    if _plain_linear(linear):
        return None if linear.bias is None else own_parameter(linear, "bias")
    return linear(torch.zeros_like(_identity(linear, like)[:1]))[0]


def _identity(linear: nn.Module, like: torch.Tensor | None) -> torch.Tensor:
    """The identity of the map's input width, in ``like``'s dtype and device (by default those of its first floating
    parameter with data: a LoRA adapter's beside an offloaded base weight; float32 on the CPU where there is none, as
    in torch.ao's dynamic int8 modules, whose packed weights are no parameters)."""
    width = linear.in_features if hasattr(linear, "in_features") else linear.get_base_layer().in_features
    if like is None:
        like = next((parameter for parameter in linear.parameters()
                     if parameter.is_floating_point() and parameter.device.type != "meta"), torch.empty(0))
    return torch.eye(width, dtype=like.dtype, device=like.device)
