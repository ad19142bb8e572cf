"""The ledger of `energyzoo reproduce all`: every experiment's verdicts in one place, counted, with each
experiment's quick setting a valid set of overrides of its settings."""

import json
from pathlib import Path

import pytest

from energyzoo.measured import measured_ledger
from energyzoo.modeling.errors import UserError
from energyzoo.reproduce import ledger_tables
from energyzoo.reproduce.experiments import EXPERIMENTS
from energyzoo.reproduce.report import build_ledger, code_state, ledger_markdown, run_experiment, write_ledger
from energyzoo.reproduce.verdict import MIN_SEEDS, Claim, judged
from energyzoo.training.recipe import typed_settings

CLAIM = Claim("A beats B", "paper Table 1", "a", "b", "accuracy", effect=0.02, effect_source="half the gap",
              chance=0.0, ceiling=1.0)
FIVE = [0.0, 0.01, -0.01, 0.005, -0.005]


def _report(name: str, setting: str, seconds: float, *pairs) -> dict:
    """A report of experiment ``name`` as this checkout's code would have written it."""
    return {"setting": setting, "seconds": seconds, "settings": {"seeds": 5}, "machine": "here", "packages": {},
            "code": code_state(name), "verdicts": [judged(CLAIM, arm, baseline) for arm, baseline in pairs]}


def test_the_ledger_decides_every_verdict_together_and_counts_smoke_apart(tmp_path):
    reports = {
        "fem-argmax": _report("fem-argmax", "full", 120.0, ([0.80 + d for d in FIVE], [0.70 + d / 2 for d in FIVE]),
                              ([0.70 + d for d in FIVE], [0.70 - d for d in FIVE])),
        "hyperset": _report("hyperset", "quick", 60.0, ([0.5 + d for d in FIVE], [0.7 + d for d in FIVE])),
    }
    ledger = build_ledger(reports, command="energyzoo reproduce all hyperset=quick")
    verdicts = [record["verdict"] for report in ledger["experiments"].values() for record in report["verdicts"]]
    assert verdicts == ["reproduced", "not reproduced", "smoke"]  # the second: a true zero excludes the effect
    assert ledger["tested"] == 2  # FEM's family: its two full-setting claims
    first = ledger["experiments"]["fem-argmax"]["verdicts"][0]
    raw = [record["p"] for record in ledger["experiments"]["fem-argmax"]["verdicts"]]
    assert first["p_adjusted"] == pytest.approx(min(1.0, 2 * min(raw)))  # Holm's first step over two claims
    assert ledger["provenance"]["seconds"] == 180.0 and ledger["provenance"]["packages"]["torch"]
    markdown = ledger_markdown(ledger)
    assert markdown.splitlines()[0] == (
        "Reproduction ledger (1 full, 1 quick settings, 3 min): 1 reproduced, 1 not reproduced; 1 smoke rows (quick "
        "settings: no verdicts). Verdicts need >= 5 seeds and p <= 0.05: each paper's primary claim first, its "
        "secondary claims Holm-adjusted where the primary is decided (2 claims tested in all).")
    assert markdown.count("| A beats B (paper Table 1; secondary) |") == 3
    assert markdown.index("**fem-argmax** (full setting, 2.0 min)") < markdown.index("**hyperset** (quick")
    paths = write_ledger(ledger, tmp_path)
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(ledger))
    assert paths["markdown"].read_text() == markdown + "\n"


