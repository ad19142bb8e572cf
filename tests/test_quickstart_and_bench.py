"""`energyzoo bench` and the embedded corpus (the quickstart is tested with train / eval / export)."""

import json

from energyzoo.cli import main
from energyzoo.eval.speed import BenchSettings, format_table, measure_peak_memory, run_fem_vs_llama
from energyzoo.training.data import pack_into_blocks, python_docs_corpus, train_bpe_tokenizer


def test_corpus_split_is_disjoint_and_tokenizer_round_trips():
    train, validation = python_docs_corpus(validation_fraction=0.1)
    assert validation and not set(train) & set(validation)
    tokenizer = train_bpe_tokenizer(train[:20], vocab_size=400)
    text = "def f(x):\n    return x ** 2  # ünïcode"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    blocks = pack_into_blocks(train[:20], tokenizer, block_size=64)
    assert blocks.shape[1] == 64 and (blocks == tokenizer.eos_token_id).any()


def test_bench_reports_medians_ratios_and_targets(tmp_path):
    settings = BenchSettings(preset="fem-lm-tiny", batch_size=1, seq_len=32, repeats=2, decode_tokens=4)
    result = run_fem_vs_llama(settings)
    assert result["models"] == {"fem": "fem-lm-tiny", "llama": "llama-tiny"}
    for name in ("forward", "train_step", "peak_memory", "decode_tokens_per_s"):
        row = result["rows"][name]
        assert row["fem"] > 0 and row["llama"] > 0 and row["ratio"] > 0
        assert isinstance(row["meets_target"], bool)
    raw = result["raw_seconds"]["forward"]
    assert len(raw["fem"]) == 2
    expected = sorted(f / l for f, l in zip(raw["fem"], raw["llama"]))
    assert abs(result["rows"]["forward"]["ratio"] - sum(expected) / 2) < 1e-9  # median of paired ratios
    memory = result["rows"]["peak_memory"]
    assert abs(memory["ratio"] - memory["fem"] / memory["llama"]) < 1e-9
    assert "| forward (s)" in format_table(result)


def test_peak_memory_grows_with_the_model():
    small = measure_peak_memory("fem-lm-tiny", BenchSettings(batch_size=1, seq_len=16))
    large = measure_peak_memory("fem-lm-table5", BenchSettings(batch_size=1, seq_len=16))
    # fem-lm-table5 has 42M parameters: weights, gradients and two AdamW moments take 4 x 4 bytes each
    assert large > 4 * 42e6 * 4 and small < 0.2 * large


def test_bench_command_writes_json(tmp_path):
    output = tmp_path / "bench.json"
    code = main(["bench", "--preset", "fem-lm-tiny", "--seq-len", "16", "--batch-size", "1", "--repeats", "1",
                 "--output", str(output)])
    assert code == 0 and json.loads(output.read_text())["rows"]["forward"]["ratio"] > 0


def test_bench_builds_fem_with_the_requested_prior_and_kernel_and_leaves_the_baseline_alone():
    from energyzoo.eval.speed import _build

    settings = BenchSettings(preset="fem-lm-tiny", prior="ssm", kernel="torch", seq_len=16)
    fem, llama = _build("fem-lm-tiny", settings), _build("llama-tiny", settings)
    assert (fem.config.prior, fem.config.kernel) == ("ssm", "torch")
    assert fem.config._attn_implementation == "sdpa" and llama.config._attn_implementation == "sdpa"
    assert type(fem.model.layers[0].self_attn).__name__ == "FEMAttention" and hasattr(fem.model.layers[0].self_attn,
                                                                                       "dt_proj")
    assert llama.config.model_type == "llama"


def test_length_scaling_reports_one_row_per_prior():
    from energyzoo.eval.speed import format_scaling_table, run_length_scaling

    result = run_length_scaling(priors=("softmax", "gla"), lengths=(32, 128), repeats=1)
    assert set(result["rows"]) == {"softmax", "gla"}
    for prior, row in result["rows"].items():
        assert row["ratio"] == row["seconds"][128] / row["seconds"][32] > 0
        assert (row["target"] is None) == (prior == "softmax")
    assert "| gla" in format_scaling_table(result)
