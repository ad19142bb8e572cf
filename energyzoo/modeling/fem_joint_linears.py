"""Linear maps that read one input, applied as one matrix multiply while each stays its own `nn.Linear`.

A FEM layer projects its input five to seven times (queries, keys, values, two gates, a prior's decay); at batch 1 a
decoding step is bound by the number of operator calls, not by arithmetic, so one product of the joint matrix and
views of its columns decode faster than the maps one by one, with the same arithmetic per output column. Each map
keeps its module, state-dict keys, peft target and tensor-parallel plan: checkpoints and exported folders do not
change.

How: `JointLinears.join` allocates the maps' weights (and biases) as row blocks of one tensor and points each
parameter at its block, so whatever writes a parameter in place (an optimiser step, ``load_state_dict``, ``copy_``,
initialisation) writes the joint matrix too, and the joint product reads the current weights without a copy.
Whatever replaces a parameter's tensor instead (``.to()``, transformers' loading, FSDP, DeepSpeed, tensor
parallelism, peft's wrapping) leaves it off the joint storage; the owner joins again after ``.to()`` and loading,
and `JointLinears.__call__` checks the blocks before each use, so a replaced map is never read stale: the maps then
run one by one (None). So do maps accelerate's big-model dispatch offloads: their hooks keep the weights on the meta
device and load them for each map's own call, which the joint product would not make. Under autograd the product
uses the concatenated weights (one copy, which autograd splits back into each map's gradient); under
``torch.compile`` the maps run one by one (the check reads data pointers, which dynamo cannot trace, and inductor
compiles the maps' products itself).

State dicts: blocks of one storage are what accelerate's and transformers' savers take for tied weights (accelerate
drops all but one of them), so `cloned_blocks` gives a state dict the maps' own copies.

`JointlyProjectedModule` is the lifecycle a module owning such maps needs (join after construction, copying,
converting and loading; cloned blocks in its state dict); a model joins its layers again after transformers' loading
and tying (`join_projections_in`).
"""

import torch
import torch.nn.functional as F
from torch import nn


