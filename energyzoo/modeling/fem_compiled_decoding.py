"""A FEM layer's decoding step as one compiled region (``FEMConfig.compile_decoding``).

At batch 1 a decoding step is dispatch-bound: the gated free energy (FEM eq. 10-11), the conditioner (App. I) and the
prior's cache update are some hundred small operators per layer, each a Python call and a dispatch, so the step's time
is the number of operators, not their arithmetic (docs/speed.md has the profile). The eager layer has as few operators
as its arithmetic allows; what remains is removed by compiling the layer's block (norm, mixer, MLP) for single-token
steps without autograd, which fuses the elementwise tails into a few loops and leaves dispatch to one call.

Compiling pays only after many steps. For the quickstart's model (4 layers) on a CPU a compile took 8.6 s with a warm
compile cache and 36 s cold, against about 3 ms saved per generated token (0.8 ms per layer-step), so a first
``generate`` of 30 tokens took 8.6-36 s compiled where eager decoding takes 0.1-0.3 s. So the region compiles where it
pays: on an accelerator at once; on a CPU once the process has decoded `CPU_LAYER_STEPS_BEFORE_COMPILING` layer-steps
eagerly (about the cold compile's break-even), with one log line when it starts compiling. The environment variable
``ENERGYZOO_COMPILE_DECODING_AFTER`` sets that count for a process (0: at once, as the bench's steady decode rows
measure it).

One compiled function serves every layer of every FEM model in the process: the block is a plain function of the layer
and its own cache layer (dynamo takes a module's parameters as graph inputs, so two layers of one shape share a graph),
and the cache's length is a dynamic size, so decoding compiles once per model shape and batch size. The first
compiled step of a process pays that compile (docs/models/fem.md's speed table gives it as the first call of decode);
later steps, calls of ``generate`` and models of the same shape reuse it. Dynamo keeps a function's graphs up to
``torch._dynamo.config.recompile_limit`` (eight): a process decoding more model shapes and batch sizes than that
decodes the others eagerly, with torch's warning.

Everything else runs eagerly: prompts and any step of more than one token, training and autograd, energy
traces, ``output_attentions``, steps already under a compiler (``torch.compile`` of the whole model, transformers'
static-cache compile), distributed processes, and layers accelerate's big-model dispatch has hooked (`dispatched`).
Where compiling is impossible (no C++ compiler, an unsupported Python), the first step says so in one warning and the
process decodes eagerly. ``ENERGYZOO_EAGER_DECODING=1`` turns the region
off in a whole process, whatever the configs say (the test suite sets it; the region has tests of its own).
"""

import os
import platform
from collections.abc import Callable

import torch
from torch import nn
from torch._dynamo.exc import TorchDynamoException
from torch._inductor.exc import InductorError
from transformers.utils import logging

logger = logging.get_logger(__name__)

EAGER_DECODING_ENV = "ENERGYZOO_EAGER_DECODING"
COMPILE_AFTER_ENV = "ENERGYZOO_COMPILE_DECODING_AFTER"
CPU_LAYER_STEPS_BEFORE_COMPILING = 40_000  # ~10,000 tokens of a 4-layer model: a cold compile's break-even on a CPU


def dispatched(layer: nn.Module) -> bool:
    """Whether accelerate's big-model dispatch put hooks on the layer (``device_map``,
    ``load_checkpoint_and_dispatch``): an offloaded module's weights are loaded by its hook around its own call, and
    dynamo does not trace the hooks (accelerate disables the compiler inside them), so the region steps aside and
    the layer decodes eagerly. A block is dispatched whole (`_no_split_modules`) and every module of an offloaded one
    that holds parameters gets a hook, so the layer's own hook or its first norm's says it: two attribute lookups
    per decoding step, where walking the layer's modules cost tens of microseconds."""
    return hasattr(layer, "_hf_hook") or hasattr(layer.input_layernorm, "_hf_hook")


class CompiledDecoding:
    """``block(layer, hidden_states, **kwargs)`` compiled (``dynamic=True``: the cache's length varies), built on
    first use; after a failed compile, the eager ``block`` with one warning."""

    def __init__(self, block: Callable[..., torch.Tensor]):
        self.block = block
        self.compiled: Callable[..., torch.Tensor] | None = None
        self.unavailable: str | None = None
        self.eager_steps = 0  # layer-steps decoded eagerly in this process, before the region pays for its compile

    def pays(self, device: torch.device) -> bool:
        """Whether compiling pays by now: on an accelerator at once, on a CPU after `CPU_LAYER_STEPS_BEFORE_COMPILING`
        eager layer-steps (``ENERGYZOO_COMPILE_DECODING_AFTER`` overrides the count); counts this step otherwise."""
        if self.compiled is not None:
            return True
        setting = os.environ.get(COMPILE_AFTER_ENV, "")
        after = int(setting) if setting.isdigit() else 0 if device.type != "cpu" else CPU_LAYER_STEPS_BEFORE_COMPILING
        if self.eager_steps >= after:
            logger.warning(f"FEM: compiling the decoding step once for this process (seconds; after {self.eager_steps} "
                           "eager layer-steps, it pays from here on: energyzoo's fem_compiled_decoding)")
            return True
        self.eager_steps += 1
        return False

    def applies(self, layer: nn.Module, hidden_states: torch.Tensor, cache_layer, output_attentions: bool,
                recording: bool) -> bool:
        """Whether a call of ``layer`` is a decoding step the region takes: one token per sequence, a cache, no
        autograd, nothing recorded, not already compiling, not one process of several (whose weights may be sharded:
        tensor parallelism, FSDP), not a layer accelerate's big-model dispatch hooks (`dispatched`), the config's
        switch on and the process's not off, and compiling paying by now (`pays`)."""
        return (
            layer.self_attn.config.compile_decoding
            and hidden_states.shape[1] == 1
            and cache_layer is not None
            and not torch.is_grad_enabled()
            and not output_attentions
            and not recording
            and not torch.compiler.is_compiling()
            and not (torch.distributed.is_available() and torch.distributed.is_initialized())
            and self.unavailable is None
            and os.environ.get(EAGER_DECODING_ENV, "0") in ("", "0")
            and not dispatched(layer)
            and self.pays(hidden_states.device)
        )

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        try:
            if self.compiled is None:
                if not torch._dynamo.is_dynamo_supported():
                    raise TorchDynamoException(f"torch.compile does not support Python {platform.python_version()}")
                self.compiled = torch.compile(self.block, dynamic=True)
            return self.compiled(*args, **kwargs)
        except (TorchDynamoException, InductorError) as error:  # compiling failed before the step ran
            self.unavailable = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            logger.warning(f"FEM: compiled decoding is unavailable ({self.unavailable}); decoding eagerly. "
                           "FEMConfig(compile_decoding=False) skips the attempt.")
            return self.block(*args, **kwargs)
