"""`datasets` text sources: streamed from the Hub (or local files through a `datasets` builder), split into training
and validation text by a rule on each document, tokenised and packed on the fly per process."""

import itertools
import zlib

import torch

from ..modeling.errors import UserError
from .text import pack_into_blocks, read_documents


def load_hub_dataset(data, streaming: bool = False):
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
        training = load_hub_dataset(data, streaming=True).filter(
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
    first = itertools.islice(load_hub_dataset(data, streaming=True), data.examples)
    documents = [row[data.text_field] for row in first if held_out(row[data.text_field], data.validation_fraction)]
    return pack_into_blocks(documents, tokenizer, data.block_size)



def tokenizer_training_texts(data, limit: int = 50_000) -> list[str]:
    """Texts to train a BPE tokenizer on: the training documents (the first `limit` of a streamed source)."""
    if data.source == "hf":
        return [row[data.text_field] for row in itertools.islice(load_hub_dataset(data, streaming=True), limit)]
    return read_documents(data)[0]
