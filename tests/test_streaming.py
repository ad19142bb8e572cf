"""Streamed `datasets` text sources: packed on the fly, shared over processes, resumed where they stopped -
checked on a local JSON file against the documents packed in memory."""

import json
import zlib

import pytest
import torch
from safetensors.torch import load_file

from energyzoo.data.hub import PackedStream
from energyzoo.data.text import pack_into_blocks, python_docs_corpus, train_bpe_tokenizer
from energyzoo.training.recipe import DataSection, load_recipe
from energyzoo.training.run import run_training

BLOCK = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(JSON-lines file, its documents, a tokenizer) of the Python documentation topics."""
    documents = [text[:1500] for text in python_docs_corpus()[0][:120]]
    path = tmp_path_factory.mktemp("stream") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": text, "id": index}) + "\n" for index, text in enumerate(documents)))
    return path, documents, train_bpe_tokenizer(documents, 300)


def streamed(path, **values) -> DataSection:
    return DataSection(source="hf", name="json", paths=[str(path)], block_size=BLOCK, validation_fraction=0.1, **values)


def training_documents(documents):
    """The documents the stream trains on: those whose CRC-32 is not 0 modulo 1 / validation_fraction."""
    return [text for text in documents if zlib.crc32(text.encode()) % 10 != 0]


def all_blocks(stream: PackedStream) -> torch.Tensor:
    return torch.tensor(list(stream._blocks))


def test_the_stream_of_each_process_is_its_share_of_documents_packed_in_memory(corpus):
    path, documents, tokenizer = corpus
    train = training_documents(documents)
    assert 0 < len(documents) - len(train) < len(documents) // 4  # some held out, most kept
    alone = all_blocks(PackedStream(streamed(path), tokenizer))
    assert torch.equal(alone, pack_into_blocks(train, tokenizer, BLOCK))
    for rank in range(2):  # one file cannot be split by file: process r reads every second document from the r-th
        share = all_blocks(PackedStream(streamed(path), tokenizer, rank, 2))
        assert torch.equal(share, pack_into_blocks(train[rank::2], tokenizer, BLOCK)), rank


def test_a_stream_rebuilt_from_its_state_continues_with_the_next_block(corpus):
    path, _, tokenizer = corpus
    for rank, world in ((0, 1), (1, 2)):
        whole = PackedStream(streamed(path), tokenizer, rank, world)
        expected = whole.next_blocks(25)
        stopped = PackedStream(streamed(path), tokenizer, rank, world)
        head = stopped.next_blocks(11)
        state = json.loads(json.dumps(stopped.state_dict()))
        assert len(state["carry"]) > 0  # the cut falls inside a document: its rest is carried
        tail = PackedStream(streamed(path), tokenizer, rank, world, state).next_blocks(14)
        assert torch.equal(torch.cat([head, tail]), expected)


def test_an_exhausted_stream_says_so(corpus):
    path, documents, tokenizer = corpus
    with pytest.raises(ValueError, match="ran out of documents"):
        PackedStream(streamed(path), tokenizer).next_blocks(10**6)


@pytest.mark.slow
def test_a_killed_and_resumed_streamed_run_ends_with_the_weights_of_an_uninterrupted_one(corpus, tmp_path):
    path, documents, _ = corpus
    settings = ["data.source=hf", "data.name=json", f"data.paths=[{path}]", f"data.block_size={BLOCK}",
                "data.validation_fraction=0.1", "training.steps=6", "training.save_every=3", "training.eval_every=3",
                "training.warmup_steps=1", "training.batch_size=4", "model.overrides.hidden_size=32",
                "model.overrides.intermediate_size=64", "model.overrides.num_hidden_layers=2",
                "tokenizer.train_vocab_size=300"]
    whole = run_training(load_recipe("fem-lm-tiny", [*settings, f"output_dir={tmp_path / 'whole'}"]), progress=False)
    recipe = load_recipe("fem-lm-tiny", [*settings, f"output_dir={tmp_path / 'resumed'}"])
    assert run_training(recipe, stop_after=4, progress=False).model_dir is None
    state = json.loads((tmp_path / "resumed" / "checkpoints" / "step-0000003" / "stream_state_0.json").read_text())
    assert state["documents"] > 0
    resumed = run_training(recipe, resume=True, progress=False)  # from step 4, which --stop-after saved
    assert (tmp_path / "resumed" / "checkpoints" / "step-0000004" / "stream_state_0.json").is_file()
    assert resumed.losses == whole.losses[4:]
    expected = load_file(whole.model_dir / "model.safetensors")
    actual = load_file(resumed.model_dir / "model.safetensors")
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    # validation: the held-out documents among the first `examples`, packed
    assert whole.final_metrics["validation_loss"] == resumed.final_metrics["validation_loss"]


@pytest.mark.slow
def test_two_processes_stream_their_shares_and_resume_from_their_own_positions(corpus, tmp_path):
    """`accelerate launch` with 2 processes on a streamed source: killed after step 4, resumed from step 3's
    checkpoint (one stream position per process), it ends with the weights of an uninterrupted 2-process run."""
    import os
    import subprocess
    import sys

    from energyzoo.training.recipe_files import ACCELERATE_CONFIGS

    path, _, _ = corpus
    config = ACCELERATE_CONFIGS / "cpu-2proc.yaml"

    def launch(output, *extra):
        command = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", str(config),
                   "-m", "energyzoo.cli", "train", "fem-lm-tiny", "data.source=hf", "data.name=json",
                   f"data.paths=[{path}]", f"data.block_size={BLOCK}", "training.steps=6", "training.save_every=3",
                   "training.eval_every=3", "training.warmup_steps=1", "training.batch_size=4",
                   "model.overrides.hidden_size=32", "model.overrides.intermediate_size=64",
                   "model.overrides.num_hidden_layers=2", "tokenizer.train_vocab_size=300", f"output_dir={output}",
                   *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    assert launch(tmp_path / "whole").stdout.count("trained 6 steps") == 1  # one process reports
    launch(tmp_path / "resumed", "--stop-after", "4")
    checkpoint = tmp_path / "resumed" / "checkpoints" / "step-0000003"
    positions = [json.loads((checkpoint / f"stream_state_{rank}.json").read_text())["documents"] for rank in (0, 1)]
    assert all(count > 0 for count in positions)
    launch(tmp_path / "resumed", "--resume")
    expected = load_file(tmp_path / "whole" / "model" / "model.safetensors")
    actual = load_file(tmp_path / "resumed" / "model" / "model.safetensors")
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
