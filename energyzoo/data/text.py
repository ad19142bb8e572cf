"""Text that is always there, and local text: the Python documentation shipped with CPython (one document per help
topic), local text and JSONL files; a byte-level BPE tokenizer trained here, and packing into fixed-length blocks."""

import json
import pydoc_data.topics

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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



def language_model_blocks(data, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) blocks of `data.block_size` tokens of an in-memory text source."""
    train, validation = read_documents(data)
    return pack_into_blocks(train, tokenizer, data.block_size), pack_into_blocks(validation, tokenizer, data.block_size)
