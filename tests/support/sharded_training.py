"""Data-parallel training of every zoo architecture's tiny preset, sharded (torch's FSDP2, DeepSpeed ZeRO-2 and ZeRO-3)
or not.

Run under ``python -m torch.distributed.run --nproc_per_node P tests/support/sharded_training.py OUT ENGINE``
(ENGINE one of `ENGINES`): each process shards the model - FSDP2 each block of the model (the classes in its
`_no_split_modules`, what accelerate's FSDP wraps) and the root with `fully_shard`, DeepSpeed through
`deepspeed.initialize` - over gloo, trains on the p-th part of every global batch, and rank 0 saves ``{preset:
{"losses": [...], "weights": gathered full state dict}}`` to OUT. `train_unsharded` is the single-process reference:
P unsharded replicas, replica p on part p, their gradients averaged before each step - data parallelism by hand, so
that buffers (batch-norm statistics, EqT's memory) evolve per process as they do when sharded, and replica 0's state
is rank 0's. FSDP runs in float64, so that the two reductions' different summation orders stay far below what is
compared (batch norm over two 2x2 maps amplifies float32 rounding to 1e-3 in three steps); DeepSpeed refuses float64
and runs, with its reference, in float32. The optimiser is plain SGD: an update linear in the gradient keeps
float-rounding differences float-sized (Adam would blow a zero gradient's rounding noise, e.g. a softmax key bias's,
up to a full step)."""

import sys
from functools import partial

import torch
import torch.distributed as dist

import energyzoo
from energyzoo.registry import ARCHITECTURES

PRESETS = [entry.tiny_preset for entry in ARCHITECTURES.values()]
STEPS, GLOBAL_BATCH, PARTS, SEQUENCE, LEARNING_RATE = 3, 4, 2, 12, 0.01


def tiny_model(preset: str, dtype: torch.dtype = torch.float64):
    rates = energyzoo.config_from_preset(preset).to_dict().items()
    no_dropout = {key: 0.0 for key, value in rates if ("dropout" in key or "pdrop" in key) and isinstance(value, float)}
    torch.manual_seed(0)  # dropout would draw different masks in each process
    return energyzoo.model_from_preset(preset, **no_dropout).to(dtype).train()


def global_batch(model, step: int) -> dict:
    generator = torch.Generator().manual_seed(1000 + step)
    config = model.config
    if model.main_input_name == "input_ids":
        ids = torch.randint(0, config.vocab_size, (GLOBAL_BATCH, SEQUENCE), generator=generator)
        return {"input_ids": ids, "labels": ids}
    pixels = torch.randn(GLOBAL_BATCH, config.num_channels, 8, 8, generator=generator, dtype=model.dtype)
    return {"pixel_values": pixels, "labels": torch.randint(0, config.num_labels, (GLOBAL_BATCH,), generator=generator)}


def largest_difference(actual: dict, expected: dict) -> float:
    """The largest absolute difference between two state dicts' values."""
    return max(float((actual[name].double() - value.double()).abs().max()) for name, value in expected.items())


def part(batch: dict, index: int) -> dict:
    size = GLOBAL_BATCH // PARTS
    return {name: value[index * size : (index + 1) * size] for name, value in batch.items()}


def train(replicas: list, first_part: int, backward, step) -> list[float]:
    """STEPS steps of each replica on its part of every global batch: ``backward(loss)`` for each part, then
    ``step()`` (which averages the gradients over all parts and applies them); the loss of a step is the mean over all
    parts."""
    losses = []
    for step_index in range(STEPS):
        total = torch.zeros(())
        for index, model in enumerate(replicas, start=first_part):
            torch.manual_seed(step_index * PARTS + index)  # any sampling inside the model draws the same in both runs
            inputs = global_batch(getattr(model, "module", model), step_index)  # a DeepSpeed engine's model
            loss = model(**part(inputs, index)).loss
            backward(loss)
            total += loss.detach().double()
        step()
        if dist.is_initialized():
            dist.all_reduce(total)
        losses.append(float(total) / PARTS)
    return losses


def sgd_steps(models: list, average_gradients=lambda: None):
    """``(backward, step)`` for `train`: plain SGD of every model, after ``average_gradients()``."""
    optimizers = [torch.optim.SGD(model.parameters(), lr=LEARNING_RATE) for model in models]

    def step() -> None:
        average_gradients()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()

    return torch.Tensor.backward, step


def train_unsharded(preset: str, dtype: torch.dtype = torch.float64) -> dict:
    replicas = [tiny_model(preset, dtype) for _ in range(PARTS)]

    def average_gradients() -> None:
        for parameters in zip(*(model.parameters() for model in replicas)):
            mean = torch.stack([parameter.grad for parameter in parameters]).mean(0)
            for parameter in parameters:
                parameter.grad = mean.clone()

    losses = train(replicas, 0, *sgd_steps(replicas, average_gradients))
    weights = {name: value.detach().clone() for name, value in replicas[0].state_dict().items()}
    return {"losses": losses, "weights": weights}


def train_sharded(preset: str) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    model = tiny_model(preset)
    blocks = set(model._no_split_modules)
    for module in reversed(list(model.modules())):  # inner blocks before the ones holding them
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)
    losses = train([model], dist.get_rank(), *sgd_steps([model]))  # FSDP reduce-scatters the mean gradient
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"losses": losses, "weights": weights, "sharded_blocks": sorted(blocks)}


def train_deepspeed(preset: str, stage: int) -> dict:
    """DeepSpeed ZeRO-``stage`` over the same SGD, in float32 (DeepSpeed refuses float64). The model is built whole
    and partitioned by `deepspeed.initialize`, so both runs start from the same weights."""
    import deepspeed

    model = tiny_model(preset, torch.float32)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LEARNING_RATE),
                                      config={"train_micro_batch_size_per_gpu": GLOBAL_BATCH // PARTS,
                                              "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                                              "zero_optimization": {"stage": stage},
                                              "zero_allow_untested_optimizer": True})
    losses = train([engine], dist.get_rank(), engine.backward, engine.step)
    with deepspeed.zero.GatheredParameters(list(model.parameters()), enabled=stage == 3):
        weights = {name: value.detach().clone() for name, value in model.state_dict().items()}
    return {"losses": losses, "weights": weights}


def initialised_under_zero3(preset: str) -> dict:
    """The model as accelerate builds it for ZeRO-3: inside DeepSpeed's sharded initialisation, where transformers
    initialises each module with its own and its children's partitions gathered (`initialize_weights_zero3`); then
    gathered whole."""
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    zero3 = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})  # noqa: F841 (transformers holds it weakly)
    model = tiny_model(preset, torch.float32)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        return {"weights": {name: value.detach().clone() for name, value in model.state_dict().items()}}


ENGINES = {"fsdp2": train_sharded, "zero2": partial(train_deepspeed, stage=2),
           "zero3": partial(train_deepspeed, stage=3), "zero3-init": initialised_under_zero3}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    assert dist.get_world_size() == PARTS
    results = {preset: ENGINES[sys.argv[2]](preset) for preset in PRESETS}
    if dist.get_rank() == 0:
        torch.save(results, sys.argv[1])
    dist.destroy_process_group()
