"""The ledger of `energyzoo reproduce all`: every experiment's verdicts in one place, counted, with each
experiment's quick setting a valid set of overrides of its settings."""

import json

import pytest

from energyzoo.reproduce.experiments import EXPERIMENTS
from energyzoo.reproduce.report import ledger_markdown, run_experiment, write_ledger
from energyzoo.reproduce.verdict import Claim, judged
from energyzoo.training.recipe import typed_settings

CLAIM = Claim("A beats B", "paper Table 1", "a", "b", "accuracy", chance=0.0, ceiling=1.0)


def test_the_ledger_counts_and_lists_every_experiments_verdicts(tmp_path):
    reports = {
        "tel-stage1": {"seconds": 120.0, "verdicts": [judged(CLAIM, [0.8, 0.81, 0.82], [0.7, 0.7, 0.71]),
                                                      judged(CLAIM, [0.6, 0.8, 0.7], [0.7, 0.7, 0.7])]},
        "eqt-parity": {"seconds": 60.0, "verdicts": [judged(CLAIM, [0.5, 0.51, 0.5], [0.7, 0.71, 0.72])]},
    }
    markdown = ledger_markdown(reports, quick=True)
    assert markdown.splitlines()[0] == ("Reproduction ledger (quick settings, 3 min): 1 reproduced, 1 not reproduced, "
                                        "1 inconclusive.")
    assert markdown.count("| A beats B (paper Table 1) |") == 3
    assert markdown.index("**tel-stage1**") < markdown.index("**eqt-parity**")
    assert "(2.0 min)" in markdown and "(1.0 min)" in markdown
    paths = write_ledger(reports, tmp_path, quick=True)
    saved = json.loads(paths["json"].read_text())
    assert saved["quick"] is True
    assert [record["verdict"] for record in saved["experiments"]["tel-stage1"]["verdicts"]] == [
        "reproduced", "inconclusive"]
    assert paths["markdown"].read_text() == markdown + "\n"


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_quick_setting_is_a_valid_override_set_with_three_seeds(name):
    experiment = EXPERIMENTS[name]
    assert all(callable(getattr(experiment.code(), part)) for part in ("Settings", "run", "format_markdown", "plot"))
    settings = typed_settings(experiment.code().Settings, list(experiment.quick))
    seeds = settings.seeds
    assert (seeds if isinstance(seeds, int) else len(seeds)) >= 3


def test_run_experiment_applies_the_quick_setting_before_the_command_lines(tmp_path):
    report = run_experiment("tel-stage1", ["datasets=[wine]", "widths=[8]", "epochs=2"], tmp_path, quick=True,
                            progress=lambda message: None)
    assert report["settings"]["seeds"] == 3 and report["settings"]["widths"] == (8,)  # quick's seeds, our widths
    assert len(report["verdicts"]) == 1 and (tmp_path / "tel_stage1.md").is_file()


def test_a_finished_report_with_the_same_settings_is_reused_and_other_settings_rerun(tmp_path):
    overrides = ["datasets=[wine]", "widths=[8]", "epochs=2", "seeds=1"]
    first = run_experiment("tel-stage1", overrides, tmp_path, progress=lambda message: None)
    messages = []
    again = run_experiment("tel-stage1", overrides, tmp_path, progress=messages.append, reuse=True)
    assert messages == [f"tel-stage1: reusing the report in {tmp_path / 'tel_stage1.json'} (same settings)"]
    assert again["verdicts"] == json.loads(json.dumps(first["verdicts"])) and again["seconds"] == first["seconds"]
    rerun = run_experiment("tel-stage1", [*overrides[:-1], "seeds=2"], tmp_path, progress=lambda message: None,
                           reuse=True)
    assert rerun["settings"]["seeds"] == 2 and len(rerun["verdicts"]) == 1


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
    assert report["verdicts"][0]["reason"] == "1 seed; a verdict needs >= 3"