class JointLinears:
    """The maps ``names`` of an owner module (all `nn.Linear` of one input width), in that order of output columns."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.weight: torch.Tensor | None = None  # (sum of out_features, in_features), the blocks in ``names`` order
        self.bias: torch.Tensor | None = None  # None when no map has a bias; zero rows for maps without one
        self.widths: list[int] = []  # the maps' output widths
        # per map: the byte offsets of its weight and bias (or None) in the joint tensors (offsets, not addresses: a
        # deep copy or a pickled model keeps its parameters' blocks of its own copy of the joint tensors)
        self.blocks: list[tuple[int, int | None]] = []

    def linears(self, owner: nn.Module) -> list[nn.Module]:
        """The owner's current maps (read from its module table: a map may have been replaced or wrapped)."""
        return [owner._modules[name] for name in self.names]

    def join(self, owner: nn.Module) -> None:
        """Move the maps' current weights and biases into joint tensors and point each parameter at its block. Maps
        that are not plain ``nn.Linear`` with plain parameters of their own storage (wrapped, sharded, partitioned,
        or views of another framework's buffer) are left alone, and the joint product is then not used."""
        linears = self.linears(owner)
        if self.joined(linears):
            return
        self.widths = [linear.out_features for linear in linears]
        weights = [linear.weight for linear in linears] if all(type(linear) is nn.Linear for linear in linears) else []
        biases = [linear.bias for linear in linears if linear.bias is not None]
        movable = weights and all(_movable(tensor, (self.weight, self.bias)) and tensor.dtype == weights[0].dtype
                                  and tensor.device == weights[0].device for tensor in (*weights, *biases))
        self.weight = self.bias = None
        self.blocks = []
        if not movable:
            return
        with torch.no_grad():
            weight = torch.cat(weights)
            bias = torch.cat([_bias_or_zeros(linear) for linear in linears]) if biases else None
        rows = 0
        for linear in linears:
            linear.weight.data = weight[rows:rows + linear.out_features]
            if linear.bias is not None:
                linear.bias.data = bias[rows:rows + linear.out_features]
            self.blocks.append((linear.weight.data_ptr() - weight.data_ptr(),
                                None if linear.bias is None else linear.bias.data_ptr() - bias.data_ptr()))
            rows += linear.out_features
        self.weight, self.bias = weight, bias

    def __call__(self, owner: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """x through every map, as one (..., sum of out_features) tensor; None where the maps must run one by one."""
        if torch.compiler.is_compiling():
            return None
        linears = self.linears(owner)
        if torch.is_grad_enabled() and any(parameter.requires_grad for linear in linears
                                           for parameter in linear.parameters()):
            if not all(_whole_plain_linear(linear) for linear in linears):
                return None
            bias = None
            if any(linear.bias is not None for linear in linears):
                bias = torch.cat([_bias_or_zeros(linear) for linear in linears])
            return F.linear(x, torch.cat([linear.weight for linear in linears]), bias)
        if not self.joined(linears):
            return None
        return F.linear(x, self.weight, self.bias)

    def joined(self, linears: list[nn.Module]) -> bool:
        """Whether every map's weight and bias are still their blocks of the joint tensors. A data pointer inside the
        joint storage, which this object keeps alive, is that storage: nothing else can be allocated there."""
        if self.weight is None:
            return False
        weight_base = self.weight.data_ptr()
        bias_base = None if self.bias is None else self.bias.data_ptr()
        for linear, (weight_at, bias_at) in zip(linears, self.blocks, strict=True):
            if type(linear) is not nn.Linear:
                return False
            weight, bias = linear._parameters["weight"], linear._parameters["bias"]
            if type(weight) is not nn.Parameter or weight.data_ptr() != weight_base + weight_at:
                return False
            if (bias is None) != (bias_at is None) or (bias is not None and (
                    type(bias) is not nn.Parameter or bias.data_ptr() != bias_base + bias_at)):
                return False
        return True

    def cloned_blocks(self, owner: nn.Module, state_dict: dict, prefix: str) -> None:
        """Give the maps' entries of ``state_dict`` (keys under ``prefix``) storage of their own."""
        if self.weight is None:
            return
        for name in self.names:
            for suffix in ("weight", "bias"):
                key = f"{prefix}{name}.{suffix}"
                if key in state_dict and _shares(state_dict[key], self.weight if suffix == "weight" else self.bias):
                    state_dict[key] = state_dict[key].clone()


class JointlyProjectedModule(nn.Module):
    """A module whose maps ``projection_names`` read one input and run as one product (`JointLinears`)."""

    def join_projections(self, names: list[str]) -> None:
        """Join the maps ``names`` (call once they all exist), and keep them joined whatever replaces their tensors."""
        self.projection_names = list(names)
        self.joint_projections = JointLinears(self.projection_names)
        self.joint_projections.join(self)
        self._register_state_dict_hook(_cloned_blocks)
        self.register_load_state_dict_post_hook(_joined_again)

    def __setstate__(self, state):
        """As `nn.Module.__setstate__` (unpickling, ``copy.deepcopy``), then the maps joined again: a deep copy gives
        each parameter a tensor of its own."""
        super().__setstate__(state)
        self.joint_projections.join(self)

    def _apply(self, fn, recurse=True):
        """As `nn.Module._apply` (``.to()``, ``.double()``, ...), then the maps joined again: converting gives each
        parameter a tensor of its own; `parameters_replaced` then drops what was computed from the old ones."""
        result = super()._apply(fn, recurse)
        self.joint_projections.join(self)
        self.parameters_replaced()
        return result

    def parameters_replaced(self) -> None:
        """Forget values kept from parameters that ``_apply`` replaced (a subclass's caches); nothing here."""

    def projected(self, hidden_states: torch.Tensor, modulator=None, features=None) -> list[torch.Tensor]:
        """Every map of ``hidden_states``, modulated by ``modulator`` with its ``features`` (a `TimeDecayConditioner`;
        None: unmodulated): one product of the joint matrix where the maps allow it, else map by map."""
        joint = self.joint_projections(self, hidden_states)
        if joint is not None:
            if features is not None:
                joint = modulator.modulate_joint(joint, features)
            parts = joint.split(self.joint_projections.widths, dim=-1)
            # under autograd, a saved view would keep the whole joint tensor (queries and keys too) until backward
            return [part.contiguous() for part in parts] if torch.is_grad_enabled() else list(parts)
        linears = self.joint_projections.linears(self)
        projections = [linear(hidden_states) for linear in linears]
        return projections if features is None else modulator.modulate(projections, features, linears)


def join_projections_in(model: nn.Module) -> None:
    """Join the maps of every `JointlyProjectedModule` of ``model`` again (after loading or tying replaced them)."""
    for module in model.modules():
        if isinstance(module, JointlyProjectedModule):
            module.joint_projections.join(module)


def _cloned_blocks(module: JointlyProjectedModule, state_dict: dict, prefix: str, local_metadata) -> None:
    """The state-dict hook: the joint maps' blocks as tensors of their own."""
    module.joint_projections.cloned_blocks(module, state_dict, prefix)


def _joined_again(module: JointlyProjectedModule, incompatible_keys) -> None:
    """The load-state-dict hook: loading by assignment gives each parameter a tensor of its own."""
    module.joint_projections.join(module)


def _movable(tensor: torch.Tensor, joint: tuple[torch.Tensor | None, ...]) -> bool:
    """A plain parameter whose storage is its own or one of the ``joint`` tensors (not a block of a framework's flat
    buffer)."""
    return (type(tensor) is nn.Parameter and tensor.is_contiguous() and tensor.device.type != "meta"
            and (tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
                 or any(_shares(tensor, held) for held in joint)))


def _whole_plain_linear(linear: nn.Module) -> bool:
    """A plain ``nn.Linear`` whose weight is a plain tensor of its full shape here (not a DTensor shard, not a
    parameter DeepSpeed has partitioned away until the module's own forward gathers it, not one accelerate's
    dispatch offloads: its hook loads it for the module's own call only, and keeps the meta device between calls)."""
    return (type(linear) is nn.Linear and type(linear.weight) is nn.Parameter and not hasattr(linear, "_hf_hook")
            and linear.weight.shape == (linear.out_features, linear.in_features))


def _bias_or_zeros(linear: nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias
    return torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)


def _shares(tensor: torch.Tensor | None, joint: torch.Tensor | None) -> bool:
    """Whether ``tensor`` lies in ``joint``'s storage; never for a tensor subclass without one of its own (a DTensor
    shard of FSDP or tensor parallelism, whose state dict this is asked about too)."""
    return (type(tensor) in (torch.Tensor, nn.Parameter) and joint is not None and tensor.device == joint.device
            and tensor.untyped_storage().data_ptr() == joint.untyped_storage().data_ptr())
