"""`energyzoo reproduce tel-stage1`: its report and its embedded datasets."""

import json
import math
import statistics

import pytest

from energyzoo.cli import main
from energyzoo.reproduce.tel_stage1 import MODELS, load_task


@pytest.mark.slow
def test_reproduce_tel_stage1_writes_a_consistent_report(tmp_path):
    code = main(["reproduce", "tel-stage1", "datasets=[wine,swiss_roll]", "widths=[4,8]", "seeds=2",
                 "selection_seeds=1", "max_epochs=30", "learning_rates=[3e-3]", "dropouts=[0.0,0.2]",
                 "weight_decays=[0.01]", "--output-dir", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "tel_stage1.json").read_text())
    records = report["records"]
    assert len(records) == 2 * 2 * len(MODELS) * 2
    # G.1's grid: per cell and model one configuration, the one best on the selection seed's validation metric
    for dataset in ("wine", "swiss_roll"):
        for kind in MODELS:
            for width in (4, 8):
                chosen = {r["dropout"] for r in records if r["dataset"] == dataset and r["model"] == kind
                          and r["width"] == width}
                assert len(chosen) == 1 and chosen <= {0.0, 0.2}
    for row in report["summary"]:
        values = {kind: [r["value"] for r in records if r["dataset"] == row["dataset"] and r["model"] == kind
                         and r["width"] == row["width"]] for kind in MODELS}
        for kind in MODELS:
            assert row[kind]["mean"] == pytest.approx(statistics.fmean(values[kind]))
        pick = max if row["metric"] == "accuracy" else min
        assert row["best"] == pick(MODELS, key=lambda kind: row[kind]["mean"])
    count, *cells = report["verdicts"]  # the primary count claim, then TEL vs its MLP per cell
    assert count["claim"]["kind"] == "wins" and count["claim"]["primary"]
    # its unit is the dataset: the share of the dataset's widths where TEL's mean is the best of the three
    shares = [statistics.fmean(float(row["best"] == "tel") for row in report["summary"] if row["dataset"] == dataset)
              for dataset in ("wine", "swiss_roll")]
    assert count["values"]["arm"] == shares
    assert count["reason"] == "2 units; a verdict needs >= 5"  # two datasets
    for row, verdict in zip(report["summary"], cells, strict=True):
        assert (verdict["dataset"], verdict["width"]) == (row["dataset"], row["width"])
        log = (lambda value: value) if row["metric"] == "accuracy" else math.log  # errors are judged as logs
        cell = [r for r in records if (r["dataset"], r["width"]) == (row["dataset"], row["width"])]
        assert verdict["arm"][0] == pytest.approx(statistics.fmean(map(log, [
            r["value"] for r in cell if r["model"] == "tel"])))
        assert verdict["baseline"][0] == pytest.approx(statistics.fmean(map(log, [
            r["value"] for r in cell if r["model"] == "mlp"])))
        assert verdict["verdict"] == "inconclusive" and verdict["reason"] == "2 seeds; a verdict needs >= 5"
    assert cells[0]["claim"]["chance"] == pytest.approx(71 / 178)  # wine's majority class
    assert cells[2]["claim"]["metric"] == "log mse" and cells[2]["claim"]["effect"] == 0.07  # H.1's relative spread
    _, wine, _, roll = report["summary"]  # the width-8 rows
    assert wine["metric"] == "accuracy" and wine["mlp"]["mean"] > 0.7  # 3 classes: chance is ~0.4
    assert roll["metric"] == "mse" and roll["tel"]["mean"] < 1.0  # below predicting the (standardised) mean
    markdown = (tmp_path / "tel_stage1.md").read_text()
    assert markdown.count("| wine |") == 2 and markdown.count("| swiss_roll |") == 2
    assert "Cells: 0 reproduced, 0 not reproduced, 0 contradicted at this scale, 4 inconclusive" in markdown
    assert (tmp_path / "tel_stage1.png").read_bytes()[:4] == b"\x89PNG"
    trace = report["traces"]["wine"]
    assert len(trace["train"]["temperature"]) == 5
    assert len(set(trace["eval"]["temperature"])) == 1  # frozen at inference (Algorithm 1 line 14)
    assert trace["train"]["temperature"][1] != trace["train"]["temperature"][0]  # dual update (eq. 9)


def test_stage1_datasets_are_the_embedded_ones():
    assert load_task("digits").features.shape == (1797, 64)
    assert load_task("s_curve").kind == "reconstruction" and load_task("s_curve").features.shape[1] == 3
    with pytest.raises(ValueError, match="unknown Stage I dataset"):
        load_task("mnist")


def test_a_stopped_run_resumes_at_its_unfinished_cells_and_reports_what_an_uninterrupted_one_does(
        tmp_path, monkeypatch):
    """The finished cells of a run stopped after two cells are read back (their settings and code unchanged); the
    others are trained; the report's records equal those of a run that was never stopped."""
    from energyzoo.reproduce import tel_stage1

    settings = tel_stage1.Settings(datasets=("wine",), widths=(8, 16), seeds=2, selection_seeds=1, max_epochs=4,
                                   learning_rates=(3e-3,), dropouts=(0.0,), weight_decays=(0.01,), workers=1)
    whole = tel_stage1.run(settings, tmp_path / "whole", progress=lambda line: None)
    cell, calls = tel_stage1._cell, []

    def stopping_cell(*args):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the session's end
        calls.append(args)
        return cell(*args)

    monkeypatch.setattr(tel_stage1, "_cell", stopping_cell)
    with pytest.raises(KeyboardInterrupt):
        tel_stage1.run(settings, tmp_path / "stopped", progress=lambda line: None)
    monkeypatch.setattr(tel_stage1, "_cell", lambda *args: calls.append(args) or cell(*args))
    lines = []
    resumed = tel_stage1.run(settings, tmp_path / "stopped", progress=lines.append)
    assert lines[0].startswith("tel-stage1: 2 of 6 cells read back")
    assert [args[2:] for args in calls] == [("wine", 8, "linear"), ("wine", 8, "mlp"), ("wine", 8, "tel"),
                                            ("wine", 16, "linear"), ("wine", 16, "mlp"), ("wine", 16, "tel")]
    assert resumed["records"] == whole["records"] and resumed["traces"] == whole["traces"]
    other_lines = []
    other = tel_stage1.run(tel_stage1.Settings(**{**settings.__dict__, "max_epochs": 3}), tmp_path / "stopped",
                           progress=other_lines.append)  # other settings: nothing is read back
    assert not any("read back" in line for line in other_lines) and other["records"] != whole["records"]
