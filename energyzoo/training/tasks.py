"""The task table: what `energyzoo train` and fine-tuning do for each task a preset card names (keyed like
`registry.TASKS`): the data a task reads, the batch -> model kwargs mapping, and its metrics.

Metrics are sums over a batch, ``{name: (numerator, denominator)}``, so that `validation.evaluate` can add them over
batches and processes before dividing (an accuracy is correct / counted).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..data.digits import digit_code_split, digits_split
from ..data.hub import PackedStream, streamed_validation_blocks
from ..data.image_tokenizer import digit_patch_split
from ..data.images import hub_image_split
from ..data.induction import induction_batch, induction_metrics, training_batch
from ..data.parity import cumulative_parity_split
from ..data.sudoku import hub_sudoku_split, sudoku_split
from ..data.text import language_model_blocks
from ..modeling.errors import UserError
from ..registry import TASKS


@dataclass
class TrainingData:
    """Examples as tensors. Online tasks give ``train_batches(step) -> (inputs, labels)``, the fresh global batch of a
    step of a global batch size (a pure function of both), instead of training tensors; streamed sources give
    ``train_stream(rank, world, state) -> PackedStream``, one process's blocks; ``metrics`` replaces the task's where
    the data needs its own (the induction task's aligned labels)."""

    train_inputs: torch.Tensor | None
    train_labels: torch.Tensor | None
    validation_inputs: torch.Tensor
    validation_labels: torch.Tensor
    train_batches: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]] | None = None
    metrics: Callable | None = None
    train_stream: Callable[[int, int, dict | None], PackedStream] | None = None
    # (step, the step's global batch of training inputs) -> (inputs, labels): masks drawn afresh per batch
    remask: Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    # config fields the data fixes (an image folder's classes, image size and channels): `run.build_model` sets them
    config_fields: dict = field(default_factory=dict)


def _masked_modelling_data(codes, validation_inputs, validation_labels, remask) -> TrainingData:
    """Masked image modelling: unmasked training codes, masked per batch by ``remask`` (`data.digits.masking_split`)."""
    return TrainingData(codes, codes, validation_inputs, validation_labels, remask=remask)