def test_a_report_of_other_code_is_refused_by_name_and_its_files():
    report = _report("fem-argmax", "full", 1.0, ([0.8 + d for d in FIVE], [0.7 + d for d in FIVE]))
    assert build_ledger({"fem-argmax": report}, "same code")["experiments"]["fem-argmax"]["code"] == report["code"]
    edited = {**report, "code": {**report["code"], "dirty": True, "experiment_diff_sha256": "0" * 64,
                                 "changed_files": ["energyzoo/reproduce/fem_argmax.py", "README.md"]}}
    with pytest.raises(UserError, match=r"fem-argmax \([^)]*energyzoo/reproduce/fem_argmax.py") as refused:
        build_ledger({"fem-argmax": edited}, "edited at the run")
    assert "README.md" not in str(refused.value)  # not one of its files
    unknown = {**report, "code": None}
    with pytest.raises(UserError, match="not a git checkout"):
        build_ledger({"fem-argmax": unknown}, "installed")
    assert {"energyzoo/reproduce/fem_argmax.py", "energyzoo/modeling/fem_free_energy.py"} <= set(
        EXPERIMENTS["fem-argmax"].code_paths())
    assert "energyzoo/training" not in EXPERIMENTS["fem-argmax"].code_paths()  # it trains in its own loop
    assert "energyzoo/training" in EXPERIMENTS["eer-induction"].code_paths()
    assert not any("tel_" in path or "hyperset" in path for path in EXPERIMENTS["fem-argmax"].code_paths())
    assert "energyzoo/data/induction.py" in EXPERIMENTS["eer-induction"].code_paths()
    assert "energyzoo/data/sudoku.py" not in EXPERIMENTS["eer-induction"].code_paths()  # Hyper-SET's data only


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_setting_is_a_valid_override_set_and_the_full_one_has_five_seeds(name):
    experiment = EXPERIMENTS[name]
    assert all(callable(getattr(experiment.code(), part)) for part in ("Settings", "run", "format_markdown", "plot"))
    for setting, fewest in (("quick", 3), ("full", MIN_SEEDS), ("paper-scale", MIN_SEEDS)):
        if setting == "paper-scale" and not experiment.paper_scale:
            with pytest.raises(UserError, match="no paper-scale setting"):
                experiment.overrides(setting)
            continue
        seeds = typed_settings(experiment.code().Settings, list(experiment.overrides(setting))).seeds
        assert (seeds if isinstance(seeds, int) else len(seeds)) >= fewest


def test_run_experiment_applies_the_quick_setting_before_the_command_lines(tmp_path):
    report = run_experiment("tel-stage1", ["datasets=[wine]", "widths=[8]", "max_epochs=2"], tmp_path, "quick",
                            progress=lambda message: None)
    assert report["settings"]["seeds"] == 3 and report["settings"]["widths"] == (8,)  # quick's seeds, our widths
    assert report["settings"]["learning_rates"] == (3e-3,) and report["setting"] == "quick"
    assert [record["verdict"] for record in report["verdicts"]] == ["smoke", "smoke"]  # the count, the cell
    assert (tmp_path / "tel_stage1.md").is_file()


def test_a_finished_report_with_the_same_settings_is_reused_and_other_settings_rerun(tmp_path):
    overrides = ["datasets=[wine]", "widths=[8]", "max_epochs=2", "seeds=1", "selection_seeds=1",
                 "learning_rates=[3e-3]", "dropouts=[0.0]", "weight_decays=[0.01]"]
    first = run_experiment("tel-stage1", overrides, tmp_path, progress=lambda message: None)
    messages = []
    again = run_experiment("tel-stage1", overrides, tmp_path, progress=messages.append, reuse=True)
    assert messages == [f"tel-stage1: reusing the report in {tmp_path / 'tel_stage1.json'} (same settings, same code)"]
    assert again["verdicts"] == json.loads(json.dumps(first["verdicts"])) and again["seconds"] == first["seconds"]
    rerun = run_experiment("tel-stage1", [*overrides[:3], "seeds=2", *overrides[4:]], tmp_path,
                           progress=lambda message: None, reuse=True)
    assert rerun["settings"]["seeds"] == 2 and len(rerun["verdicts"]) == 2  # the count and the one cell


