"""The batch order of a training run, a pure function of (seed, step): the global batch of step s is the s-th slice
of a stream of seeded permutations of the training examples (an online task draws a fresh one), so a resumed run
sees exactly the examples it would have seen, and P processes see the same global batches as one."""

import torch

from ..modeling.errors import UserError
from .tasks import TrainingData


class BatchSchedule:
    """Indices of the global batch of every step: consecutive slices of a stream of seeded permutations."""

    def __init__(self, examples: int, batch_size: int, seed: int):
        if batch_size > examples:
            raise UserError(f"training.batch_size {batch_size} exceeds the {examples} training examples")
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self._permutations: dict[int, torch.Tensor] = {}

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._permutations:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._permutations = {epoch: torch.randperm(self.examples, generator=generator)}
        return self._permutations[epoch]

    def global_batch(self, step: int) -> torch.Tensor:
        positions = torch.arange(step * self.batch_size, (step + 1) * self.batch_size)
        epochs = positions // self.examples
        return torch.cat([self._permutation(int(epoch))[positions[epochs == epoch] % self.examples]
                          for epoch in epochs.unique()])


class ScheduledExamples(torch.utils.data.Dataset):
    """Training examples by global position, for a DataLoader that accelerate prepares: position k is example
    k mod B of the global batch of step k // B (B = ``batch_size``): a `BatchSchedule` slice of the training
    tensors, or of an online task's fresh batch. A micro-batch never straddles two steps, so ``__getitems__`` fetches
    it at once (torch's DataLoader calls it with the micro-batch's positions)."""

    def __init__(self, data: TrainingData, batch_size: int, steps: int, seed: int):
        self.data, self.batch_size, self.steps = data, batch_size, steps
        self.schedule = None if data.train_batches else BatchSchedule(len(data.train_inputs), batch_size, seed)

    def __len__(self) -> int:
        return self.steps * self.batch_size

    def __getitems__(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.as_tensor(positions)
        step, rows = int(positions[0]) // self.batch_size, positions % self.batch_size
        if self.schedule is None:
            inputs, labels = self.data.train_batches(step, self.batch_size)
            return inputs[rows], labels[rows]
        indices = self.schedule.global_batch(step)
        if self.data.remask is not None:  # the whole global batch, so every process draws the same masks
            inputs, labels = self.data.remask(step, self.data.train_inputs[indices])
            return inputs[rows], labels[rows]
        return self.data.train_inputs[indices[rows]], self.data.train_labels[indices[rows]]


def fetched_batch(batch):
    """The DataLoader's collate function: `ScheduledExamples.__getitems__` returns whole batches already."""
    return batch
