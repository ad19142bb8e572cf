"""Training data: the text that is always there (DESIGN.md, "Data that is always there": the Python
documentation shipped with CPython, scikit-learn's digits), local text/JSONL files and `datasets` sources (text
streamed);
a byte-level BPE tokenizer trained locally, and packing into fixed-length blocks."""

import itertools
import json
import pydoc_data.topics
import zlib

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..extras import needs_extra
from ..modeling.errors import UserError

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def python_docs_corpus(validation_fraction: float = 0.05) -> tuple[list[str], list[str]]:
    """The ~0.45 MB of English in `pydoc_data.topics`, one document per help topic, split by topic (sorted
    by name, every k-th topic held out) so validation text is never seen in training."""
    if not 0 < validation_fraction < 1:
        raise UserError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    return split_documents([text for _, text in sorted(pydoc_data.topics.topics.items())], validation_fraction)


def train_bpe_tokenizer(texts: list[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained here, wrapped as a `PreTrainedTokenizerFast` (ids 0-3: pad, bos, eos, unk)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        smallest = 256 + len(SPECIAL_TOKENS)
        raise UserError(f"vocab_size must be at least {smallest} (bytes + specials), got {vocab_size}")
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
        raise UserError(f"{len(stream)} tokens do not fill one block of {block_size}")
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


def _hub_dataset(data, streaming: bool = False):
    from datasets import load_dataset

    files = {"data_files": data.paths} if data.paths else {}
    return load_dataset(data.name, data.subset, split=data.split, streaming=streaming, **files)


def held_out(text: str, validation_fraction: float) -> bool:
    """Whether a streamed document is validation text: its CRC-32 modulo k = 1 / fraction is 0. A rule on the text,
    not on the position, so that it holds however the stream is sharded over processes."""
    return zlib.crc32(text.encode()) % max(2, round(1 / validation_fraction)) == 0


class PackedStream:
    """The training blocks of a streamed `datasets` text source (``data.source == "hf"``) for process ``rank`` of
    ``world``, tokenised and packed on the fly: the documents that are not `held_out`, split over processes with
    `datasets.distributed.split_dataset_by_node` (by file where the files divide evenly, else every world-th
    document), each followed by EOS and cut into ``block_size`` blocks across document boundaries, as
    `pack_into_blocks` cuts a list of documents.

    `state_dict()` (documents read, tokens carried into the next block) is JSON; a stream built from it skips the
    documents it read without tokenising them and continues with exactly the block that would have come next."""

    def __init__(self, data, tokenizer, rank: int = 0, world: int = 1, state: dict | None = None):
        self.data, self.tokenizer, self.rank, self.world = data, tokenizer, rank, world
        state = state or {"documents": 0, "carry": []}
        self.documents, self.carry = state["documents"], list(state["carry"])
        self._blocks = self._generate()

    def _generate(self):
        from datasets.distributed import split_dataset_by_node

        data, eos = self.data, self.tokenizer.eos_token_id
        training = _hub_dataset(data, streaming=True).filter(
            lambda row: not held_out(row[data.text_field], data.validation_fraction))
        for row in split_dataset_by_node(training, self.rank, self.world).skip(self.documents):
            self.carry.extend(self.tokenizer(row[data.text_field], add_special_tokens=False)["input_ids"] + [eos])
            self.documents += 1
            while len(self.carry) >= data.block_size:
                block, self.carry = self.carry[: data.block_size], self.carry[data.block_size :]
                yield block

    def next_blocks(self, count: int) -> torch.Tensor:
        blocks = list(itertools.islice(self._blocks, count))
        if len(blocks) < count:
            raise UserError(f"the stream {self.data.name!r} ran out of documents for process {self.rank} "
                             f"after {self.documents} documents; lower training.steps")
        return torch.tensor(blocks)

    def state_dict(self) -> dict:
        return {"documents": self.documents, "carry": self.carry}


def streamed_validation_blocks(data, tokenizer) -> torch.Tensor:
    """Validation blocks of a streamed source: the `held_out` documents among its first ``data.examples``."""
    first = itertools.islice(_hub_dataset(data, streaming=True), data.examples)
    documents = [row[data.text_field] for row in first if held_out(row[data.text_field], data.validation_fraction)]
    return pack_into_blocks(documents, tokenizer, data.block_size)


def hub_image_split(data, seed: int):
    """A `datasets` image-classification source (``name``, ``subset``, ``split``; local files through ``paths``,
    e.g. name "imagefolder"): images from ``image_column`` as RGB in [-1, 1], resized to ``image_size`` when given,
    labels from ``label_column``, split by ``validation_fraction`` with ``seed``. Held in memory (CIFAR-size sets)."""
    parts = _hub_dataset(data).train_test_split(test_size=data.validation_fraction, seed=seed)

    def tensors(dataset):
        images = torch.stack([torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32)).permute(2, 0, 1)
                              for image in dataset[data.image_column]]) / 127.5 - 1.0
        if data.image_size is not None:
            images = torch.nn.functional.interpolate(images, size=data.image_size, mode="bilinear", antialias=True)
        return images, torch.tensor(dataset[data.label_column], dtype=torch.long)

    return (*tensors(parts["train"]), *tensors(parts["test"]))


