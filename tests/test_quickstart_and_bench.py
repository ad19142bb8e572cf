"""`energyzoo bench` and the embedded corpus (the quickstart is tested with train / eval / export)."""

import json
import time

from energyzoo.cli import main
from energyzoo.eval import speed
from energyzoo.eval.speed import (
    LINEAR_SCALING_TARGET,
    BenchSettings,
    _paired_times,
    format_table,
    measure_peak_memory,
    run_fem_vs_llama,
)
from energyzoo.training.data import pack_into_blocks, python_docs_corpus, train_bpe_tokenizer


def test_corpus_split_is_disjoint_and_tokenizer_round_trips():
    train, validation = python_docs_corpus(validation_fraction=0.1)
    assert validation and not set(train) & set(validation)
    tokenizer = train_bpe_tokenizer(train[:20], vocab_size=400)
    text = "def f(x):\n    return x ** 2  # ünïcode"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    blocks = pack_into_blocks(train[:20], tokenizer, block_size=64)
    assert blocks.shape[1] == 64 and (blocks == tokenizer.eos_token_id).any()


def test_paired_times_measure_each_function_in_rotating_order():
    calls = []

    def sleeper(name, seconds):
        def run():
            calls.append(name)
            time.sleep(seconds)
        return run

    times = _paired_times({"slow": sleeper("slow", 0.03), "fast": sleeper("fast", 0.01)}, repeats=3, device="cpu")
    assert calls == ["slow", "fast", "slow", "fast", "fast", "slow", "slow", "fast"]  # warm-up, then rotated
    assert all(0.03 <= t < 0.08 for t in times["slow"]) and all(0.01 <= t < 0.06 for t in times["fast"])


def test_bench_reports_medians_of_paired_ratios_against_the_targets(monkeypatch):
    # scripted seconds per call (fem, llama) for each repeat: the rows follow from them alone
    scripted = {"forward": ([3.0, 5.0, 2.0], [1.0, 1.0, 1.0]), "train_step": ([2.0, 2.0, 2.0], [2.0, 1.0, 4.0]),
                "decode": ([4.0, 4.0, 4.0], [2.0, 2.0, 2.0])}
    workloads = iter(scripted)
    monkeypatch.setattr(speed, "_paired_times", lambda fns, repeats, device: dict(zip(fns, scripted[next(workloads)])))
    monkeypatch.setattr(speed, "measure_peak_memory", lambda preset, settings: 3 * 2**20 if "fem" in preset else 2**21)
    settings = BenchSettings(preset="fem-lm-tiny", batch_size=1, seq_len=16, repeats=3, decode_tokens=8)
    result = run_fem_vs_llama(settings)
    rows = result["rows"]
    assert (rows["forward"]["fem"], rows["forward"]["llama"], rows["forward"]["ratio"]) == (3.0, 1.0, 3.0)
    assert rows["train_step"]["ratio"] == 1.0  # median of 1, 2, 0.5
    assert (rows["peak_memory"]["fem"], rows["peak_memory"]["ratio"]) == (3.0, 1.5)
    assert (rows["decode_tokens_per_s"]["fem"], rows["decode_tokens_per_s"]["ratio"]) == (2.0, 0.5)
    assert [rows[name]["meets_target"] for name in ("forward", "train_step", "peak_memory", "decode_tokens_per_s")] \
        == [False, True, False, False]
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
    assert type(fem.model.layers[0].self_attn).__name__ == "FEMAttention"
    assert fem.model.layers[0].self_attn.dt_proj is not None
    assert llama.config.model_type == "llama"


def test_length_scaling_reports_the_time_ratio_of_the_two_lengths_per_prior(monkeypatch):
    from energyzoo.eval.speed import format_scaling_table, run_length_scaling

    # a scripted timer: seconds = the number of tokens the forward saw, squared for the softmax prior
    def timed(fn, device):
        fn()
        return float(seen[-1] ** (2 if seen_prior[-1] == "softmax" else 1))

    seen, seen_prior = [], []
    forward_fn = speed._forward_fn

    def recording_forward_fn(model, ids):
        def forward():
            seen.append(ids.shape[1])
            seen_prior.append(model.config.prior)
            return forward_fn(model, ids)()
        return forward

    monkeypatch.setattr(speed, "_timed", timed)
    monkeypatch.setattr(speed, "_forward_fn", recording_forward_fn)
    result = run_length_scaling(priors=("softmax", "gla"), lengths=(32, 128), repeats=1)
    assert result["rows"]["softmax"]["ratio"] == 16.0 and result["rows"]["softmax"]["target"] is None
    assert LINEAR_SCALING_TARGET > 4.0  # the linear prior's 4x is within the target
    assert result["rows"]["gla"]["ratio"] == 4.0 and result["rows"]["gla"]["meets_target"] is True
    assert "| gla" in format_scaling_table(result)
