"""`energyzoo bench` and the embedded corpus (the quickstart is tested with train / eval / export)."""

import json
import time
from dataclasses import asdict, replace

import pytest

from energyzoo.cli import main
from energyzoo.eval import speed
from energyzoo.eval.speed import (
    LINEAR_SCALING_TARGET,
    Arm,
    BenchSettings,
    _paired_times,
    format_table,
    measure_peak_memory,
    run_bench,
    timed_row,
)
from energyzoo.registry import ARCHITECTURES
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

    times = _paired_times({"slow": sleeper("slow", 0.03), "fast": sleeper("fast", 0.01)}, repeats=3, device="cpu",
                          min_seconds=0.0)
    assert calls == ["slow", "fast", "slow", "fast", "fast", "slow", "slow", "fast"]  # warm-up, then rotated
    assert all(0.03 <= t < 0.08 for t in times["slow"]) and all(0.01 <= t < 0.06 for t in times["fast"])
    calls.clear()  # a call shorter than min_seconds is repeated within each sample: 0.05 s of 0.02 s calls is 3
    times = _paired_times({"slow": sleeper("slow", 0.06), "fast": sleeper("fast", 0.02)}, repeats=2, device="cpu",
                          min_seconds=0.05)
    assert calls == ["slow", "fast", "slow", *["fast"] * 3, *["fast"] * 3, "slow"]
    assert all(0.06 <= t < 0.1 for t in times["slow"]) and all(0.02 <= t < 0.035 for t in times["fast"])


def test_bench_reports_medians_of_paired_ratios_against_the_targets(monkeypatch):
    # scripted seconds per call (fem, llama) for each repeat: the rows follow from them alone
    scripted = {"forward": ([3.0, 5.0, 2.0], [1.0, 1.0, 1.0]), "train_step": ([2.0, 2.0, 2.0], [2.0, 1.0, 4.0]),
                "decode": ([4.0, 4.0, 4.0], [2.0, 2.0, 2.0]), "decode_static": ([1.0, 2.0, 1.0], [2.0, 2.0, 2.0])}
    workloads = iter(scripted)

    def paired_times(fns, repeats, device):
        fem, llama = scripted[next(workloads)]
        return {label: llama if "(baseline)" in label else fem for label in fns}

    monkeypatch.setattr(speed, "_paired_times", paired_times)
    monkeypatch.setattr(speed, "measure_peak_memory", lambda arm, settings: 2**21 if arm.baseline else 3 * 2**20)
    settings = BenchSettings(batch_size=1, seq_len=16, repeats=3, decode_tokens=8)
    result = run_bench("fem-lm-tiny", settings)
    rows = {row["workload"]: row for row in result["rows"]}
    assert (rows["forward"]["value"], rows["forward"]["baseline"], rows["forward"]["ratio"]) == (3.0, 1.0, 3.0)
    assert rows["forward"]["spread"] == (2.0, 5.0) and rows["forward"]["busy"]
    assert rows["train_step"]["ratio"] == 1.0 and rows["train_step"]["spread"] == (0.5, 2.0)  # median of 1, 2, 0.5
    assert (rows["peak_memory"]["value"], rows["peak_memory"]["ratio"]) == (3.0, 1.5)
    assert (rows["decode"]["value"], rows["decode"]["ratio"]) == (2.0, 0.5)  # 8 tokens in 4 s; tokens/s FEM / Llama
    assert rows["decode"]["spread"] == (0.5, 0.5) and not rows["decode"]["busy"]
    assert (rows["decode_static"]["value"], rows["decode_static"]["ratio"]) == (8.0, 2.0)  # median 1 s; 2 / 1
    assert rows["decode_static"]["target"] is None  # reported beside the dynamic cache's, without a target
    assert [rows[name]["meets_target"] for name in ("forward", "train_step", "peak_memory", "decode")] \
        == [False, True, False, False]
    table = format_table(result)
    assert "| fem-lm-tiny | forward (s) | 3 | 1 | 3.000 | 2.000-5.000 | <= 1.10 | NO |" in table
    assert "WARNING" in table and "fem-lm-tiny forward" in table.splitlines()[-1]


def test_a_quiet_run_carries_no_warning_and_a_target_bounds_tokens_per_second_from_below():
    quiet = timed_row("a", "decode", seconds=[1.0, 1.0, 1.0], baseline=[0.9, 0.9, 0.9], target=0.85, per_call=10)
    assert (quiet.value, quiet.baseline, quiet.ratio, quiet.meets_target, quiet.busy) == (10.0, 10 / 0.9, 0.9, True,
                                                                                          False)
    result = {"title": "t", "rows": [asdict(quiet)], "notes": []}
    assert "WARNING" not in format_table(result) and "| >= 0.85 | yes |" in format_table(result)


