"""`energyzoo reproduce tel-stage1` and the TEL rows of `energyzoo bench`."""

import json
import statistics

import pytest

from energyzoo.cli import main
from energyzoo.eval.speed import format_tel_table, run_tel_vs_vanilla
from energyzoo.reproduce.tel_stage1 import MODELS, load_task


def test_reproduce_tel_stage1_writes_a_consistent_report(tmp_path):
    code = main(["reproduce", "tel-stage1", "--output-dir", str(tmp_path), "--datasets", "wine", "swiss_roll",
                 "--widths", "8", "--seeds", "2", "--epochs", "30"])
    assert code == 0
    report = json.loads((tmp_path / "tel_stage1.json").read_text())
    records = report["records"]
    assert len(records) == 2 * 1 * len(MODELS) * 2
    for row in report["summary"]:
        values = {kind: [r["value"] for r in records if r["dataset"] == row["dataset"] and r["model"] == kind]
                  for kind in MODELS}
        for kind in MODELS:
            assert row[kind]["mean"] == pytest.approx(statistics.fmean(values[kind]))
        pick = max if row["metric"] == "accuracy" else min
        assert row["best"] == pick(MODELS, key=lambda kind: row[kind]["mean"])
    wine, roll = report["summary"]
    assert wine["metric"] == "accuracy" and wine["mlp"]["mean"] > 0.7  # 3 classes: chance is ~0.4
    assert roll["metric"] == "mse" and roll["tel"]["mean"] < 1.0  # below predicting the (standardised) mean
    markdown = (tmp_path / "tel_stage1.md").read_text()
    assert markdown.count("| wine |") == 1 and markdown.count("| swiss_roll |") == 1
    assert (tmp_path / "tel_stage1_traces.png").read_bytes()[:4] == b"\x89PNG"
    trace = report["traces"]["wine"]
    assert len(trace["train"]["temperature"]) == 5
    assert len(set(trace["eval"]["temperature"])) == 1  # frozen at inference (Algorithm 1 line 14)
    assert trace["train"]["temperature"][1] != trace["train"]["temperature"][0]  # dual update (eq. 9)


def test_stage1_datasets_are_the_embedded_ones():
    assert load_task("digits").features.shape == (1797, 64)
    assert load_task("s_curve").kind == "reconstruction" and load_task("s_curve").features.shape[1] == 3
    with pytest.raises(ValueError, match="unknown Stage I dataset"):
        load_task("mnist")


def test_tel_bench_rows_compare_equal_size_models():
    result = run_tel_vs_vanilla(baseline="gpt2-tiny", variants=("tel-gpt2-tiny",), batch_size=1, seq_len=16, repeats=2)
    baseline, head = result["rows"]["gpt2-tiny"], result["rows"]["tel-gpt2-tiny"]
    assert baseline["ratio"] == 1.0 and head["ratio"] > 0 and head["target"] == 1.05
    assert 0 < head["parameters"] - baseline["parameters"] < 0.005 * baseline["parameters"]
    table = format_tel_table(result)
    assert "| tel-gpt2-tiny |" in table and "<= 1.05" in table
