"""`energyzoo bench`: paired timing on a scripted clock, medians of paired ratios against each entry's targets, the
workloads and shapes of every benched architecture, contrasts and sweeps, and the command's JSON."""

import json
import os
import statistics
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch

from energyzoo import model_from_preset
from energyzoo.bench import speed
from energyzoo.bench.offload import LOADINGS, NEW_TOKENS, format_offload_table, run_offload_bench
from energyzoo.bench.speed import (
    Arm,
    BenchSettings,
    _first_calls,
    _paired_times,
    measure_peak_memory,
    pinned_threads,
    run_bench,
    timed_row,
)
from energyzoo.bench.table import format_table
from energyzoo.cli import main
from energyzoo.modeling.configuration_fem import PRIORS
from energyzoo.registry import ARCHITECTURES


def test_paired_times_measure_each_function_in_rotating_order(monkeypatch):
    """On a scripted clock (torch.utils.benchmark's Timer reads the bench's clock): each call advances it by its
    function's seconds, so the samples are exact. A sample is blocked_autorange's: one call to size the block, then
    blocks until ``min_seconds`` have passed, whose median is the sample. The warm-up calls are timed on their own."""
    calls, now = [], [0.0]
    monkeypatch.setattr(speed, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def taking(name, seconds):
        durations = iter(seconds) if isinstance(seconds, list) else None

        def run():
            calls.append(name)
            now[0] += next(durations) if durations else seconds
        return run

    assert _first_calls({"compiling": taking("compiling", [20.0, 1.0]), "fast": taking("fast", 1.0)}, "cpu") == {
        "compiling": 20.0, "fast": 1.0}
    calls.clear()
    times = _paired_times({"slow": taking("slow", 3.0), "fast": taking("fast", 1.0)}, repeats=3, device="cpu",
                          min_seconds=0.0)
    # per repeat (rotated: slow first, fast first, slow first) two calls of each
    assert calls == [*["slow"] * 2, *["fast"] * 2, *["fast"] * 2, *["slow"] * 2, *["slow"] * 2, *["fast"] * 2]
    assert times == {"slow": [3.0, 3.0, 3.0], "fast": [1.0, 1.0, 1.0]}
    calls.clear()  # sizing call, then blocks until 5 s have passed (2, 2, 9 s): their median, not mean
    times = _paired_times({"jittery": taking("jittery", [2.0, 2.0, 2.0, 9.0])}, repeats=1, device="cpu",
                          min_seconds=5.0)
    assert calls == ["jittery"] * 4 and times == {"jittery": [2.0]}


def test_pinned_threads_run_on_the_last_cores_and_restore_the_process(monkeypatch):
    allowed, threads = os.sched_getaffinity(0), torch.get_num_threads()
    with pinned_threads(1):
        assert os.sched_getaffinity(0) == {max(allowed)} and torch.get_num_threads() == 1
        tasks = [int(task) for task in os.listdir("/proc/self/task")]
        assert all(os.sched_getaffinity(task) == {max(allowed)} for task in tasks)  # every thread, not the caller's
    assert os.sched_getaffinity(0) == allowed and torch.get_num_threads() == threads
    with pytest.raises(ValueError, match=f"--threads {len(allowed) + 1}: this process may use {len(allowed)} cores"):
        with pinned_threads(len(allowed) + 1):
            pass
    with pinned_threads(None):
        assert os.sched_getaffinity(0) == allowed and torch.get_num_threads() == threads


@pytest.mark.parametrize(("ratios", "iqr", "decision", "busy"), [
    ([1.00, 1.01, 1.02, 1.03, 1.04], (1.01, 1.03), "met", False),  # the whole IQR under 1.05
    ([1.03, 1.04, 1.06, 1.07, 1.08], (1.04, 1.07), "undecided", False),  # the IQR contains 1.05
    ([1.06, 1.07, 1.08, 1.09, 1.10], (1.07, 1.09), "missed", False),
    ([0.90, 1.00, 1.02, 1.20, 1.40], (1.00, 1.20), "undecided", True),  # an IQR of 0.2 at a ratio of 1.02: load
])
def test_a_target_is_decided_only_when_the_iqr_of_the_ratios_is_on_one_side(ratios, iqr, decision, busy):
    row = timed_row("a", "forward", seconds=ratios, baseline=[1.0] * len(ratios), target=1.05)
    assert row.iqr == pytest.approx(iqr) and row.ratio == ratios[2]
    assert (row.decision, row.busy) == (decision, busy)
    rate = timed_row("a", "decode", seconds=[1 / ratio for ratio in ratios], baseline=[1.0] * len(ratios),
                     target=1.05)  # tokens/s: bounded from below, so the decisions swap
    assert rate.decision == {"met": "missed", "missed": "met"}.get(decision, decision)


@pytest.mark.parametrize("repeats", [1, 2])
def test_too_few_repeats_leave_a_target_undecided_however_far_the_ratio(repeats):
    """`bench --repeats 1` called a target "met": one ratio has no spread to set against it."""
    assert timed_row("a", "forward", seconds=[0.5] * repeats, baseline=[1.0] * repeats, target=1.05
                     ).decision == "undecided"
    assert timed_row("a", "forward", seconds=[0.5] * 3, baseline=[1.0] * 3, target=1.05).decision == "met"


def test_bench_reports_medians_of_paired_ratios_against_the_targets(monkeypatch):
    # scripted seconds per call (fem, llama) for each repeat: the rows follow from them alone
    scripted = {"forward": ([3.0, 5.0, 2.0], [1.0, 1.0, 1.0]), "train_step": ([2.0, 2.0, 2.0], [2.0, 1.0, 4.0]),
                "decode": ([4.0, 4.0, 4.0], [2.0, 2.0, 2.0]), "decode_static": ([1.0, 2.0, 1.0], [2.0, 2.0, 2.0]),
                "decode_padded": ([2.0, 2.0, 2.0], [2.0, 2.0, 2.0])}
    workloads = iter(scripted)

    def paired_times(fns, repeats, device):
        fem, llama = scripted[next(workloads)]
        return {label: llama if "(baseline)" in label else fem for label in fns}

    monkeypatch.setattr(speed, "_paired_times", paired_times)
    monkeypatch.setattr(speed, "measure_peak_memory", lambda arm, settings: 2**21 if arm.baseline else 3 * 2**20)
    settings = BenchSettings(batch_size=1, seq_len=16, repeats=3, decode_tokens=8,
                             workloads=("forward", "train_step", "peak_memory", "decode", "decode_static",
                                        "decode_padded"))
    result = run_bench("fem-lm-tiny", settings)
    rows = {row["workload"]: row for row in result["rows"]}
    assert (rows["forward"]["value"], rows["forward"]["baseline"], rows["forward"]["ratio"]) == (3.0, 1.0, 3.0)
    assert rows["forward"]["iqr"] == (2.5, 4.0) and rows["forward"]["busy"]  # quartiles of 3, 5, 2
    assert rows["train_step"]["ratio"] == 1.0 and rows["train_step"]["iqr"] == (0.75, 1.5)  # of 1, 2, 0.5
    assert (rows["peak_memory"]["value"], rows["peak_memory"]["ratio"]) == (3.0, 1.5)
    assert (rows["decode"]["value"], rows["decode"]["ratio"]) == (2.0, 0.5)  # 8 tokens in 4 s; tokens/s FEM / Llama
    assert rows["decode"]["iqr"] == (0.5, 0.5) and not rows["decode"]["busy"]
    assert (rows["decode_static"]["value"], rows["decode_static"]["ratio"]) == (8.0, 2.0)  # median 1 s; 2 / 1
    assert (rows["decode_static"]["target"], rows["decode_static"]["decision"]) == (0.95, "met")  # IQR 1.5-2
    assert (rows["decode_padded"]["value"], rows["decode_padded"]["ratio"]) == (32.0, 1.0)  # 8 sequences x 8 tokens
    assert [rows[name]["decision"] for name in ("forward", "train_step", "peak_memory", "decode")] \
        == ["missed", "undecided", "missed", "missed"]  # forward's IQR 2.5-4 > 1.05; the step's 0.75-1.5 holds 1.10
    table = format_table(result)
    assert "| fem-lm-tiny | forward (s) | 3 | 1 | 3.000 | 2.500-4.000 | <= 1.05 | missed |" in table
    assert "WARNING" in table and "fem-lm-tiny forward" in table.splitlines()[-1]


def test_a_quiet_run_carries_no_warning_and_a_target_bounds_tokens_per_second_from_below():
    quiet = timed_row("a", "decode", seconds=[1.0, 1.0, 1.0], baseline=[0.9, 0.9, 0.9], target=0.85, per_call=10)
    assert (quiet.value, quiet.baseline, quiet.ratio, quiet.decision, quiet.busy) == (10.0, 10 / 0.9, 0.9, "met",
                                                                                          False)
    result = {"title": "t", "rows": [asdict(quiet)], "notes": []}
    assert "WARNING" not in format_table(result) and "| >= 0.85 | met |" in format_table(result)


def test_bench_refuses_architectures_without_an_entry_and_presets_of_other_models(monkeypatch):
    monkeypatch.setitem(ARCHITECTURES, "hyperset", replace(ARCHITECTURES["hyperset"], bench=None))
    with pytest.raises(ValueError, match="'hyperset' has no bench entry in the registry; benched: eer-looped, "
                                         "eqt-llama, fem, tel-gpt2, tel-resnet, tel-vit$"):
        run_bench("hyperset")
    with pytest.raises(ValueError, match="'llama-tiny' is a 'llama' preset"):
        run_bench("llama-tiny")
    with pytest.raises(ValueError, match="tel-gpt2-tiny sweeps nothing"):
        run_bench("tel-gpt2-tiny", sweep=(1, 2))


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


def test_profile_lists_the_operators_of_one_call_per_model(capsys, tmp_path):
    """One forward of each looped model (T = 25 block applications, each with one GELU) after the warm-up call; the
    summary counts the operators the call issued, as torch.profiler records them here apart."""
    output = tmp_path / "profile.json"
    assert main(["bench", "eer-induction", "--profile", "forward", "--batch-size", "2", "--seq-len", "8",
                 "--output", str(output)]) == 0
    shown = capsys.readouterr().out.split("== ")[1:]
    assert [section.split(",")[0] for section in shown] == ["eer-looped-gpt2 (baseline)", "eer-induction"]
    result = speed.profile_split("eer-induction", "forward", BenchSettings(batch_size=2, seq_len=8), row_limit=-1)
    for section in result["tables"].split("== ")[1:]:
        (gelu,) = [line.split() for line in section.splitlines() if line.strip().startswith("aten::gelu ")]
        assert int(gelu[-1]) == 25
    saved = json.loads(output.read_text())
    assert [entry["model"] for entry in saved["models"]] == ["eer-looped-gpt2 (baseline)", "eer-induction"]
    model = model_from_preset("eer-induction").eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    with torch.no_grad():
        model(ids, use_cache=False)
        with torch.profiler.profile() as profiler:
            model(ids, use_cache=False)
    issued = [event for event in profiler.events() if event.name.startswith("aten::")
              and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::"))]
    assert saved["models"][1]["operators"] == len(issued)
    with pytest.raises(ValueError, match="--profile peak_memory: eer-looped times forward, train_step, decode$"):
        speed.profile_split("eer-looped", "peak_memory")


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


@pytest.mark.slow
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
    from energyzoo.bench.speed import _build

    settings = BenchSettings(overrides={"prior": "ssm", "kernel": "torch"}, seq_len=16)
    fem, llama = _build(Arm("fem-lm-tiny", "fem-lm-tiny"), settings), _build(Arm("b", "llama-tiny", baseline=True),
                                                                             settings)
    assert (fem.config.prior, fem.config.kernel) == ("ssm", "torch")
    assert fem.config._attn_implementation == "sdpa" and llama.config._attn_implementation == "sdpa"
    assert type(fem.model.layers[0].self_attn).__name__ == "FEMAttention"
    assert fem.model.layers[0].self_attn.dt_proj is not None
    assert llama.config.model_type == "llama"


@pytest.mark.parametrize(("prior", "growth", "target", "meets"),
                         [("gla", 4.0, 4.5, "met"), ("softmax", 16.0, None, None)])
def test_a_length_sweep_pairs_each_length_with_the_baseline_and_bounds_an_o_t_priors_growth(monkeypatch, prior,
                                                                                           growth, target, meets):
    """On a scripted clock where a forward takes as many seconds as it reads tokens (their square for softmax
    attention, the Llama baseline's included): FEM's ratio to Llama at each length, and its growth from the shortest
    to the longest, bounded by 1.125x the length ratio for an O(T) prior only."""
    seen, now = [], [0.0]
    forward_fn = speed._forward_fn
    monkeypatch.setattr(speed, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def recording_forward_fn(model, inputs, call):
        def forward():
            length, spec = inputs["input_ids"].shape[1], getattr(model.config, "prior_spec", None)
            seen.append((length, "llama" if spec is None else spec.name))
            forward_fn(model, inputs, call)()
            now[0] += float(length ** (2 if spec is None or spec.quadratic else 1))  # Llama: softmax attention
        return forward

    monkeypatch.setattr(speed, "_forward_fn", recording_forward_fn)
    settings = BenchSettings(batch_size=1, repeats=3, workloads=("forward",), overrides={"prior": prior})
    result = run_bench("fem-lm-tiny", settings, sweep=(32, 128))
    own = {length: float(length ** (2 if PRIORS[prior].quadratic else 1)) for length in (32, 128)}
    assert [(row["arm"], row["ratio"], row["target"], row["decision"]) for row in result["rows"]] == [
        ("fem-lm-tiny seq_len=32", own[32] / 32**2, 1.05, "met"),  # softmax: Llama's time; GLA: less
        ("fem-lm-tiny seq_len=128", own[128] / 128**2, 1.05, "met"),
        ("fem-lm-tiny seq_len=128 vs fem-lm-tiny seq_len=32", growth, target, meets)]
    assert {length for length, _ in seen} == {32, 128}
    assert "| fem-lm-tiny seq_len=128 vs fem-lm-tiny seq_len=32 | forward (s) |" in format_table(result)


def test_a_length_asked_for_replaces_the_entrys_length_sweep(monkeypatch):
    monkeypatch.setattr(speed, "_paired_times", lambda fns, repeats, device: {key: [1.0] for key in fns})
    result = run_bench("fem-lm-tiny", BenchSettings(batch_size=1, seq_len=8, repeats=1, workloads=("forward",)))
    assert [row["arm"] for row in result["rows"]] == ["fem-lm-tiny"]


def test_tel_bench_rows_compare_equal_size_models():
    settings = BenchSettings(batch_size=1, seq_len=16, repeats=2, workloads=("forward", "train_step"))
    result = run_bench("tel-gpt2-tiny", settings, baseline="gpt2-tiny")
    head, step = result["rows"]
    assert (head["arm"], head["workload"], head["target"]) == ("tel-gpt2-tiny", "forward", 1.05)
    assert (step["arm"], step["workload"], step["target"]) == ("tel-gpt2-tiny", "train_step", 1.05)
    seconds = result["raw_seconds"]["forward"]
    paired = zip(seconds["tel-gpt2-tiny"], seconds["gpt2-tiny (baseline)"])
    assert head["ratio"] == statistics.median(tel / gpt2 for tel, gpt2 in paired)
    with torch.device("meta"):
        models = [model_from_preset(name) for name in ("gpt2-tiny", "tel-gpt2-tiny")]
    sizes = [sum(p.numel() for p in model.parameters()) for model in models]
    assert 0 < sizes[1] - sizes[0] < 0.005 * sizes[0]  # equal size: TEL adds its few temperatures and gates
    assert "| tel-gpt2-tiny | forward (s) |" in format_table(result) and "<= 1.05" in format_table(result)


def test_eqt_bench_gives_the_median_paired_ratio_at_every_k_and_its_linear_fit(monkeypatch):
    scripted = {"llama-tiny (baseline)": [1.0, 2.0, 1.0], "eqt-llama-tiny refinement_steps=0": [1.0, 2.0, 1.0],
                "eqt-llama-tiny refinement_steps=2": [2.0, 6.0, 2.0],
                "eqt-llama-tiny refinement_steps=4": [3.0, 6.0, 5.0]}
    monkeypatch.setattr(speed, "_paired_times", lambda fns, repeats, device: {key: scripted[key] for key in fns})
    result = run_bench("eqt-llama-tiny", BenchSettings(batch_size=1, seq_len=8, repeats=3, workloads=("forward",)),
                       sweep=(0, 2, 4))
    # medians of (1, 1, 1), (2, 3, 2), (3, 3, 5): on the line 1 + 0.5 K exactly
    assert [(row["arm"], row["ratio"]) for row in result["rows"]] == [
        ("eqt-llama-tiny refinement_steps=0", 1.0), ("eqt-llama-tiny refinement_steps=2", 2.0),
        ("eqt-llama-tiny refinement_steps=4", 3.0)]
    assert [row["target"] for row in result["rows"]] == [None, None, None]  # K = 8 (the target's) was not measured
    assert result["notes"] == ["linear fit of the forward ratio: 1.000 + 0.5000 refinement_steps (largest deviation "
                               "0.000)"]
    assert result["notes"][0] in format_table(result)


def test_eqt_trains_at_its_own_settings_in_the_bench_against_the_papers_bound(monkeypatch):
    """The K sweep is the forward workload's; a train step runs the config's K_train = 2 with every energy, bounded
    by 1.3x its Llama; a config without one of the energies is reported without that bound."""
    scripted = {"llama-tiny (baseline)": [2.0, 2.0, 2.0], "eqt-llama-tiny": [2.0, 2.4, 2.2]}
    calls = []
    train_step_fn = speed._train_step_fn

    def recording_train_step_fn(model, inputs, call):
        calls.append((model.config.model_type, call))
        return train_step_fn(model, inputs, call)

    monkeypatch.setattr(speed, "_train_step_fn", recording_train_step_fn)
    monkeypatch.setattr(speed, "_paired_times", lambda fns, repeats, device: {key: scripted[key] for key in fns})
    settings = BenchSettings(batch_size=1, seq_len=8, repeats=3, workloads=("train_step",))
    (row,) = run_bench("eqt-llama-tiny", settings)["rows"]
    assert (row["arm"], row["ratio"], row["target"], row["decision"]) == ("eqt-llama-tiny", 1.1, 1.3, "met")
    assert calls == [("llama", {}), ("eqt-llama", {})]
    settings.overrides = {"lambda_mem": 0.0}
    assert run_bench("eqt-llama-tiny", settings)["rows"][0]["target"] is None


@pytest.mark.slow
def test_the_offload_bench_loads_each_checkpoint_whole_and_part_on_disk_in_fresh_processes(tmp_path):
    """`energyzoo bench PRESET --offload`: each (checkpoint dtype, loading dtype) whole and offloaded, the offloaded
    model's blocks partly on disk, its tokens the whole model's; each peak a process's own (a parent's larger peak
    would be inherited by ``ru_maxrss``)."""
    ballast = torch.ones(2**30, dtype=torch.uint8)  # 1 GiB resident in this process, none of it in the children's
    ballast.add_(1)
    result = run_offload_bench("fem-lm-tiny", "1MB", ("float32", "bfloat16"), folder=str(tmp_path))
    rows = result["rows"]
    assert [(row["checkpoint"], row["dtype"], row["loading"]) for row in rows] == [
        (checkpoint, dtype, loading) for checkpoint, dtype in
        [("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")] for loading in LOADINGS]
    for row in rows:
        assert len(row["tokens"]) == NEW_TOKENS and row["tokens_equal_whole"]
        assert ("disk" in row["devices"]) == (row["loading"] == "offloaded")
        assert 0 < row["peak_rss_bytes"] < 2**30
    assert format_offload_table(result).count("| yes |") == len(rows)


def test_the_offload_bench_takes_one_language_model_preset(capsys):
    for name in ("fem", "hyperset-digits-tiny"):
        assert main(["bench", name, "--offload", "1MB"]) == 2
        assert "--offload takes one language-model preset as NAME" in capsys.readouterr().err
