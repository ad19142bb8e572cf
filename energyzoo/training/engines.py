"""The engine a run trains with: the one `accelerate launch` was asked for (its config's ``distributed_type``), on a
GPU or on a CPU, named in the run's log, its checkpoints and its model folders.

accelerate sets up DeepSpeed and FSDP only over a device's collective backend: on a machine without a GPU it builds its
CPU state and drops either plugin without a word, and the run trains as plain data parallelism. `build_accelerator`
keeps the launcher's engine on a CPU too, over gloo (DeepSpeed's CPU accelerator needs neither oneCCL nor Intel's
extension), and refuses a run whose accelerator still ended up with another engine.

Under DeepSpeed the recipe stays the authority over what it sets (`hand_recipe_to_deepspeed`): its ``max_grad_norm``
becomes DeepSpeed's ``gradient_clipping``, and a launcher config that sets clipping, accumulation or the micro-batch
otherwise is refused. Under ZeRO-3 a parameter is an empty partition whose real shape is ``ds_shape`` (`true_shape`);
the model folders hold the full-precision master weights (`gathered_state_dict`), not the 16-bit copies the
forward pass runs on.
"""

import logging
import os
from dataclasses import asdict, dataclass

import torch
from accelerate import Accelerator
from accelerate.state import PartialState
from accelerate.utils import DistributedType, InitProcessGroupKwargs

from ..modeling.errors import UserError

logger = logging.getLogger(__name__)
# what `accelerate launch` exports for a config's distributed_type
LAUNCHER_FLAGS = {"deepspeed": "ACCELERATE_USE_DEEPSPEED", "fsdp": "ACCELERATE_USE_FSDP"}
CPU_BACKEND = "gloo"


@dataclass(frozen=True)
class Engine:
    """How a run's processes share the model: ``name`` is "deepspeed", "fsdp", "ddp" (data parallel, each process a
    whole replica) or "single"; ``stage`` the ZeRO stage or the FSDP version."""

    name: str
    stage: int | None
    world_size: int

    def describe(self) -> str:
        kind = {"deepspeed": f"DeepSpeed ZeRO-{self.stage}", "fsdp": f"FSDP{self.stage}", "ddp": "data parallel",
                "single": "one process"}[self.name]
        return kind if self.name == "single" else f"{kind} on {self.world_size} processes"

    def to_dict(self) -> dict:
        return asdict(self)


def launched_engine() -> str | None:
    """The sharded engine `accelerate launch` was asked for, or None."""
    asked = [name for name, flag in LAUNCHER_FLAGS.items() if os.environ.get(flag, "false").lower() == "true"]
    return asked[0] if asked else None


def build_accelerator(**options) -> Accelerator:
    """``Accelerator(**options)`` with the launcher's engine, on any device. The recipe's ``mixed_precision`` (in
    ``options``) decides over the launcher config's, as its clipping and accumulation do; a difference is said."""
    asked, on_gpu = launched_engine(), torch.cuda.is_available()
    handlers = list(options.pop("kwargs_handlers", None) or [])
    if asked == "deepspeed" and not on_gpu:
        handlers.append(InitProcessGroupKwargs(backend=CPU_BACKEND))
    elif asked == "fsdp" and not on_gpu:
        _fsdp_over_gloo()
    accelerator = Accelerator(cpu=not on_gpu and asked is None, kwargs_handlers=handlers, **options)
    launcher_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", options["mixed_precision"])
    if launcher_precision != options["mixed_precision"] and accelerator.is_main_process:
        logger.warning(f"the launcher's mixed_precision {launcher_precision!r} is not used: the recipe's "
                       f"training.mixed_precision {options['mixed_precision']!r} decides")
    engine = engine_of(accelerator)
    if asked is not None and engine.name != asked:
        raise UserError(f"accelerate launch asked for {asked}, but accelerate set up {engine.describe()} (a launcher "
                        f"option such as --cpu overrides it): launch without it")
    return accelerator


def _fsdp_over_gloo() -> None:
    """accelerate's `AcceleratorState` takes the FSDP plugin only for a multi-device distributed type (accelerate
    1.15), so on a CPU the state is first set up as CPU data parallelism over gloo (the launcher's ranks) and then
    labelled multi-device; FSDP2 itself shards over any backend (tests/support/sharded_training.py runs it on
    gloo). Should a later accelerate not take the label, `build_accelerator` refuses the run instead of training
    without FSDP."""
    state = PartialState(cpu=True)
    if state.distributed_type == DistributedType.MULTI_CPU:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU


