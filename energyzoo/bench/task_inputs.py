"""A seeded batch of a task's valid inputs and labels, for any config of the zoo: what a model that accepts the config
must run on (the fuzz tests' accepted configs, `energyzoo doctor --families`). The task's row (`registry.Task`) says
what its head reads and what its labels are."""

import torch

from ..registry import TASKS


def task_inputs(task: str, config, generator: torch.Generator, batch: int = 2, length: int = 8) -> dict:
    """Inputs and labels of ``task`` (a `registry.TASKS` key) for a model of ``config``: images of its size, or token
    ids at most its positions long (masked labels: half the tokens masked, labels there only)."""
    row = TASKS[task]
    if row.main_input == "pixel_values":
        size = config.image_size if hasattr(config, "image_size") else 16
        size = size if isinstance(size, int) else size[0]
        inputs = torch.randn(batch, config.num_channels, size, size, generator=generator)
    else:
        length = min(length, getattr(config, "max_position_embeddings", length), getattr(config, "n_positions", length))
        inputs = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
    if row.labels == "next-token":
        return {row.main_input: inputs, "labels": inputs.clone()}
    shape = (batch,) if row.labels == "sequence" else (batch, length)
    labels = torch.randint(0, getattr(config, row.label_classes), shape, generator=generator)
    if row.labels == "masked" and config.mask_token_id is not None:
        masked = torch.rand(batch, length, generator=generator) < 0.5
        inputs, labels = inputs.masked_fill(masked, config.mask_token_id), labels.masked_fill(~masked, -100)
    return {row.main_input: inputs, "labels": labels}
