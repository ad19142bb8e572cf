"""Text that is always there, and local text: the Python documentation shipped with CPython (one document per help
topic), the standard library's source (one document per module file), local text and JSONL files; a byte-level BPE
tokenizer trained here, and packing into fixed-length blocks."""

import logging
import pydoc_data.topics
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..modeling.errors import UserError
from .local_files import describe_files, jsonl_documents, resolve_paths, text_documents

logger = logging.getLogger(__name__)
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}



def python_docs_corpus(validation_fraction: float = 0.05) -> tuple[list[str], list[str]]:
    """The ~0.45 MB of English in `pydoc_data.topics`, one document per help topic, split by topic (sorted
    by name, every k-th topic held out) so validation text is never seen in training."""
    if not 0 < validation_fraction < 1:
        raise UserError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    return split_documents([text for _, text in sorted(pydoc_data.topics.topics.items())], validation_fraction)



# the standard library's folders that are not library source: test suites, GUI demos, vendored wheels, and the
# documentation `python_docs_corpus` already is
STDLIB_SKIPPED = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo",
                            "ensurepip", "pydoc_data"})
STDLIB_TEST_EVERY = 10  # every tenth module file (by path) is the test part no training or validation reads


def _stdlib_documents() -> list[str]:
    """The CPython standard library's module files (about 10 MB on CPython 3.11), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(path for path in root.rglob("*.py") if not STDLIB_SKIPPED & set(path.relative_to(root).parts[:-1]))
    return [path.read_text(encoding="utf-8", errors="replace") for path in paths]


def python_stdlib_corpus(validation_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """The standard library's source that ships with every CPython, one document per module file, split by file into
    (train, validation) after its test part (`python_stdlib_test_documents`) is set aside: a corpus large enough
    (about 3M tokens under a 2,048-token BPE) for a tiny model to train on under one epoch."""
    if not 0 < validation_fraction < 1:
        raise UserError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    documents = _stdlib_documents()
    return split_documents([text for index, text in enumerate(documents) if index % STDLIB_TEST_EVERY],
                           validation_fraction)


def python_stdlib_test_documents() -> list[str]:
    """The standard library's test part: every ``STDLIB_TEST_EVERY``-th module file, read by no training run."""
    return _stdlib_documents()[::STDLIB_TEST_EVERY]


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



def token_stream(texts: list[str], tokenizer) -> list[int]:
    """Documents tokenised and joined, each followed by EOS."""
    stream = []
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        stream.append(tokenizer.eos_token_id)
    return stream


def pack_into_blocks(texts: list[str], tokenizer, block_size: int, what: str = "the documents") -> torch.Tensor:
    """Tokenise documents, join them with EOS, and cut the stream into (num_blocks, block_size) blocks
    (the tail that does not fill a block is dropped); ``what`` names the documents in the error of a stream too
    short for one block."""
    stream = token_stream(texts, tokenizer)
    num_blocks = len(stream) // block_size
    if num_blocks == 0:
        raise UserError(f"{what}: {len(stream)} tokens do not fill one block of data.block_size={block_size}; "
                        "lower data.block_size or add text")
    return torch.tensor(stream[: num_blocks * block_size]).view(num_blocks, block_size)



def split_documents(documents: list[str], validation_fraction: float) -> tuple[list[str], list[str]]:
    """Every k-th document (k = 1 / fraction) held out for validation, the rest for training."""
    every = max(2, round(1 / validation_fraction))
    train = [text for index, text in enumerate(documents) if index % every != every - 1]
    validation = [text for index, text in enumerate(documents) if index % every == every - 1]
    return train, validation



def source_documents(data) -> tuple[list[str], str]:
    """(documents, what they are for a message) of an in-memory text source of a recipe's `DataSection`, in order:
    the paragraphs of local text files, the records of local JSONL files (`data.local_files`)."""
    files = resolve_paths(data.paths, data.source)
    if data.source == "text":
        return [document for path in files for document in text_documents(path)], describe_files(files)
    return [document for path in files for document in jsonl_documents(path, data.text_field)], describe_files(files)


def read_documents(data) -> tuple[list[str], list[str]]:
    """(train, validation) documents of an in-memory text source of a recipe's `DataSection`."""
    if data.source == "python-docs":
        return python_docs_corpus(data.validation_fraction)
    if data.source == "python-stdlib":
        return python_stdlib_corpus(data.validation_fraction)
    return split_documents(source_documents(data)[0], data.validation_fraction)



def language_model_blocks(data, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) blocks of `data.block_size` tokens of an in-memory text source: every k-th document held
    out (k = 1 / validation_fraction), or, where that leaves no validation block (a few files of one paragraph each),
    every k-th block of the token stream of all documents: a validation part that is never empty, its size logged."""
    if data.source in ("python-docs", "python-stdlib"):
        train, validation = read_documents(data)
        return (pack_into_blocks(train, tokenizer, data.block_size, f"the training part of {data.source}"),
                pack_into_blocks(validation, tokenizer, data.block_size, f"the validation part of {data.source}"))
    documents, what = source_documents(data)
    train, validation = split_documents(documents, data.validation_fraction)
    every, size = max(2, round(1 / data.validation_fraction)), data.block_size
    if len(token_stream(validation, tokenizer)) >= size:
        train_blocks = pack_into_blocks(train, tokenizer, size, f"the training documents of {what}")
        validation_blocks = pack_into_blocks(validation, tokenizer, size, f"the validation documents of {what}")
        how = f"every {every}th of {len(documents)} documents (paragraphs or JSONL records) held out"
    else:
        stream = token_stream(documents, tokenizer)
        if len(stream) < 2 * size:
            raise UserError(f"{what}: {len(stream)} tokens do not fill two blocks of data.block_size={size} (one to "
                            f"train on, one to validate on); lower data.block_size to at most {len(stream) // 2}, or "
                            "add text")
        blocks = torch.tensor(stream[: len(stream) // size * size]).view(-1, size)
        held = torch.arange(len(blocks)) % every == every - 1
        held[-1] = held.any().logical_not() | held[-1]  # two blocks and k > 2: the second is the validation one
        train_blocks, validation_blocks = blocks[~held], blocks[held]
        how = (f"every {every}th block of the token stream held out: {len(documents)} document"
               f"{'s are' if len(documents) > 1 else ' is'} too few to hold documents out")
    logger.info(f"{what}: {len(train_blocks)} training and {len(validation_blocks)} validation blocks of {size} "
                f"tokens ({how})")
    return train_blocks, validation_blocks
