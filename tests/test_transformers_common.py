"""Every registered class runs transformers' own common tests: each family's ``tests/test_<family>_transformers.py``
(tests/support/transformers_common.py wires them), FEM's with every prior."""

import importlib
from pathlib import Path

import pytest
from transformers_common import ModelTesterMixin

from energyzoo.modeling.configuration_fem import FEM_PRIORS
from energyzoo.registry import ARCHITECTURES

pytestmark = pytest.mark.slow
MODULES = sorted(path.stem for path in Path(__file__).parent.glob("test_*_transformers.py"))


def test_every_registered_class_runs_transformers_common_tests():
    """Each architecture's base model and heads are among some common test's `all_model_classes`, and FEM runs them
    with every prior."""
    cases = {name: case for module in MODULES for name, case in vars(importlib.import_module(module)).items()
             if isinstance(case, type) and issubclass(case, ModelTesterMixin) and name.endswith("CommonTest")}
    tested = {cls for case in cases.values() for cls in case.all_model_classes}
    declared = {cls for entry in ARCHITECTURES.values() for cls in entry.model_classes.values()}
    assert declared - tested == set()
    assert all(f"FEM{prior.upper()}CommonTest" in cases for prior in FEM_PRIORS)