def test_fem_argmax_data_metric_and_arms_follow_app_p(tmp_path):
    """App. P's samples (one winner per channel at Delta + eps, the target its max), the index accuracy against a
    hand count, the arms' switches and fixed identity value maps, and a report with its verdict."""
    import torch

    from energyzoo.reproduce.fem_argmax import Mixer, argmax_samples, index_accuracy
    from energyzoo.reproduce.fem_argmax import Settings as ArgmaxSettings
    from energyzoo.reproduce.fem_argmax import run as run_argmax

    settings = ArgmaxSettings(seeds=[0], length=8, channels=16, heads=2, steps=3, validation_samples=20)
    values, winners, targets = argmax_samples(5, settings, torch.Generator().manual_seed(0))
    assert torch.equal(values.argmax(dim=1), winners) and torch.equal(targets, values.amax(dim=1))
    assert ((targets - 1).abs() < 0.3).all() and (values.abs() < 0.3).float().mean() > 0.8
    assert index_accuracy(values, winners, targets) == 1.0
    assert index_accuracy(values, winners, torch.zeros_like(targets)) < 0.3  # zero is nearest to the noise
    softmax, fem = Mixer("softmax", settings).attention, Mixer("fem", settings).attention
    assert softmax.temperature_proj is None and "beta_max_raw" not in dict(softmax.named_parameters())
    assert not softmax.config.use_lse and fem.config.use_lse and fem.temperature_proj is not None
    assert fem.outer_gate_proj is None and fem.time_decay is None
    assert torch.equal(fem.v_proj.weight, torch.eye(16)) and not fem.o_proj.weight.requires_grad
    report = run_argmax(settings, progress=lambda message: None)
    assert [row["arm"] for row in report["rows"]] == ["softmax", "fem"]
    assert report["verdicts"][0]["reason"] == f"1 seed; a verdict needs >= {MIN_SEEDS}"