def engine_of(accelerator: Accelerator) -> Engine:
    world_size, kind = accelerator.num_processes, accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED:
        zero = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
        return Engine("deepspeed", int(zero.get("stage", 0)), world_size)
    if kind == DistributedType.FSDP:
        return Engine("fsdp", accelerator.state.fsdp_plugin.fsdp_version, world_size)
    return Engine("single" if world_size == 1 else "ddp", None, world_size)


def true_shape(parameter: torch.Tensor) -> torch.Size:
    """A parameter's shape, also under ZeRO-3, where the module holds an empty partition and DeepSpeed keeps the shape
    in ``ds_shape``."""
    return getattr(parameter, "ds_shape", parameter.shape)


def hand_recipe_to_deepspeed(accelerator: Accelerator, max_grad_norm: float, accumulation: int, micro: int) -> None:
    """Give DeepSpeed the recipe's clipping, accumulation and micro-batch where its config leaves them to the script
    ("auto" or absent: accelerate would clip at 1.0, DeepSpeed's own default is no clipping), and refuse a config that
    sets them otherwise: the recipe, saved with the run, says how it was trained."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    config, wanted = plugin.deepspeed_config, {"gradient_clipping": max_grad_norm,
                                               "gradient_accumulation_steps": accumulation,
                                               "train_micro_batch_size_per_gpu": micro}
    conflicts = [f"{key} {config[key]} (the recipe's {value})" for key, value in wanted.items()
                 if config.get(key, "auto") != "auto" and config[key] != value]
    if conflicts:
        raise UserError(f"the DeepSpeed config sets {', '.join(conflicts)}: leave them 'auto' (the recipe's "
                        "training.max_grad_norm, gradient_accumulation and batch_size decide)")
    config.update(wanted)


def gathered_state_dict(accelerator: Accelerator, model) -> dict | None:
    """The whole state dict on the main process (None elsewhere under ZeRO-3; called on every process): accelerate's
    gather, with
    - DeepSpeed's float32 master weights in place of the 16-bit copies it gathers under bf16/fp16 (ZeRO-2 and ZeRO-3
      alike; frozen parameters have no master and keep their gathered value);
    - one tensor under every name of a tied parameter (FSDP and DeepSpeed gather each name on its own), which
      `save_pretrained` then saves once, as it does for an unsharded model."""
    state_dict = accelerator.get_state_dict(model)
    on_deepspeed, first_names = accelerator.distributed_type == DistributedType.DEEPSPEED, {}
    for name, parameter in accelerator.unwrap_model(model).named_parameters(remove_duplicate=False):
        if id(parameter) in first_names:
            if state_dict:
                state_dict[name] = state_dict[first_names[id(parameter)]]
            continue
        first_names[id(parameter)] = name
        if on_deepspeed:
            from deepspeed.utils import safe_get_full_fp32_param

            master = safe_get_full_fp32_param(parameter)  # a collective under ZeRO-3: every process, the same order
            if master is not None and accelerator.is_main_process:
                state_dict[name] = master.detach().cpu()
    return state_dict


def check_resumable(saved: dict | None, engine: Engine, checkpoint: str) -> None:
    """Refuse to resume a checkpoint that another engine, ZeRO stage or number of processes wrote (its sharded
    optimiser state, random states and stream positions are one per process of that run). Checkpoints from before
    engines were recorded carry none and resume as they did."""
    if saved is not None and Engine(**saved) != engine:
        raise UserError(f"{checkpoint} was written by {Engine(**saved).describe()}; this run is {engine.describe()}: "
                        "resume with the launcher config and --num_processes it was started with")


def precision_available(accelerator: Accelerator, precision: str) -> bool:
    """Whether the run can train in mixed ``precision``: accelerate's autocast where the device has it (accelerate falls
    back to float32 without a word otherwise), or DeepSpeed's own where its device accelerator has it."""
    if accelerator.state.deepspeed_plugin is None:
        return accelerator.native_amp
    from deepspeed.accelerator import get_accelerator

    device = get_accelerator()
    return {"bf16": device.is_bf16_supported, "fp16": device.is_fp16_supported}.get(precision, lambda: False)()
