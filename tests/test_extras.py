"""The base install runs without the extras: what needs one names it in one line when it is first used."""

import sys

import pytest
import torch

from energyzoo.cli import main
from energyzoo.data.digits import digits_split
from energyzoo.modeling.outputs import EnergyTrace


@pytest.fixture
def without(monkeypatch):
    """Make packages unimportable, as on a base install (a None in sys.modules stops their import)."""
    def remove(*packages):
        for name in list(sys.modules):
            if name.split(".")[0] in packages:
                monkeypatch.delitem(sys.modules, name)
        for package in packages:
            monkeypatch.setitem(sys.modules, package, None)
    return remove


def test_the_digits_name_the_vision_extra(without):
    without("sklearn")
    with pytest.raises(ImportError, match=r"sklearn is not installed: it comes with energyzoo's \[vision\] extra"):
        digits_split(0.1, seed=0)


def test_plotting_an_energy_trace_names_matplotlib(without):
    without("matplotlib")
    trace = EnergyTrace([{"energy": torch.ones(1, 3)}])
    with pytest.raises(ImportError, match=r"EnergyTrace.plot needs matplotlib .*energyzoo\[plots\]"):
        trace.plot()


def test_the_command_answers_a_missing_extra_in_one_line(without, tmp_path, capsys):
    without("sklearn")
    code = main(["reproduce", "tel-stage1", "datasets=[digits]", "widths=[16]", "seeds=1", "selection_seeds=1",
                 "max_epochs=1", "--output-dir", str(tmp_path)])
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1
    assert "sklearn is not installed: it comes with energyzoo's [vision] extra" in error