def test_the_ledger_verb_assembles_committed_reports_and_refuses_a_damaged_one(tmp_path, capsys):
    from energyzoo.cli import main

    report = _report("fem-argmax", "full", 1.0, ([0.8 + d for d in FIVE], [0.7 + d for d in FIVE]))
    (tmp_path / "fem-argmax").mkdir()
    (tmp_path / "fem-argmax" / "fem_argmax.json").write_text(json.dumps(report))
    assert main(["reproduce", "ledger", "--output-dir", str(tmp_path)]) == 0
    assert "no report of fem-lm, fem-mad" in capsys.readouterr().out
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert list(ledger["experiments"]) == ["fem-argmax"] and ledger["command"] == "energyzoo reproduce ledger"
    assert ledger["experiments"]["fem-argmax"]["verdicts"][0]["verdict"] == "reproduced"
    (tmp_path / "fem-argmax" / "fem_argmax.json").write_text(json.dumps(report)[:100])
    assert main(["reproduce", "ledger", "--output-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "fem_argmax.json is not a report (invalid JSON" in error[0]


def test_a_report_of_other_code_is_kept_marked_when_asked():
    report = _report("fem-argmax", "full", 1.0, ([0.8 + d for d in FIVE], [0.7 + d for d in FIVE]))
    edited = {**report, "code": {**report["code"], "dirty": True, "experiment_diff_sha256": "0" * 64,
                                 "changed_files": ["energyzoo/reproduce/fem_argmax.py"]}}
    ledger = build_ledger({"fem-argmax": edited}, "kept", keep_other_code=True)
    other = ledger["experiments"]["fem-argmax"]["other_code"]
    assert "energyzoo/reproduce/fem_argmax.py" in other  # with, on a tree being edited, the files edited since
    assert f"other code than this ledger's, in {len(other)} of its files (" in ledger_markdown(ledger)


def test_the_ledger_opens_with_each_papers_primary_claim():
    primary = Claim(**{**CLAIM.__dict__, "primary": True, "quote": "A's headline"})
    report = _report("fem-argmax", "full", 1.0)
    report["verdicts"] = [judged(CLAIM, [0.8 + d for d in FIVE], [0.7 + d for d in FIVE]),
                          judged(primary, [0.71 + d for d in FIVE], [0.7 + d / 2 for d in FIVE])]
    markdown = ledger_markdown(build_ledger({"fem-argmax": report}, "primaries"))
    table = markdown.split("Each paper's primary claim:")[1].split("\n\n")[1].splitlines()
    assert table[2].startswith("| fem | A's headline (paper Table 1) | **not reproduced** | +0.01 [")
    assert table[2].endswith("| 5 | – | fem-argmax |")  # no paper effect: no power
    assert table[3] == "| tel | not in this ledger yet | – | – | – | – | – | – |"


def test_an_experiment_the_shipped_ledger_lacks_says_no_report_yet(monkeypatch):
    """An experiment added after the ledger was assembled: its family's card and page say so, instead of a KeyError."""
    shipped = measured_ledger()
    missing = next(iter(shipped["experiments"]))
    family = EXPERIMENTS[missing].family
    without = {**shipped, "experiments": {name: report for name, report in shipped["experiments"].items()
                                          if name != missing}}
    monkeypatch.setattr(ledger_tables, "measured_ledger", lambda: without)
    assert ledger_tables.NO_REPORT.format(name=missing) in ledger_tables.family_ledger(family)
    monkeypatch.setattr(ledger_tables, "measured_ledger", lambda: shipped)
    assert "No report yet" not in ledger_tables.family_ledger(family)


TINY_ARGMAX = ["seeds=[0,1]", "length=8", "channels=16", "steps=5", "batch_size=8", "validation_samples=50"]


def test_a_report_of_earlier_code_joins_a_ledger_only_with_a_replay_of_this_codes_numbers(tmp_path):
    """A report run at other code is refused; with a replay recorded at this checkout's code that gave its numbers it
    is taken unmarked, and its heading says so; a replay that differs, or one of yet other code, is refused."""
    report = _report("fem-argmax", "full", 1.0, ([0.8 + d for d in FIVE], [0.7 + d for d in FIVE]))
    earlier = {**report, "code": {**report["code"], "dirty": True, "experiment_diff_sha256": "0" * 64,
                                  "changed_files": ["energyzoo/reproduce/fem_argmax.py"]}}
    replay = {"code": code_state("fem-argmax"), "overrides": ["seeds=[0]"], "values": {"0.mse": 0.1},
              "largest_difference": 0.0, "tolerance": 0.0, "matches": True}
    ledger = build_ledger({"fem-argmax": {**earlier, "replay": replay}}, "replayed")
    assert ledger["experiments"]["fem-argmax"]["other_code"] is None
    assert "replayed (seeds=[0]) at " in ledger_markdown(ledger) and "other code" not in ledger_markdown(ledger)
    for refused in ({**replay, "matches": False, "largest_difference": 1e-3}, {**replay, "code": earlier["code"]}):
        with pytest.raises(UserError, match="ran other code than this checkout's"):
            build_ledger({"fem-argmax": {**earlier, "replay": refused}}, "replay refused")


def test_a_replay_reruns_the_designated_part_and_finds_a_moved_number(tmp_path, capsys):
    """The cheap replay CI runs: a tiny fem-argmax report, its seed 0 rerun at this code is bit-identical; a report
    whose seed-0 number was moved (as a refactor that changed the numbers would leave it) is found, in one line."""
    from energyzoo.cli import main
    from energyzoo.reproduce.report import replay_experiment

    run_experiment("fem-argmax", TINY_ARGMAX, tmp_path, progress=lambda message: None)
    replay = replay_experiment("fem-argmax", tmp_path, progress=lambda message: None)
    assert replay["matches"] and replay["largest_difference"] == 0.0 and len(replay["values"]) == 8  # 2 rows of 4
    assert json.loads((tmp_path / "fem_argmax.json").read_text())["replay"] == json.loads(json.dumps(replay))
    moved = json.loads((tmp_path / "fem_argmax.json").read_text())
    moved["rows"][0]["mse"] += 1e-6  # seed 0's softmax row
    (tmp_path / "fem_argmax.json").write_text(json.dumps(moved))
    assert main(["reproduce", "fem-argmax", "--replay", "--output-dir", str(tmp_path)]) == 1
    assert "NOT the report's (largest difference 1e-06" in capsys.readouterr().out
    assert main(["reproduce", "all", "--replay"]) == 2
    assert "--replay reruns one experiment's report" in capsys.readouterr().err


# the shipped reports whose replay fits the slow tier (about 1.5, 2 and 1 minutes); the others' parts take 5-20
# minutes and run by `energyzoo reproduce NAME --replay` when their code changes
REPLAYED_IN_CI = ("fem-argmax", "eer-block-screen", "tel-stage1")


@pytest.mark.slow
@pytest.mark.parametrize("name", REPLAYED_IN_CI)
def test_a_shipped_report_replays_at_this_checkout(name, tmp_path):
    """The shipped report's designated part (a seed or a cell) rerun with this checkout's code: the report's numbers
    to the bit. A change under the experiment's code paths that moves them fails here."""
    from energyzoo.reproduce.report import replay_experiment

    module = EXPERIMENTS[name].module
    shipped = Path(__file__).parents[1] / "reports" / name / f"{module}.json"
    (tmp_path / f"{module}.json").write_text(shipped.read_text())
    replay = replay_experiment(name, tmp_path, progress=lambda message: None)
    assert replay["matches"], {key: replay[key] for key in ("largest_difference", "tolerance")}


def _shipped_reports() -> dict[str, dict]:
    from energyzoo.reproduce.report import read_reports

    return read_reports(Path(__file__).parents[1] / "reports")


def test_a_ledger_judges_a_reports_rows_by_the_claims_that_ship():
    """The shipped eqt-parity report recorded its convergence claim (K = 8 against K = 32) before the claim passed
    K = 0: its record carries no switched-off values. A ledger derives the records afresh from the report's per-seed
    rows, so the row says what those rows show: K = 0, 8 and 32 agree, refinement is inert."""
    report = _shipped_reports()["eqt-parity"]
    recorded = next(record for record in report["verdicts"] if "K = 8 and K = 32" in record["claim"]["quote"])
    assert "mechanism_off" not in recorded["values"]
    ledger = build_ledger({"eqt-parity": report}, "derived")
    derived = next(record for record in ledger["experiments"]["eqt-parity"]["verdicts"]
                   if "K = 8 and K = 32" in record["claim"]["quote"])
    assert derived["values"]["mechanism_off"] == [row["eqt_K0"] for row in report["rows"]]
    assert derived["values"]["arm"] == recorded["values"]["arm"]
    assert derived["verdict"] == "mechanism inert at this scale"


def test_the_shipped_ledger_reassembles_from_the_shipped_reports_at_this_checkout():
    """`energyzoo reproduce ledger` with no override: every shipped report ran this checkout's experiment code or
    carries a replay at it that gave its numbers, and the ledger they make is the one that ships."""
    ledger = build_ledger(_shipped_reports(), "energyzoo reproduce ledger")
    shipped = measured_ledger()
    assert list(ledger["experiments"]) == list(shipped["experiments"])
    for name, entry in ledger["experiments"].items():
        assert entry["other_code"] is None, name
        kept = shipped["experiments"][name]
        assert [record["row"] for record in entry["verdicts"]] == [record["row"] for record in kept["verdicts"]], name
    commit = shipped["provenance"]["code"]["commit"]
    from energyzoo.reproduce.report import _git

    assert _git("merge-base", "--is-ancestor", commit, "HEAD") is not None, f"the ledger's {commit} is not in HEAD"
