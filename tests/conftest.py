"""Test settings for every test module, and ``tests/support`` (the oracles, the contract suite and the scripts tests
run in subprocesses) on the import path, so that tests import them by name."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))
collect_ignore = ["support"]  # the sixth architecture's test files there run in a copy of the checkout only

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker: two workers of every core's threads thrash
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# FEM decodes eagerly here (compiling costs seconds per model); tests/test_fem_compiled_decoding.py turns it back on
os.environ.setdefault("ENERGYZOO_EAGER_DECODING", "1")


@pytest.fixture
def zoo_classes_in_transformers_task_tables(monkeypatch):
    """The zoo's classes in transformers' task tables, where transformers' common tests look a class's task up (each
    family's ``test_<family>_transformers.py`` uses it: `transformers_common.MARKS`)."""
    from transformers.models.auto import modeling_auto
    from transformers_common import TASK_TABLES

    for table, entries in TASK_TABLES.items():
        for model_type, class_name in entries.items():
            monkeypatch.setitem(getattr(modeling_auto, table), model_type, class_name)
