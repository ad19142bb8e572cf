"""Training data: the text that is always there (DESIGN.md, "Data that is always there": the Python
documentation shipped with CPython, scikit-learn's digits), local text/JSONL files and `datasets` sources;
a byte-level BPE tokenizer trained locally, and packing into fixed-length blocks."""

import json

import pydoc_data.topics
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def python_docs_corpus(validation_fraction: float = 0.05) -> tuple[list[str], list[str]]:
    """The ~0.45 MB of English in `pydoc_data.topics`, one document per help topic, split by topic (sorted
    by name, every k-th topic held out) so validation text is never seen in training."""
    if not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    return split_documents([text for _, text in sorted(pydoc_data.topics.topics.items())], validation_fraction)


def train_bpe_tokenizer(texts: list[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained here, wrapped as a `PreTrainedTokenizerFast` (ids 0-3: pad, bos, eos, unk)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


def pack_into_blocks(texts: list[str], tokenizer, block_size: int) -> torch.Tensor:
    """Tokenise documents, join them with EOS, and cut the stream into (num_blocks, block_size) blocks
    (the tail that does not fill a block is dropped)."""
    stream = []
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        stream.append(tokenizer.eos_token_id)
    num_blocks = len(stream) // block_size
    if num_blocks == 0:
        raise ValueError(f"{len(stream)} tokens do not fill one block of {block_size}")
    return torch.tensor(stream[: num_blocks * block_size]).view(num_blocks, block_size)


def split_documents(documents: list[str], validation_fraction: float) -> tuple[list[str], list[str]]:
    """Every k-th document (k = 1 / fraction) held out for validation, the rest for training."""
    every = max(2, round(1 / validation_fraction))
    train = [text for index, text in enumerate(documents) if index % every != every - 1]
    validation = [text for index, text in enumerate(documents) if index % every == every - 1]
    return train, validation


def read_documents(data) -> tuple[list[str], list[str]]:
    """(train, validation) documents of an in-memory text source of a recipe's `DataSection`."""
    if data.source == "python-docs":
        return python_docs_corpus(data.validation_fraction)
    documents = []
    for path in data.paths:
        with open(path, encoding="utf-8") as handle:
            if data.source == "text":
                documents.append(handle.read())
            else:
                documents.extend(json.loads(line)[data.text_field] for line in handle if line.strip())
    return split_documents(documents, data.validation_fraction)


class ArrowBlocks:
    """Packed token blocks in a memory-mapped `datasets.Dataset`, indexable like a (N, block_size) tensor."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.dataset[indices.tolist()]["input_ids"])


def _hub_dataset(data):
    from datasets import load_dataset

    files = {"data_files": data.paths} if data.paths else {}
    return load_dataset(data.name, data.subset, split=data.split, **files)


def _packed(dataset, tokenizer, data) -> ArrowBlocks:
    def pack(batch):
        stream = []
        for text in batch[data.text_field]:
            stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
            stream.append(tokenizer.eos_token_id)
        usable = len(stream) // data.block_size * data.block_size  # the tail of each map batch is dropped
        return {"input_ids": [stream[i : i + data.block_size] for i in range(0, usable, data.block_size)]}

    return ArrowBlocks(dataset.map(pack, batched=True, remove_columns=dataset.column_names))


def tokenizer_training_texts(data, limit: int = 50_000) -> list[str]:
    """Texts to train a BPE tokenizer on: the training documents (the first `limit` of a `datasets` source)."""
    if data.source == "hf":
        dataset = _hub_dataset(data)
        return dataset.select(range(min(limit, len(dataset))))[data.text_field]
    return read_documents(data)[0]


def language_model_blocks(data, tokenizer):
    """(train, validation) blocks of `data.block_size` tokens: tensors for in-memory sources, `ArrowBlocks`
    (tokenised and packed with `datasets.map`, cached on disk) for `datasets` sources."""
    if data.source == "hf":
        parts = _hub_dataset(data).train_test_split(test_size=data.validation_fraction, shuffle=False)
        return _packed(parts["train"], tokenizer, data), _packed(parts["test"], tokenizer, data)
    train, validation = read_documents(data)
    return pack_into_blocks(train, tokenizer, data.block_size), pack_into_blocks(validation, tokenizer, data.block_size)


def digits_split(validation_fraction: float, seed: int):
    """scikit-learn's 8x8 digits as (N, 1, 8, 8) images scaled to [-1, 1], split by a seeded permutation:
    (train images, train labels, validation images, validation labels)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - validation_fraction))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def sudoku_solutions(count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` valid 9x9 Sudoku solutions, (count, 81) digits 1..9: the pattern grid
    (3 (r mod 3) + r // 3 + c) mod 9 + 1 under the symmetries that keep a grid valid (digit relabelling,
    rows within a band, bands, columns within a stack, stacks), drawn independently per board."""

    def within_groups() -> torch.Tensor:  # a random order of 9 lines that keeps each group of 3 together
        groups = torch.stack([torch.randperm(3, generator=generator) for _ in range(count)])  # (count, 3)
        inside = torch.stack([torch.stack([torch.randperm(3, generator=generator) for _ in range(3)])
                              for _ in range(count)])  # (count, 3, 3)
        return (groups[:, :, None] * 3 + inside).reshape(count, 9)

    rows, columns = within_groups(), within_groups()
    base = (3 * (torch.arange(9)[:, None] % 3) + torch.arange(9)[:, None] // 3 + torch.arange(9)[None, :]) % 9
    grids = base[rows[:, :, None], columns[:, None, :]]  # (count, 9, 9) digits 0..8
    relabel = torch.stack([torch.randperm(9, generator=generator) for _ in range(count)])
    return torch.gather(relabel, 1, grids.reshape(count, 81)) + 1


def sudoku_split(examples: int, givens: tuple[int, int], validation_fraction: float, seed: int):
    """Sudoku puzzles for token classification (hyperset.txt §5.1 format): ``input_ids`` digits 0..9 with 0 a
    blank, labels digit - 1 on blanks and -100 on givens. Each board keeps a uniform number of givens in
    ``givens`` at random cells (the puzzle may have other solutions; metrics score against the generating
    one). Returns (train inputs, train labels, validation inputs, validation labels)."""
    generator = torch.Generator().manual_seed(seed)
    solutions = sudoku_solutions(examples, generator)
    kept = torch.randint(givens[0], givens[1] + 1, (examples, 1), generator=generator)
    ranks = torch.rand(examples, 81, generator=generator).argsort(dim=1).argsort(dim=1)
    given = ranks < kept
    puzzles = solutions.masked_fill(~given, 0)
    labels = (solutions - 1).masked_fill(given, -100)
    cut = int(examples * (1 - validation_fraction))
    return puzzles[:cut], labels[:cut], puzzles[cut:], labels[cut:]


DIGIT_CODES = 17  # the 8x8 digits' pixels are integers 0..16: a ready-made 17-code grid of 64 tokens
DIGIT_MASK_ID = DIGIT_CODES


def digit_code_split(validation_fraction: float, seed: int):
    """scikit-learn's digits as 8x8 grids of codes 0..16 for masked image modelling (MaskGIT, hyperset.txt
    §5.3): each image masks ceil(64 cos(pi u / 2)) random cells, u ~ U(0, 1) (MaskGIT's cosine schedule), with
    ``DIGIT_MASK_ID``; labels are the codes at masked cells and -100 elsewhere. Masks are drawn once per
    example from ``seed``. Returns (train inputs, train labels, validation inputs, validation labels)."""
    from sklearn.datasets import load_digits

    codes = torch.tensor(load_digits().images, dtype=torch.long).reshape(-1, 64)
    generator = torch.Generator().manual_seed(seed)
    codes = codes[torch.randperm(len(codes), generator=generator)]
    ratio = torch.cos(torch.pi / 2 * torch.rand(len(codes), 1, generator=generator))
    masked = torch.rand(len(codes), 64, generator=generator).argsort(dim=1).argsort(dim=1) < (64 * ratio).ceil()
    inputs = codes.masked_fill(masked, DIGIT_MASK_ID)
    labels = codes.masked_fill(~masked, -100)
    cut = int(len(codes) * (1 - validation_fraction))
    return inputs[:cut], labels[:cut], inputs[cut:], labels[cut:]
