"""Text that is always there (DESIGN.md, "Data that is always there"): the Python documentation shipped
with CPython, a byte-level BPE tokenizer trained on it locally, and packing into fixed-length blocks."""

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
    topics = sorted(pydoc_data.topics.topics.items())
    every = max(2, round(1 / validation_fraction))
    train = [text for index, (_, text) in enumerate(topics) if index % every != every - 1]
    validation = [text for index, (_, text) in enumerate(topics) if index % every == every - 1]
    return train, validation


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
