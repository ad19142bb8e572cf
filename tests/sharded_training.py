"""Data-parallel training of every zoo architecture's tiny preset, sharded with torch's FSDP2 or not.

Run under ``python -m torch.distributed.run --nproc_per_node P tests/sharded_training.py OUT``: each process
shards the blocks of the model (the classes in its `_no_split_modules`, what accelerate's FSDP wraps) and the
root with `fully_shard` (gloo on CPU), trains on the p-th part of every global batch, and rank 0 saves
``{preset: {"losses": [...], "weights": gathered full state dict}}`` to OUT. `train_unsharded` is the
single-process reference: P unsharded replicas, replica p on part p, their gradients averaged before each step -
data parallelism by hand, so that buffers (batch-norm statistics, EqT's memory) evolve per process as they do under
FSDP, and replica 0's state is rank 0's. Everything runs in float64, so that the two reductions' different summation
orders stay far below what is compared
(batch norm over two 2x2 maps amplifies float32 rounding to 1e-3 in three steps). The optimiser is plain SGD: an
update linear in the gradient keeps
float-rounding differences float-sized (Adam would blow a zero gradient's rounding noise, e.g. a softmax key bias's,
up to a full step).
"""

import sys

import torch
import torch.distributed as dist

import energyzoo
from energyzoo.registry import ARCHITECTURES

PRESETS = {
    "fem-lm-tiny": "fem",
    "tel-gpt2-tiny": "tel-gpt2",
    "tel-vit-tiny": "tel-vit",
    "tel-resnet-tiny": "tel-resnet",
    "hyperset-digits-tiny": "hyperset",
    "eqt-llama-tiny": "eqt-llama",
    "eer-induction": "eer-looped",
}
STEPS, GLOBAL_BATCH, PARTS, SEQUENCE, LEARNING_RATE = 3, 4, 2, 12, 0.01


def tiny_model(preset: str):
    rates = energyzoo.config_from_preset(preset).to_dict().items()
    no_dropout = {key: 0.0 for key, value in rates if ("dropout" in key or "pdrop" in key) and isinstance(value, float)}
    torch.manual_seed(0)  # dropout would draw different masks in each process
    return energyzoo.model_from_preset(preset, **no_dropout).double().train()


def global_batch(model, step: int) -> dict:
    generator = torch.Generator().manual_seed(1000 + step)
    config = model.config
    if model.main_input_name == "input_ids":
        ids = torch.randint(0, config.vocab_size, (GLOBAL_BATCH, SEQUENCE), generator=generator)
        return {"input_ids": ids, "labels": ids}
    pixels = torch.randn(GLOBAL_BATCH, config.num_channels, 8, 8, generator=generator, dtype=torch.float64)
    return {"pixel_values": pixels, "labels": torch.randint(0, config.num_labels, (GLOBAL_BATCH,), generator=generator)}


def part(batch: dict, index: int) -> dict:
    size = GLOBAL_BATCH // PARTS
    return {name: value[index * size : (index + 1) * size] for name, value in batch.items()}


def train(replicas: list, first_part: int, average_gradients) -> list[float]:
    """STEPS SGD steps of each replica on its part of every global batch, gradients averaged over all parts by
    ``average_gradients()``; the loss of a step is the mean over all parts."""
    optimizers = [torch.optim.SGD(model.parameters(), lr=LEARNING_RATE) for model in replicas]
    losses = []
    for step in range(STEPS):
        total = torch.zeros(())
        for index, model in enumerate(replicas, start=first_part):
            torch.manual_seed(step * PARTS + index)  # any sampling inside the model draws the same in both runs
            loss = model(**part(global_batch(model, step), index)).loss
            loss.backward()
            total += loss.detach()
        average_gradients()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        if dist.is_initialized():
            dist.all_reduce(total)
        losses.append(float(total) / PARTS)
    return losses


def train_unsharded(preset: str) -> dict:
    replicas = [tiny_model(preset) for _ in range(PARTS)]

    def average_gradients() -> None:
        for parameters in zip(*(model.parameters() for model in replicas)):
            mean = torch.stack([parameter.grad for parameter in parameters]).mean(0)
            for parameter in parameters:
                parameter.grad = mean.clone()

    losses = train(replicas, 0, average_gradients)
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
    losses = train([model], dist.get_rank(), lambda: None)  # FSDP reduce-scatters the mean gradient
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"losses": losses, "weights": weights, "sharded_blocks": sorted(blocks)}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    assert dist.get_world_size() == PARTS
    assert sorted(set(PRESETS.values())) == sorted(ARCHITECTURES), "a zoo architecture has no preset here"
    results = {preset: train_sharded(preset) for preset in PRESETS}
    if dist.get_rank() == 0:
        torch.save(results, sys.argv[1])
    dist.destroy_process_group()