def test_bench_refuses_architectures_without_an_entry_and_presets_of_other_models(monkeypatch):
    monkeypatch.setitem(ARCHITECTURES, "hyperset", replace(ARCHITECTURES["hyperset"], bench=None))
    with pytest.raises(ValueError, match="'hyperset' has no bench entry in the registry; benched: eer-looped, "
                                         "eqt-llama, fem, tel-gpt2, tel-resnet, tel-vit$"):
        run_bench("hyperset")
    with pytest.raises(ValueError, match="'llama-tiny' is a 'llama' preset"):
        run_bench("llama-tiny")
    with pytest.raises(ValueError, match="fem-lm-tiny sweeps no forward keyword"):
        run_bench("fem-lm-tiny", sweep=(1, 2))


def test_a_contrast_pairs_two_presets_of_the_entry_over_the_same_repeats(monkeypatch):
    """EER's regularised loss against cross-entropy: a row from the per-repeat ratios of the two presets, without a
    target; each preset also against the baseline; a single preset measured gives no contrast."""
    scripted = {"eer-looped-gpt2 (baseline)": [1.0, 1.0, 1.0], "eer-induction": [3.0, 4.0, 2.0],
                "eer-induction-ce": [1.0, 2.0, 2.0]}
    monkeypatch.setattr(speed, "_paired_times", lambda fns, repeats, device: {key: scripted[key] for key in fns})
    memory = {"eer-looped-gpt2": 2.0, "eer-induction": 3.0, "eer-induction-ce": 1.5}
    monkeypatch.setattr(speed, "measure_peak_memory", lambda arm, settings: memory[arm.preset] * 2**20)
    settings = BenchSettings(batch_size=2, seq_len=8, repeats=3, workloads=("train_step", "peak_memory"))
    rows = [(row["arm"], row["workload"], row["ratio"], row["target"]) for row in run_bench("eer-looped",
                                                                                            settings)["rows"]]
    assert rows == [("eer-induction", "train_step", 3.0, None), ("eer-induction-ce", "train_step", 2.0, None),
                    ("eer-induction vs eer-induction-ce", "train_step", 2.0, None),  # median of 3, 2, 1
                    ("eer-induction", "peak_memory", 1.5, None), ("eer-induction-ce", "peak_memory", 0.75, None),
                    ("eer-induction vs eer-induction-ce", "peak_memory", 2.0, None)]
    alone = run_bench("eer-induction", settings)["rows"]
    assert [row["arm"] for row in alone] == ["eer-induction", "eer-induction"]


def test_bench_all_measures_every_benched_architecture_at_its_own_shape(tmp_path, monkeypatch):
    seen = []

    def fake_run_bench(name, settings):
        seen.append((name, settings.batch_size, settings.repeats))
        return {"title": name, "rows": [], "notes": []}

    monkeypatch.setattr(speed, "run_bench", fake_run_bench)
    output = tmp_path / "bench.json"
    assert main(["bench", "--all", "--repeats", "3", "--output", str(output)]) == 0
    names = [name for name, entry in ARCHITECTURES.items() if entry.bench is not None]
    assert seen == [(name, None, 3) for name in names] and len(names) == len(ARCHITECTURES)
    assert [result["title"] for result in json.loads(output.read_text())] == names


def test_profile_lists_the_operators_of_one_call_per_model(capsys):
    """One forward of each looped model (T = 25 block applications, each with one GELU) after the warm-up call."""
    assert main(["bench", "eer-induction", "--profile", "forward", "--batch-size", "2", "--seq-len", "8"]) == 0
    shown = capsys.readouterr().out.split("== ")[1:]
    assert [section.split(",")[0] for section in shown] == ["eer-looped-gpt2 (baseline)", "eer-induction"]
    every_operator = speed.profile_tables("eer-induction", "forward", BenchSettings(batch_size=2, seq_len=8),
                                          row_limit=-1)
    for section in every_operator.split("== ")[1:]:
        (gelu,) = [line.split() for line in section.splitlines() if line.strip().startswith("aten::gelu ")]
        assert int(gelu[-1]) == 25
    with pytest.raises(ValueError, match="--profile peak_memory: eer-looped times forward, train_step, decode$"):
        speed.profile_tables("eer-looped", "peak_memory")