def hub_sudoku_split(data, seed: int):
    """A `datasets` Sudoku source (e.g. the hard set of Palm et al. that hyperset.txt §5.1 uses): puzzles and
    solutions as strings of digits in ``puzzle_column`` / ``solution_column`` ("0" or "." for a blank), in the
    format of `sudoku.sudoku_examples`, split by ``validation_fraction`` with ``seed``."""
    parts = _hub_dataset(data).train_test_split(test_size=data.validation_fraction, seed=seed)

    def digits(dataset, column: str) -> torch.Tensor:
        return torch.tensor([[0 if c == "." else int(c) for c in row] for row in dataset[column]])

    def tensors(dataset):
        puzzles, solutions = digits(dataset, data.puzzle_column), digits(dataset, data.solution_column)
        return puzzles, (solutions - 1).masked_fill(puzzles != 0, -100)

    return (*tensors(parts["train"]), *tensors(parts["test"]))


def tokenizer_training_texts(data, limit: int = 50_000) -> list[str]:
    """Texts to train a BPE tokenizer on: the training documents (the first `limit` of a streamed source)."""
    if data.source == "hf":
        return [row[data.text_field] for row in itertools.islice(_hub_dataset(data, streaming=True), limit)]
    return read_documents(data)[0]


def language_model_blocks(data, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) blocks of `data.block_size` tokens of an in-memory text source."""
    train, validation = read_documents(data)
    return pack_into_blocks(train, tokenizer, data.block_size), pack_into_blocks(validation, tokenizer, data.block_size)


def image_processor_for(data, config):
    """The image processor that turns 8-bit images into the pixel values a classifier trained on ``data`` (a recipe's
    `DataSection`, or None for a model trained elsewhere) saw: ``num_channels`` channels scaled to [-1, 1]
    (x / 127.5 - 1, the scaling of `hub_image_split`; the digits' 0..16 are x / 8 - 1, i.e. the same for 8-bit images
    with 16 -> 255),
    resized to the training size (PIL's bilinear; `hub_image_split` resizes tensors with torch's antialiased bilinear,
    close but not bit-equal). What `pipeline("image-classification")` and the Hub widget use; a single-channel model's
    turns its (RGB) images to grayscale first."""
    from transformers import ViTImageProcessorPil

    from ..modeling.image_processing_grayscale import GrayscaleImageProcessor

    size = 8 if data is not None and data.source == "digits" else getattr(data, "image_size", None)
    size = size or getattr(config, "image_size", None)
    channels = config.num_channels
    processor = GrayscaleImageProcessor if channels == 1 else ViTImageProcessorPil
    return processor(do_resize=size is not None, size={"height": size, "width": size} if size else None,
                     do_rescale=True, rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5] * channels,
                     image_std=[0.5] * channels, do_convert_rgb=channels == 3)


def digits_split(validation_fraction: float, seed: int):
    """scikit-learn's 8x8 digits as (N, 1, 8, 8) images scaled to [-1, 1], split by a seeded permutation:
    (train images, train labels, validation images, validation labels)."""
    with needs_extra("vision"):
        from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - validation_fraction))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


DIGIT_CODES = 17  # the 8x8 digits' pixels are integers 0..16: a ready-made 17-code grid of 64 tokens
DIGIT_MASK_ID = DIGIT_CODES
MASK_SCHEDULES = ("cosine", "bernoulli-0.4")


def shuffled_digit_images(seed: int) -> torch.Tensor:
    """scikit-learn's 8x8 digits, (N, 8, 8) intensities 0..16, in a seeded order (splits cut it)."""
    with needs_extra("vision"):
        from sklearn.datasets import load_digits

    images = torch.tensor(load_digits().images, dtype=torch.float32)
    return images[torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))]


