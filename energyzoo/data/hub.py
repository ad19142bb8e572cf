"""`datasets` text sources: streamed from the Hub (or local files through a `datasets` builder), split into training
and validation text by a rule on each document, tokenised and packed on the fly per process."""

import itertools
import zlib
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from ..modeling.errors import UserError
from .hub_access import PACKAGED_BUILDERS, reaching_hub
from .local_files import GLOB_CHARACTERS
from .text import pack_into_blocks, read_documents


def _data_files(data) -> list[str]:
    """``data.paths`` as `datasets` takes them: a folder as every file under it (``folder/**``), which is how an
    image folder of one sub-folder per class is given; a missing file or folder named in one line."""
    files = []
    for name in data.paths:
        path = Path(name)
        if path.is_dir():
            files.append(str(path / "**"))
        elif not GLOB_CHARACTERS.search(name) and not path.exists():
            raise UserError(f"data.paths: {name}: no such file or folder")
        else:
            files.append(name)
    return files


def load_hub_dataset(data, streaming: bool = False):
    """The `datasets` source of a recipe's `DataSection`: a packaged builder of local files (`hub_access.
    PACKAGED_BUILDERS`, with ``data.paths``), or a Hub id, read through `hub_access.reaching_hub`."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetNotFoundError

    files = {"data_files": _data_files(data)} if data.paths else {}
    if data.name in PACKAGED_BUILDERS:
        if not data.paths:
            raise UserError(f"data.name={data.name!r} reads local files: name them in data.paths")
        with _local_files_read(data):
            return load_dataset(data.name, data.subset, split=data.split, streaming=streaming, **files)
    instead = ("train on a local image folder (data.name=imagefolder data.paths=[FOLDER], one sub-folder per class)"
               if data.source == "hf-images" else "train on local files (data.source=text or jsonl, "
               "data.paths=[FILE, ...])")
    with reaching_hub(f"data.name={data.name!r}", instead, missing=(DatasetNotFoundError, FileNotFoundError)):
        return load_dataset(data.name, data.subset, split=data.split, streaming=streaming, **files)



@contextmanager
def _local_files_read(data):
    """`datasets`' errors on local files (missing, or not of the builder's format) as one line naming them."""
    from datasets.exceptions import DatasetGenerationError
    from pyarrow import ArrowInvalid

    try:
        yield
    except (FileNotFoundError, DatasetGenerationError, ArrowInvalid) as error:
        cause = error.__cause__ if isinstance(error, DatasetGenerationError) and error.__cause__ else error
        raise UserError(f"data.paths {', '.join(data.paths)}: {data.name!r} cannot read them "
                        f"({str(cause).strip().splitlines()[0]})") from None


def readable_texts(rows, data):
    """The ``data.text_field`` of each row of a `datasets` source: a row without that field, or a local file the
    builder cannot read (found while streaming), is one line naming it."""
    local = data.name in PACKAGED_BUILDERS
    with _local_files_read(data) if local else nullcontext():
        for row in rows:
            yield text_of(row, data)


def text_of(row: dict, data) -> str:
    if data.text_field not in row:
        raise UserError(f"data.text_field={data.text_field!r} is not a field of data.name={data.name!r} (fields: "
                        f"{', '.join(row)}): set data.text_field to the one holding the text")
    return row[data.text_field]


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
            lambda row: not held_out(text_of(row, data), data.validation_fraction))
        rows = split_dataset_by_node(training, self.rank, self.world).skip(self.documents)
        for text in readable_texts(rows, data):
            self.carry.extend(self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])
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
    documents = [text for text in readable_texts(first, data) if held_out(text, data.validation_fraction)]
    return pack_into_blocks(documents, tokenizer, data.block_size)



def tokenizer_training_texts(data, limit: int = 50_000) -> list[str]:
    """Texts to train a BPE tokenizer on: the training documents (the first `limit` of a streamed source)."""
    if data.source == "hf":
        return list(readable_texts(itertools.islice(load_hub_dataset(data, streaming=True), limit), data))
    return read_documents(data)[0]
