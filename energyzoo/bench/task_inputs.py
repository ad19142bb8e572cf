"""A seeded batch of a task's valid inputs and labels, for any config of the zoo: what a model that accepts the config
must run on (the fuzz tests' accepted configs, `energyzoo doctor --families`)."""

import torch


def task_inputs(task: str, config, generator: torch.Generator, batch: int = 2, length: int = 8) -> dict:
    """Inputs and labels of ``task`` (a `registry.TASKS` key) for a model of ``config``: images of its size, or token
    ids at most its positions long (masked-image modelling: half the tokens masked, labels there only)."""
    if task == "image-classification":
        size = config.image_size if hasattr(config, "image_size") else 16
        size = size if isinstance(size, int) else size[0]
        return {"pixel_values": torch.randn(batch, config.num_channels, size, size, generator=generator),
                "labels": torch.randint(0, config.num_labels, (batch,), generator=generator)}
    length = min(length, getattr(config, "max_position_embeddings", length), getattr(config, "n_positions", length))
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
    classes = {"causal-lm": config.vocab_size, "token-classification": config.num_labels,
               "sequence-classification": config.num_labels,
               "masked-image-modeling": getattr(config, "codebook_size", 1)}[task]
    shape = (batch,) if task == "sequence-classification" else (batch, length)
    labels = ids.clone() if task == "causal-lm" else torch.randint(0, classes, shape, generator=generator)
    if task == "masked-image-modeling" and config.mask_token_id is not None:
        masked = torch.rand(batch, length, generator=generator) < 0.5
        ids, labels = ids.masked_fill(masked, config.mask_token_id), labels.masked_fill(~masked, -100)
    return {"input_ids": ids, "labels": labels}
