"""The induction-head task on the full sequence (Sanford, Hsu & Telgarsky, ICML 2024, `InductionHopsFullSequenceTask`
with one hop and 4 symbols): the format eer.txt §5.1 trains on, which the paper never spells out
(chosen because App. C's epoch-0 accuracies are what a blank + uniform guess scores on it).

A sequence s_1..s_{L-1} of the symbols a-d (ids 1-4) without immediate repeats; the label of s_k is the symbol that
followed the previous occurrence of s_k, y_k = s_{j+1} with j = max{j < k : s_j = s_k}, or NONE (5) when s_k has not
occurred before. Layout of L positions: ``input_ids = [HOP, s_1..s_{L-1}]``, ``labels = [BLANK, y_1..y_{L-1}]``
(aligned: label p answers input p). Accuracy counts every position, BLANK and NONE included; the induction accuracy
only the positions with a previous occurrence.

Generation is vectorised and a pure function of its seed: `induction_batch` (tensors), `induction_dataset` (a
`datasets.Dataset` of one length) and `induction_stream` (a `datasets.IterableDataset` of fresh sequences, one
length per group, for `Trainer`).
"""

import numpy as np
import torch

from ..modeling.errors import UserError

HOP, NONE, BLANK, PAD = 0, 5, 6, 7
SYMBOLS = 4  # a-d, ids 1..4
VOCABULARY = 8  # with PAD, so that mixed lengths can be padded