def test_bench_times_image_classifiers_on_images_of_their_size(monkeypatch):
    seen = []
    forward_fn = speed._forward_fn

    def recording_forward_fn(model, inputs, call):
        seen.append((type(model).__name__, tuple(inputs["pixel_values"].shape), tuple(inputs["labels"].shape)))
        return forward_fn(model, inputs, call)

    monkeypatch.setattr(speed, "_forward_fn", recording_forward_fn)
    monkeypatch.setattr(speed, "measure_peak_memory", lambda arm, settings: 2**20)
    result = run_bench("tel-vit-tiny", BenchSettings(batch_size=2, repeats=1), baseline="tel-vit-tiny")
    assert seen == [("TELViTForImageClassification", (2, 1, 8, 8), (2,))] * 2
    assert [row["workload"] for row in result["rows"]] == ["forward", "train_step", "peak_memory"]
    assert "seq" not in result["title"] and result["rows"][2]["ratio"] == 1.0


def test_peak_memory_grows_with_the_model():
    settings = BenchSettings(batch_size=1, seq_len=16)
    small = measure_peak_memory(Arm("fem-lm-tiny", "fem-lm-tiny"), settings)
    large = measure_peak_memory(Arm("fem-lm-table5", "fem-lm-table5"), settings)
    # fem-lm-table5 has 42M parameters: weights, gradients and two AdamW moments take 4 x 4 bytes each
    assert large > 4 * 42e6 * 4 and small < 0.2 * large


def test_bench_command_writes_json(tmp_path):
    output = tmp_path / "bench.json"
    code = main(["bench", "fem-lm-tiny", "--seq-len", "16", "--batch-size", "1", "--repeats", "1", "--output",
                 str(output), "--workloads", "forward", "decode"])
    saved = json.loads(output.read_text())
    assert code == 0 and saved["baseline"] == "llama-tiny" and saved["settings"]["seq_len"] == 16
    assert [row["workload"] for row in saved["rows"]] == ["forward", "decode"]


def test_bench_command_measures_the_chosen_workloads_of_a_model_with_the_fields_set(tmp_path, monkeypatch):
    built = []
    build = speed._build

    def recording_build(arm, settings):
        model = build(arm, settings)
        built.append((arm.baseline, model.config.model_type, getattr(model.config, "use_time_decay", None)))
        return model

    monkeypatch.setattr(speed, "_build", recording_build)
    output = tmp_path / "bench.json"
    assert main(["bench", "fem-lm-tiny", "--seq-len", "16", "--batch-size", "1", "--repeats", "1", "--workloads",
                 "decode", "--set", "use_time_decay=false", "--output", str(output)]) == 0
    saved = json.loads(output.read_text())
    assert [row["workload"] for row in saved["rows"]] == ["decode"]
    assert sorted(built) == [(False, "fem", False), (True, "llama", None)]
    assert "decoding: batch 1, a 32-token prompt + 64 tokens" in saved["title"]


def test_bench_builds_fem_with_the_requested_prior_and_kernel_and_leaves_the_baseline_alone():
    from energyzoo.eval.speed import _build

    settings = BenchSettings(overrides={"prior": "ssm", "kernel": "torch"}, seq_len=16)
    fem, llama = _build(Arm("fem-lm-tiny", "fem-lm-tiny"), settings), _build(Arm("b", "llama-tiny", baseline=True),
                                                                             settings)
    assert (fem.config.prior, fem.config.kernel) == ("ssm", "torch")
    assert fem.config._attn_implementation == "sdpa" and llama.config._attn_implementation == "sdpa"
    assert type(fem.model.layers[0].self_attn).__name__ == "FEMAttention"
    assert fem.model.layers[0].self_attn.dt_proj is not None
    assert llama.config.model_type == "llama"


def test_length_scaling_reports_the_time_ratio_of_the_two_lengths_per_prior(monkeypatch):
    from energyzoo.eval.speed import run_length_scaling

    # a scripted timer: seconds = the number of tokens the forward saw, squared for the softmax prior
    def timed(fn, device):
        fn()
        return float(seen[-1] ** (2 if seen_prior[-1] == "softmax" else 1))

    seen, seen_prior = [], []
    forward_fn = speed._forward_fn

    def recording_forward_fn(model, inputs, call):
        def forward():
            seen.append(inputs["input_ids"].shape[1])
            seen_prior.append(model.config.prior)
            return forward_fn(model, inputs, call)()
        return forward

    monkeypatch.setattr(speed, "_timed", timed)
    monkeypatch.setattr(speed, "_forward_fn", recording_forward_fn)
    result = run_length_scaling(priors=("softmax", "gla"), lengths=(32, 128), repeats=1)
    softmax, gla = result["rows"]
    assert (softmax["arm"], softmax["ratio"], softmax["target"]) == ("softmax", 16.0, None)
    assert LINEAR_SCALING_TARGET > 4.0  # the linear prior's 4x is within the target
    assert (gla["ratio"], gla["meets_target"]) == (4.0, True)
    assert "| gla | forward T=128 / T=32 (s) | 128 | 32 | 4.000 |" in format_table(result)