def masked_codes(codes: torch.Tensor, schedule: str, mask_id: int, generator: torch.Generator,
                 ratio_per: str = "example"):
    """(inputs, labels) for masked image modelling: masked cells hold ``mask_id`` in the inputs and their code in
    the labels (-100 elsewhere). With a ratio u ~ U(0, 1) drawn per example (``ratio_per="example"``) or once for
    all the rows (``"batch"``), ``schedule`` "cosine" masks ceil(n cos(pi u / 2)) random cells (MaskGIT's training
    schedule); "bernoulli-0.4" masks each cell with probability 0.4 u (hyperset.txt D.4: a ratio drawn in [0, 0.4],
    Bernoulli per token)."""
    count, cells = codes.shape
    u = torch.rand(count if ratio_per == "example" else 1, 1, generator=generator)
    if schedule == "cosine":
        ranks = torch.rand(count, cells, generator=generator).argsort(dim=1).argsort(dim=1)
        masked = ranks < (cells * torch.cos(torch.pi / 2 * u)).ceil()
    else:
        masked = torch.rand(count, cells, generator=generator) < 0.4 * u
    return codes.masked_fill(masked, mask_id), codes.masked_fill(~masked, -100)


def masking_split(codes: torch.Tensor, validation_fraction: float, schedule: str, mask_id: int, seed: int):
    """Codes for masked image modelling, split: the training codes unmasked, with ``remask(step, batch) -> (inputs,
    labels)``, which masks a step's global batch afresh (ratio per batch, seeded by the step: the public Hyper-SET
    code draws its masks per batch, so an image is seen under new masks every epoch), and the validation codes
    masked once per example from ``seed`` (a fixed evaluation set). Returns (train codes, validation inputs,
    validation labels, remask)."""
    cut = int(len(codes) * (1 - validation_fraction))
    validation_inputs, validation_labels = masked_codes(codes[cut:], schedule, mask_id,
                                                        torch.Generator().manual_seed(seed + 1))

    def remask(step: int, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return masked_codes(batch, schedule, mask_id, generator, ratio_per="batch")

    return codes[:cut], validation_inputs, validation_labels, remask


def digit_code_split(validation_fraction: float, seed: int, schedule: str = "cosine"):
    """scikit-learn's digits as 8x8 grids of codes 0..16 for masked image modelling (MaskGIT, hyperset.txt
    §5.3), split by `masking_split` with ``DIGIT_MASK_ID``."""
    codes = shuffled_digit_images(seed).long().reshape(-1, 64)
    return masking_split(codes, validation_fraction, schedule, DIGIT_MASK_ID, seed)


PARITY_END_TOKEN = 2  # bits are tokens 0 and 1; the end token closes a sequence (and pads)


def cumulative_parity_split(examples: int, length: int, validation_fraction: float, seed: int):
    """eqt.txt §5.1.1 (eq. 44) as causal-LM data: ``examples`` random bit strings b_1..b_L followed by the end
    token, labelled so that the logits at b_t's position predict y_t = b_1 xor ... xor b_t (labels[t + 1] = y_t:
    causal LMs score the label one position ahead). Returns (train ids, train labels, validation ids, validation
    labels)."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (examples, length), generator=generator)
    ids = torch.cat([bits, torch.full((examples, 1), PARITY_END_TOKEN)], dim=1)
    labels = torch.cat([torch.full((examples, 1), -100), bits.cumsum(-1) % 2], dim=1)
    cut = examples - max(1, int(examples * validation_fraction))
    return ids[:cut], labels[:cut], ids[cut:], labels[cut:]
