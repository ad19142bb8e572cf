"""`energyzoo/bench/gpu_check.py` and `families.py` on the CPU: what can be checked without a GPU. The family check
against float64 (it passes a correct model and fails a model with other weights, on its outputs, gradients and
decoding), the gradient error's floor, the refusal without CUDA, and the report: sections in order, rewritten after
each, a failing section recorded in one line while the rest run."""

import json
import math

import pytest
import torch

from energyzoo.bench import families, gpu_check
from energyzoo.bench.families import TOLERANCE, check_family, decoding_error, gradient_error
from energyzoo.presets import model_from_preset


@pytest.mark.parametrize("preset", ["fem-lm-tiny", "hyperset-sudoku-tiny", "tel-resnet-tiny"])
def test_a_correct_model_passes_against_float64_in_float32_and_bfloat16(preset):
    checks = {dtype: check_family(preset, dtype, "cpu", decodings=("dynamic", "static"))
              for dtype in ("float32", "bfloat16")}
    for check in checks.values():
        assert check.status == "pass", check
        assert set(check.decoding_errors) == ({"dynamic", "static"} if preset == "fem-lm-tiny" else set())
    # the errors are rounding's: bfloat16's 8 mantissa bits show, float32's 24 an order of magnitude less at least
    assert checks["float32"].logits_error < checks["bfloat16"].logits_error / 10 < TOLERANCE["float32"]


def test_a_model_with_other_weights_fails_on_outputs_gradients_and_decoding(monkeypatch):
    seeds = iter([0, 1])
    original = families.model_from_preset

    def reseeded(preset):  # the reference from seed 0, the checked model's weights then drawn again
        model = original(preset)
        torch.manual_seed(next(seeds))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1 * torch.randn_like(parameter))
        return model

    monkeypatch.setattr(families, "model_from_preset", reseeded)
    monkeypatch.setattr(type(original("fem-lm-tiny")), "load_state_dict", lambda self, state: None)
    check = check_family("fem-lm-tiny", "float32", "cpu", decodings=("dynamic",))
    assert check.status.startswith("FAIL")
    assert {"loss", "logits", "gradients", "dynamic"} <= set(check.status.removeprefix("FAIL: ").split(", "))


def test_decoding_is_compared_with_the_reference_teacher_forced():
    torch.manual_seed(0)
    model = model_from_preset("fem-lm-tiny").eval()
    same = model_from_preset("fem-lm-tiny").eval()
    same.load_state_dict(model.state_dict())
    other = model_from_preset("fem-lm-tiny").eval()
    prompt = torch.randint(4, model.config.vocab_size, (1, 8))
    assert decoding_error(model, same.double(), prompt, "dynamic") < 1e-5
    assert decoding_error(model, other.double(), prompt, "dynamic") > 0.1


def test_gradient_error_floors_a_gradient_that_is_zero_in_exact_arithmetic():
    expected = {"weight": torch.tensor([3.0, 4.0], dtype=torch.float64),
                "key_bias": torch.zeros(2, dtype=torch.float64)}
    # rounding alone in the zero gradient: 1e-3 of the whole norm (5) is the scale it is measured against
    actual = {"weight": torch.tensor([3.0, 4.0]), "key_bias": torch.tensor([0.0, 5e-4])}
    assert gradient_error(actual, expected) == pytest.approx(5e-4 / 5e-3)
    actual["weight"] = torch.tensor([3.0, 4.5])
    assert gradient_error(actual, expected) == pytest.approx(0.5 / 5)
    del actual["key_bias"]
    assert gradient_error(actual, expected) == math.inf


def test_without_cuda_the_check_refuses_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--output", str(tmp_path / "report")]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "no CUDA device" in error
    assert not (tmp_path / "report").exists()
    assert gpu_check.main(["--device", "cpu", "--sections", "training", "--output", str(tmp_path / "r")]) == 2
    assert "families, kernels, compiled" in capsys.readouterr().err


def test_the_report_keeps_every_section_in_order_and_records_a_failure_in_one_line(monkeypatch, tmp_path):
    seen_reports = []

    def section(table, ok=True):
        def run(device, output):
            if (output / "report.json").exists():  # rewritten after each section: the earlier ones are there
                seen_reports.append(list(json.loads((output / "report.json").read_text())["sections"]))
            return {"table": table, "ok": ok}
        return run

    def broken(device, output):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setattr(gpu_check, "RUNNERS", {"families": section("| families table |"), "kernels": broken,
                                               "compiled": section("| compiled table |", ok=False)})
    assert gpu_check.main(["--device", "cpu", "--sections", "compiled", "kernels", "families",
                           "--output", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["sections"]) == ["families", "kernels", "compiled"]  # SECTIONS' order, not the command's
    assert seen_reports == [["families", "kernels"]]
    error = report["sections"]["kernels"]["error"]
    assert error == "RuntimeError: CUDA error: an illegal memory access was encountered"
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.index("## families: pass") < markdown.index("## kernels: RuntimeError") < markdown.index(
        "## compiled: FAIL")
    assert "| families table |" in markdown and "| compiled table |" in markdown
    assert report["environment"]["device"] == "cpu"


@pytest.mark.slow
def test_the_training_section_trains_with_validation_then_evaluates_its_model(tmp_path):
    """The section's commands as they run on a GPU, here on the CPU: the run validated, its model evaluated."""
    section = gpu_check.training_section("cpu", tmp_path)
    assert [step["exit"] for step in section["steps"]] == [0, 0], section["steps"]
    rows = [json.loads(line) for line in (tmp_path / "training" / "metrics.jsonl").read_text().splitlines()]
    assert any(key.startswith("validation") for row in rows for key in row), rows[-1]
    assert section["ok"] and "`eval " in section["table"]
