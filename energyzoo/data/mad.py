"""The six MAD tasks (Poli et al., ICML 2024, "Mechanistic Design and Scaling of Hybrid Architectures") that fem.txt
Table 1 reports, generated from MAD's published task definitions at MAD's baseline settings.

Every instance is ``(inputs, train_targets, test_targets)``, integer arrays of one length, targets aligned with the
inputs (target p answers input p; `IGNORE` is not scored). The recall tasks train as language models (the next token
everywhere) and are tested on the values of keys seen before in the sequence (MAD's multi-query recall); the other
tasks train and test on the same targets.

- **in-context recall**: key-value pairs (keys the lower half of the vocabulary, values the upper), each key bound to
  one value per sequence; the last pair repeats a key seen before.
- **noisy recall**: the same, each pair replaced by two noise tokens (their own vocabulary) with probability
  ``frac_noise`` (one pair is never noise).
- **fuzzy recall**: keys and values are motifs of 1-3 distinct tokens (keys of 3 tokens at test time), the sequence
  left-padded to its length; the last pair repeats a key seen before.
- **memorize**: a fixed key-to-value map over the whole training set (MAD's seed 12345 draws it); each pair is a key
  and an insert token whose target is the key's value. The test set uses the same map: it measures memorisation.
- **compress**: random tokens then a compression token; an encoder-decoder reconstructs every token from the last
  position's state (`MadCompressor`, MAD's autoencoder backbone).
- **selective copy**: ``copies`` tokens scattered among blanks, a copy token, then the tokens in order at the blanks
  after it.
"""

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..modeling.errors import UserError

IGNORE = -100
MEMORIZE_MAP_SEED = 12345  # MAD's default seed, which fixes the memorisation map


@dataclass(frozen=True)
class MadTask:
    """One MAD task at MAD's baseline settings (configs/tasks/*.yml of the MAD release): ``chance`` is the test
    accuracy of a uniform guess among the tokens a target can be; ``autoencoder``: compress's backbone."""

    name: str
    vocab_size: int
    seq_len: int
    train_examples: int
    chance: float
    noise_vocab_size: int = 0
    frac_noise: float = 0.0
    motif_size: int = 1
    copies: int = 0
    autoencoder: bool = False

    def shortened(self, max_length: int | None) -> "MadTask":
        """The task at sequence length min(seq_len, max_length) (None: unchanged)."""
        if max_length is None or max_length >= self.seq_len:
            return self
        if self.copies and max_length <= 2 * self.copies + 1:
            raise UserError(f"MAD {self.name} copies {self.copies} tokens: its length must be > "
                             f"{2 * self.copies + 1}, got max_length {max_length}")
        return replace(self, seq_len=max_length)


TASKS = {task.name: task for task in (
    MadTask("compress", vocab_size=16, seq_len=32, train_examples=12_800, chance=1 / 15, autoencoder=True),
    MadTask("fuzzy_recall", vocab_size=16, seq_len=128, train_examples=12_800, chance=1 / 8, motif_size=3),
    MadTask("in_context_recall", vocab_size=16, seq_len=128, train_examples=12_800, chance=1 / 8),
    MadTask("memorize", vocab_size=256, seq_len=32, train_examples=256, chance=1 / 127),
    MadTask("noisy_recall", vocab_size=32, seq_len=128, train_examples=12_800, chance=1 / 8, noise_vocab_size=16,
            frac_noise=0.2),
    MadTask("selective_copy", vocab_size=16, seq_len=256, train_examples=12_800, chance=1 / 14, copies=16),
)}


