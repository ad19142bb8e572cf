"""EqT's runs: the parity data (eq. 44), the CPU parity reproduction end to end, and the K-sweep bench."""

import json

import torch

from energyzoo.eval.speed import format_eqt_table, run_eqt_vs_llama
from energyzoo.reproduce.eqt_parity import ParitySettings, run_parity, write_report
from energyzoo.training.data import PARITY_END_TOKEN, cumulative_parity_split


def test_parity_labels_are_the_running_xor_scored_one_position_ahead():
    ids, labels, validation_ids, validation_labels = cumulative_parity_split(50, 12, 0.2, seed=3)
    assert ids.shape == (40, 13) and validation_ids.shape == (10, 13)
    assert (ids[:, -1] == PARITY_END_TOKEN).all() and (labels[:, 0] == -100).all()
    for row, label in zip(ids.tolist(), labels.tolist()):
        parity = 0
        for t, bit in enumerate(row[:-1]):
            parity ^= bit
            assert label[t + 1] == parity


def test_parity_reproduction_writes_its_table(tmp_path):
    settings = ParitySettings(lengths=[8], seeds=[0], steps=20, eqt_steps=[0, 2], test_sequences=64)
    report = run_parity(settings, tmp_path, progress=lambda message: None)
    paths = write_report(report, tmp_path)
    row = report["rows"][0]
    assert set(row) == {"length", "seed", "llama", "eqt_K0", "eqt_K2"}
    assert all(0.0 <= row[key] <= 1.0 for key in ("llama", "eqt_K0", "eqt_K2"))
    assert json.loads(paths["json"].read_text())["summary"][0]["length"] == 8
    assert "| 8 |" in paths["markdown"].read_text() and paths["plot"].stat().st_size > 0


def test_eqt_bench_times_every_k_against_llama():
    torch.set_num_threads(1)
    result = run_eqt_vs_llama("eqt-llama-tiny", steps=(0, 2, 4), batch_size=1, seq_len=32, repeats=1)
    assert set(result["ratios"]) == {0, 2, 4} and all(ratio > 0 for ratio in result["ratios"].values())
    assert result["meets_target"] is None  # K = 8 was not measured
    assert "linear fit" in format_eqt_table(result)
