"""A value computed from one parameter alone, kept between calls that run without autograd.

A FEM layer turns parameters into constants on every call (beta_max = softplus(raw + offset), eq. 9): four operator
calls per layer and decoding step, for a value that changes only when the parameter does. `ParameterCache` recomputes
it only then. It holds a detached alias of the parameter it read: the alias shares the parameter's storage and version
counter, so an in-place write (an optimiser step, ``copy_``, loading into it) bumps the version it compares, and a
replaced tensor (``.to()``, loading by assignment) has another data pointer, since the held alias keeps the old
storage from being reused. Under autograd (the value must carry gradients) and under ``torch.compile`` (which cannot
trace the check, and fuses the arithmetic itself) the value is computed on every call. A parameter accelerate's
dispatch offloads is loaded by its module's hook for each call: a tensor it has not seen (another data pointer) is
computed again, and the tensor the loader hands again is the same values.
"""

from collections.abc import Callable
from typing import Any

import torch


class ParameterCache:
    """``fn(parameter)``, recomputed only when ``parameter`` was written or replaced since the last call."""

    def __init__(self, fn: Callable[[torch.Tensor], Any]):
        self.fn = fn
        self.source: torch.Tensor | None = None  # a detached alias of the parameter the value was computed from
        self.version = -1
        self.value: Any = None

    def __call__(self, parameter: torch.Tensor) -> Any:
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and parameter.requires_grad):
            return self.fn(parameter)
        source = self.source
        if (source is None or parameter._version != self.version or parameter.data_ptr() != source.data_ptr()
                or parameter.dtype != source.dtype or parameter.device != source.device):
            self.value = self.fn(parameter)
            self.source, self.version = parameter.detach(), parameter._version
        return self.value

    def forget(self) -> None:
        """Drop the value and the alias (whose storage it keeps alive), as after the parameter moved."""
        self.source = self.value = None