def _halves(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys: the lower half of ``size`` tokens, values: the upper half."""
    return np.arange(size // 2), np.arange(size // 2, size)


def _shifted(tokens: list[int], seen: list[bool]):
    """A language-model instance: inputs tokens[:-1], train targets tokens[1:], test targets the seen values."""
    tokens, seen = np.array(tokens), np.array(seen)
    return tokens[:-1], tokens[1:], np.where(seen[1:], tokens[1:], IGNORE)


def recall(task: MadTask, rng: np.random.Generator, training: bool):
    """In-context recall, noisy when ``task.frac_noise`` > 0: seq_len // 2 pairs, the last a seen key."""
    keys, values = _halves(task.vocab_size - task.noise_vocab_size)
    noise = np.arange(task.vocab_size - task.noise_vocab_size, task.vocab_size)
    pairs = task.seq_len // 2
    never_noise = rng.integers(pairs - 1)
    bound, tokens, seen = {}, [], []
    for index in range(pairs - 1):
        if index != never_noise and rng.random() < task.frac_noise:
            tokens += list(rng.integers(noise[0], noise[-1] + 1, 2))
            seen += [False, False]
            continue
        key = int(rng.integers(len(keys)))
        seen += [False, key in bound]
        if key not in bound:
            bound[key] = int(rng.integers(values[0], values[-1] + 1))
        tokens += [key, bound[key]]
    key = int(rng.choice(list(bound)))
    return _shifted(tokens + [key, bound[key]], seen + [False, True])


def fuzzy_recall(task: MadTask, rng: np.random.Generator, training: bool):
    """Fuzzy recall: motif keys (1..motif_size tokens in training, motif_size at test) and values, left-padded."""
    pad = task.vocab_size - 1
    keys, values = _halves(task.vocab_size - 1)

    def motif(vocabulary: np.ndarray, size: int) -> tuple[int, ...]:
        return tuple(int(token) for token in vocabulary[rng.permutation(len(vocabulary))[:size]])

    def pair(key: tuple[int, ...]) -> None:
        if key not in bound:
            bound[key] = motif(values, int(rng.integers(1, task.motif_size + 1)))
        seen.extend([False] * len(key) + [key in presented] * len(bound[key]))
        tokens.extend([*key, *bound[key]])
        presented.add(key)

    bound, presented, tokens, seen = {}, set(), [], []
    while len(tokens) + 4 * task.motif_size <= task.seq_len + 1:  # room for one more pair and the final one
        pair(motif(keys, int(rng.integers(1, task.motif_size + 1)) if training else task.motif_size))
    pair(list(bound)[int(rng.integers(len(bound)))])
    padding = task.seq_len + 1 - len(tokens)
    return _shifted([pad] * padding + tokens, [False] * padding + seen)


def memorization_map(task: MadTask) -> dict[int, int]:
    """MAD's fixed key-to-value map: shuffled keys paired with shuffled values (the insert token excluded)."""
    rng = np.random.default_rng(MEMORIZE_MAP_SEED)
    keys, values = (rng.permutation(half) for half in _halves(task.vocab_size - 1))
    return {int(key): int(value) for key, value in zip(keys, values)}


def memorize(task: MadTask, rng: np.random.Generator, training: bool):
    """seq_len // 2 pairs (key, insert token); the insert token's target is the key's value in the fixed map."""
    mapping = memorization_map(task)
    keys = rng.choice(list(mapping), task.seq_len // 2)
    inputs = np.stack([keys, np.full_like(keys, task.vocab_size - 1)], axis=1).reshape(-1)
    targets = np.stack([np.full_like(keys, IGNORE), [mapping[int(key)] for key in keys]], axis=1).reshape(-1)
    return inputs, targets, targets


def compress(task: MadTask, rng: np.random.Generator, training: bool):
    """seq_len - 1 random tokens and the compression token; every token is a target."""
    inputs = np.append(rng.integers(0, task.vocab_size - 1, task.seq_len - 1), task.vocab_size - 1)
    return inputs, inputs, inputs


def selective_copy(task: MadTask, rng: np.random.Generator, training: bool):
    """``copies`` tokens at random places among blanks, the copy token, then blanks whose targets are the tokens."""
    copy_token, blank = task.vocab_size - 1, task.vocab_size - 2
    slots = task.seq_len - task.copies - 1
    tokens = rng.integers(0, blank, task.copies)
    inputs = np.full(task.seq_len, blank)
    inputs[np.sort(rng.choice(slots, task.copies, replace=False))] = tokens
    inputs[slots] = copy_token
    targets = np.full(task.seq_len, IGNORE)
    targets[slots + 1:] = tokens
    return inputs, targets, targets


GENERATORS = {"compress": compress, "fuzzy_recall": fuzzy_recall, "in_context_recall": recall, "memorize": memorize,
              "noisy_recall": recall, "selective_copy": selective_copy}


def mad_split(task: MadTask, examples: int, seed: int, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of ``examples`` instances, (examples, length) each: the train targets when ``training``,
    else the test targets (with the recall tasks' test-time motifs)."""
    rng = np.random.default_rng(seed)
    instances = [GENERATORS[task.name](task, rng, training) for _ in range(examples)]
    targets = 1 if training else 2
    return (torch.as_tensor(np.stack([instance[0] for instance in instances])),
            torch.as_tensor(np.stack([instance[targets] for instance in instances])))