def induction_batch(batch: int, length: int, seed: int | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels), each (batch, length), of ``batch`` fresh sequences of L = ``length`` positions (``seed``:
    numpy's seed, an integer or a list of them)."""
    if length < 2:
        raise UserError(f"an induction sequence needs length >= 2 (HOP and one symbol), got {length}")
    rng = np.random.default_rng(seed)
    count = length - 1
    # s_1 uniform; each later symbol uniform over the 3 others: add 1-3 (mod 4) to the previous one
    steps = np.concatenate([rng.integers(0, SYMBOLS, (batch, 1)), rng.integers(1, SYMBOLS, (batch, count - 1))], axis=1)
    symbols = np.cumsum(steps, axis=1) % SYMBOLS
    previous = previous_occurrences(symbols)
    following = np.take_along_axis(symbols, np.clip(previous + 1, 0, count - 1), axis=1) + 1
    targets = np.where(previous >= 0, following, NONE)
    input_ids = np.concatenate([np.full((batch, 1), HOP), symbols + 1], axis=1)
    labels = np.concatenate([np.full((batch, 1), BLANK), targets], axis=1)
    return torch.from_numpy(input_ids).long(), torch.from_numpy(labels).long()


def previous_occurrences(symbols: np.ndarray) -> np.ndarray:
    """For every k of each row, j = max{j < k : s_j = s_k}, or -1 where s_k has not occurred before."""
    index = np.arange(symbols.shape[1])
    previous = np.full(symbols.shape, -1)
    for symbol in np.unique(symbols):  # a running max of the indices where the symbol occurs
        seen = np.maximum.accumulate(np.where(symbols == symbol, index, -1), axis=1)
        last_before = np.concatenate([np.full((len(symbols), 1), -1), seen[:, :-1]], axis=1)
        previous = np.where(symbols == symbol, last_before, previous)
    return previous


def occurrence_gaps(input_ids: torch.Tensor) -> torch.Tensor:
    """Per position of `induction_batch`'s inputs, k - j to the previous occurrence of the same symbol (0 at HOP
    and where the symbol has not occurred before)."""
    previous = previous_occurrences(input_ids[:, 1:].numpy())
    gaps = np.where(previous >= 0, np.arange(previous.shape[1]) - previous, 0)
    return torch.from_numpy(np.concatenate([np.zeros((len(gaps), 1), dtype=gaps.dtype), gaps], axis=1))


def last_symbols_accuracy(input_ids: torch.Tensor, labels: torch.Tensor, window: int) -> float:
    """Expected accuracy of the predictor that sees only the last ``window`` symbols: right at HOP (BLANK), right
    where the previous occurrence is inside the window (gap < window: the symbol after it is visible too), a uniform
    guess among the 3 other symbols (1/3) at the other induction positions, and NONE only where the whole prefix is
    visible (else it guesses a symbol: 0). A reference line for how local a learned rule is."""
    gaps = occurrence_gaps(input_ids)
    position = torch.arange(labels.shape[1]).expand_as(labels)
    induction = (labels >= 1) & (labels <= SYMBOLS)
    correct = ((labels == BLANK).float() + (induction & (gaps < window)).float()
               + (induction & (gaps >= window)).float() / 3 + ((labels == NONE) & (position <= window)).float())
    return float(correct.mean())


def training_length(seed: int, step: int, lengths: tuple[int, int], curriculum_steps: int = 0) -> int:
    """L of the batch of ``step``: uniform in [min, max] (eer.txt Table 1's 16-64), a function of (seed, step); with
    ``curriculum_steps`` > 0 the max grows linearly from min to max over those steps (a length curriculum, which the
    paper neither states nor excludes)."""
    low, high = lengths
    if curriculum_steps:
        high = low + round((high - low) * min(1.0, step / curriculum_steps))
    return int(np.random.default_rng([seed, step, 0]).integers(low, high + 1))


def training_batch(seed: int, step: int, batch: int, lengths: tuple[int, int],
                   curriculum_steps: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The fresh global batch of a training step, one length for the batch (no padding), reproducible from
    (seed, step) so that resumed and multi-process runs see the same data."""
    return induction_batch(batch, training_length(seed, step, lengths, curriculum_steps), seed=[seed, step, 1])


def induction_dataset(examples: int, length: int, seed: int):
    """A `datasets.Dataset` of ``examples`` sequences of one length (columns ``input_ids``, ``labels``), e.g. the
    evaluation sets at L = 10, 100, 1000."""
    from datasets import Dataset

    input_ids, labels = induction_batch(examples, length, seed)
    return Dataset.from_dict({"input_ids": input_ids.tolist(), "labels": labels.tolist()})


def induction_stream(lengths: tuple[int, int] = (16, 64), group: int = 32, seed: int = 0):
    """An endless `datasets.IterableDataset` of fresh sequences: groups of ``group`` sequences share a length drawn
    in ``lengths``, so a `Trainer` with ``per_device_train_batch_size=group`` batches one length at a time."""
    from datasets import IterableDataset

    def generate(seed: int):
        step = 0
        while True:
            input_ids, labels = training_batch(seed, step, group, lengths)
            for ids, targets in zip(input_ids.tolist(), labels.tolist()):
                yield {"input_ids": ids, "labels": targets}
            step += 1

    return IterableDataset.from_generator(generate, gen_kwargs={"seed": seed})


def induction_metrics(outputs, labels: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Accuracy over every labelled position (BLANK and NONE included, Sanford et al.'s metric) and over the
    induction positions (labels a-d), as (correct, counted) sums."""
    scored = labels != -100
    hits = (outputs.logits.argmax(-1) == labels) & scored
    induction = (labels >= 1) & (labels <= SYMBOLS)
    return {"accuracy": (hits.sum(), scored.sum()), "induction_accuracy": ((hits & induction).sum(), induction.sum())}


def blank_and_guess_accuracy(labels: torch.Tensor) -> float:
    """Expected accuracy of the predictor that answers BLANK at position 0 and guesses uniformly among the 3 symbols
    other than the current one elsewhere (a model before training: App. C's epoch-0 row). The answer at an
    induction position is never the current symbol, so the guess is right with probability 1/3 there; NONE is never
    guessed."""
    correct = (labels == BLANK).sum() + ((labels >= 1) & (labels <= SYMBOLS)).sum() / 3
    return float(correct / labels.numel())
