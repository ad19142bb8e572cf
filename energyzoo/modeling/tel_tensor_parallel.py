"""Tensor parallelism for TEL-GPT2 (``from_pretrained(tp_plan="auto")``), whose transformers parent GPT-2 has no plan
(the plan is `TELGPT2Config.base_model_tp_plan`; `modeling_tel` registers these styles when it is imported).

GPT-2's linear maps are ``Conv1D`` (weight (in, out), the transpose of ``nn.Linear``'s, and no in/out_features),
and its attention packs q, k and v in one of them and splits the result at the full width; transformers' styles
shard ``nn.Linear``. The styles below, registered with transformers' parallel styles, split attention heads as
Llama's plan does: ``c_attn`` by output columns, q, k and v each (a process holds the same heads of all three);
``c_proj`` by input rows, summed over processes with the bias added once; and the attention splits q, k, v at the
width a process holds. The FFN stays whole on every process: TEL's entropy estimate, early exit and diagnostics
reduce over the FFN's channels (tel.txt Algorithm 1), which a column split would cut into per-process pieces. The
tied embedding and LM head are split over the vocabulary, as for Llama.
"""

import contextlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from transformers.distributed.parallel_utils import _use_local_dtensor_params
from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, TensorParallelLayer

from .errors import UserError


def _distribute(module: nn.Module, name: str, mesh, placement) -> None:
    meta = module._parameters.get(name)
    if meta is not None:
        module._parameters[name] = nn.Parameter(distribute_tensor(meta, mesh, [placement], src_data_rank=None),
                                                requires_grad=meta.requires_grad)


class PackedQKVColwise(TensorParallelLayer):
    """GPT-2's ``c_attn``: [q | k | v] columns, each split over processes (weight dim 1, bias dim 0)."""

    def should_use_local_tensors(self, module):
        return True

    def shard_param(self, module, param, mesh):
        parameter = module._parameters.get(param)
        if parameter is not None:
            _distribute(module, param, mesh, _StridedShard(dim=parameter.ndim - 1, split_factor=3))

    @contextlib.contextmanager
    def context_around_forward(self, module, mesh):
        full_width = module.nf  # Conv1D shapes its output by nf
        with _use_local_dtensor_params(module):
            module.nf = module.weight.shape[-1]
            try:
                yield
            finally:
                module.nf = full_width

    def transform_inputs_pre_forward(self, module, args, kwargs, mesh):
        # replicated input, column-split weight: the input's gradient is this process's part of a sum
        hidden = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
        return (hidden, *args[1:]), kwargs


class Conv1DRowwise(TensorParallelLayer):
    """GPT-2's attention ``c_proj``: weight split by input rows (dim 0), bias whole; the partial products of the
    processes are summed and the bias added once."""

    def should_use_local_tensors(self, module):
        return True

    def shard_param(self, module, param, mesh):
        _distribute(module, param, mesh, Replicate() if param == "bias" else Shard(0))

    @contextlib.contextmanager
    def context_around_forward(self, module, mesh):
        bias = module._parameters["bias"]
        module._parameters["bias"] = torch.zeros(bias.shape, dtype=bias.dtype, device=bias.device)  # Conv1D adds one
        try:
            with _use_local_dtensor_params(module):
                yield
        finally:
            module._parameters["bias"] = bias

    def transform_output_post_forward(self, module, output, mesh):
        summed = DTensor.from_local(output, mesh, [Partial()], run_check=False).redistribute(placements=[Replicate()])
        bias = module._parameters["bias"]
        return summed.to_local() + (bias.to_local() if isinstance(bias, DTensor) else bias)


class LocalHeads(TensorParallelLayer):
    """GPT-2's attention module: q, k, v split at the width this process holds (its heads)."""

    def install_forward(self, module, mesh):
        if module.num_heads % mesh.size():
            raise UserError(f"TEL-GPT2 tensor parallelism splits attention heads: n_head ({module.num_heads}) must "
                             f"be a multiple of the number of processes ({mesh.size()}).")
        module.split_size = module.embed_dim // mesh.size()
        return module


def register_tensor_parallel_styles() -> None:
    """Make the style names of `TELGPT2Config.base_model_tp_plan` known to transformers."""
    ALL_PARALLEL_STYLES.register("tel_gpt2_packed_qkv_colwise", PackedQKVColwise())
    ALL_PARALLEL_STYLES.register("tel_gpt2_conv1d_rowwise", Conv1DRowwise())
    ALL_PARALLEL_STYLES.register("tel_gpt2_local_heads", LocalHeads())