@dataclass(frozen=True)
class TrainingTask:
    """name: its `registry.TASKS` key; sources: recipe data source -> its description for model cards, formatted with
    the recipe's data section (the first source is the default); tokenized: it trains on text and needs a tokenizer
    (except from `token_sources`, whose data are token ids already); load(data section, tokenizer, seed) ->
    `TrainingData`; model_options: keyword arguments of every call that are not per-example tensors; metrics(outputs,
    labels) -> ``{name: (numerator, denominator)}``."""

    name: str
    sources: dict[str, str]
    tokenized: bool
    load: Callable
    metrics: Callable[[object, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]
    model_options: dict = field(default_factory=dict)
    token_sources: tuple[str, ...] = ()

    def model_inputs(self, inputs: torch.Tensor, labels: torch.Tensor) -> dict:
        """The model's tensor kwargs (also `Trainer` rows): what the task's head reads (`registry.Task.main_input`),
        and the labels."""
        return {TASKS[self.name].main_input: inputs, "labels": labels}


def _language_model_data(data, tokenizer, seed) -> TrainingData:
    if data.source == "induction":
        lengths, curriculum = tuple(data.lengths), data.length_curriculum_steps
        validation = induction_batch(data.examples, data.block_size, seed=[seed, 10**9])
        return TrainingData(None, None, *validation, metrics=induction_metrics,
                            train_batches=lambda step, batch: training_batch(seed, step, batch, lengths, curriculum))
    if data.source == "parity":
        return TrainingData(*cumulative_parity_split(data.examples, data.block_size, data.validation_fraction, seed))
    if data.source == "hf":
        validation = streamed_validation_blocks(data, tokenizer)
        return TrainingData(None, None, validation, validation,
                            train_stream=lambda rank, world, state: PackedStream(data, tokenizer, rank, world, state))
    train, validation = language_model_blocks(data, tokenizer)
    return TrainingData(train, train, validation, validation)


def _image_classification_data(data, tokenizer, seed) -> TrainingData:
    if data.source == "digits":  # the classes are the digits
        return TrainingData(*digits_split(data.validation_fraction, seed), config_fields=dict(
            id2label={digit: str(digit) for digit in range(10)}, label2id={str(digit): digit for digit in range(10)}))
    split = hub_image_split(data, seed)
    return TrainingData(*split.tensors, config_fields=split.config_fields())


def _next_token_accuracy(outputs, labels):
    """Accuracy of the logits at t on labels[t + 1] (the causal shift), where labelled (!= -100)."""
    targets = labels[:, 1:]
    scored = targets != -100
    hits = (outputs.logits[:, :-1].argmax(-1) == targets) & scored
    return {"next_token_accuracy": (hits.sum(), scored.sum())}


def _accuracy(outputs, labels):
    return {"accuracy": ((outputs.logits.argmax(-1) == labels).sum(), torch.tensor(labels.numel()))}


def _masked_accuracy(outputs, labels):
    """Accuracy over the labelled (masked) positions, labels != -100, of per-token logits."""
    scored = labels != -100
    return {"masked_accuracy": (((outputs.logits.argmax(-1) == labels) & scored).sum(), scored.sum())}


def _sudoku_metrics(outputs, labels):
    """cell_accuracy over the blanks, board_accuracy: boards with every blank right (hyperset.txt §5.1)."""
    scored = labels != -100
    wrong = (outputs.logits.argmax(-1) != labels) & scored
    return {"cell_accuracy": ((scored & ~wrong).sum(), scored.sum()),
            "board_accuracy": ((~wrong.any(-1)).sum(), torch.tensor(len(labels)))}


TRAINING_TASKS = {task.name: task for task in (
    TrainingTask(
        "causal-lm",
        sources={"python-docs": "the Python documentation shipped with CPython (`pydoc_data.topics`) in blocks of "
                                "{block_size} tokens",
                 "python-stdlib": "the CPython standard library's source (one document per module file, a tenth "
                                  "held out for tests) in blocks of {block_size} tokens",
                 "text": "local text files ({paths}) in blocks of {block_size} tokens",
                 "jsonl": "the `{text_field}` field of local JSONL files ({paths}) in blocks of {block_size} tokens",
                 "hf": "the `datasets` source `{name}` (streamed) in blocks of {block_size} tokens",
                 "parity": "{examples} random bit strings of length {block_size} labelled with their cumulative "
                           "parity (eqt.txt eq. 44)",
                 "induction": "fresh induction-head sequences (Sanford et al.'s full-sequence task, 4 symbols, 1 hop) "
                              "of a length drawn in {lengths} per batch; validation on {examples} sequences of length "
                              "{block_size}"},
        tokenized=True,
        load=_language_model_data,
        metrics=_next_token_accuracy,
        model_options={"use_cache": False},
        token_sources=("parity", "induction"),
    ),
    TrainingTask(
        "image-classification",
        sources={"digits": "scikit-learn's 8x8 digits", "hf-images": "the `datasets` source `{name}`"},
        tokenized=False,
        load=_image_classification_data,
        metrics=_accuracy,
    ),
    TrainingTask(
        "token-classification",
        sources={"sudoku": "{examples} generated unique-solution Sudoku puzzles (box {sudoku_box}) with "
                           "{givens[0]} to {givens[1]} givens",
                 "hf-sudoku": "the Sudoku puzzles of the `datasets` source `{name}`"},
        tokenized=False,
        load=lambda data, tokenizer, seed: TrainingData(*(
            sudoku_split(data.examples, tuple(data.givens), data.validation_fraction, seed, data.sudoku_box)
            if data.source == "sudoku" else hub_sudoku_split(data, seed))),
        metrics=_sudoku_metrics,
    ),
    TrainingTask(
        "masked-image-modeling",
        sources={"digit-codes": "scikit-learn's 8x8 digits as grids of 17 codes (the pixel values), masked on the "
                                "{mask_schedule} schedule",
                 "digit-patches": "scikit-learn's 8x8 digits as 4x4 grids of 64 k-means codes of 2x2 patches, masked "
                                  "on the {mask_schedule} schedule"},
        tokenized=False,
        load=lambda data, tokenizer, seed: _masked_modelling_data(*{"digit-codes": digit_code_split,
                                                                   "digit-patches": digit_patch_split}[data.source](
            data.validation_fraction, seed, data.mask_schedule)),
        metrics=_masked_accuracy,
    ),
)}


def training_task(task: str) -> TrainingTask:
    if task not in TRAINING_TASKS:
        raise UserError(f"energyzoo trains the tasks {sorted(TRAINING_TASKS)}; {task!r} has no training data here")
    return TRAINING_TASKS[task]
