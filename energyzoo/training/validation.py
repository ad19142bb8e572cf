"""Validation during training: the loss and the task's metrics over the held-out examples, shared by the processes."""

import math

import torch
from accelerate import Accelerator

from .tasks import TrainingData, TrainingTask


@torch.no_grad()
def evaluate(model, data: TrainingData, task: TrainingTask, accelerator: Accelerator, batch_size: int = 32) -> dict:
    """Validation loss and the task's metrics (the data's own, where it has them), each process on its share, summed
    over processes. Every process runs the same number of forward passes (a sharded model gathers its weights in
    each one): a process whose share is used up runs its last batches on the first example and drops the result."""
    model.eval()
    totals: dict[str, torch.Tensor] = {}

    def add(name: str, numerator, denominator) -> None:
        # a metric's numerator lives where the model ran, a count may be a Python int: both onto the device
        pair = torch.stack([torch.as_tensor(value, dtype=torch.float32, device=accelerator.device)
                            for value in (numerator, denominator)])
        totals[name] = totals.get(name, torch.zeros(2, device=accelerator.device)) + pair

    examples, processes = len(data.validation_inputs), accelerator.num_processes
    share = torch.arange(accelerator.process_index, examples, processes)
    for start in range(0, math.ceil(examples / processes), batch_size):
        chunk = share[start : start + batch_size]
        counted = len(chunk) > 0
        chunk = chunk if counted else torch.zeros(1, dtype=torch.long)
        labels = data.validation_labels[chunk].to(accelerator.device)
        inputs = data.validation_inputs[chunk].to(accelerator.device)
        outputs = model(**task.model_inputs(inputs, labels), **task.model_options)
        if counted:
            add("loss", outputs.loss * len(chunk), len(chunk))
            for name, (numerator, denominator) in (data.metrics or task.metrics)(outputs, labels).items():
                add(name, numerator, denominator)
    model.train()
    names = sorted(totals)  # the same order on every process
    reduced = accelerator.reduce(torch.stack([totals[name] for name in names]), reduction="sum")
    return {f"validation_{name}": float(pair[0] / pair[1]) for name, pair in zip(names, reduced)}
