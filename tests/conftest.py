"""Test settings for every test module, and ``tests/support`` (the oracles, the contract suite and the scripts tests
run in subprocesses) on the import path, so that tests import them by name."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "support"))
collect_ignore = ["support"]  # the sixth architecture's test files there run in a copy of the checkout only

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# FEM decodes eagerly here (compiling costs seconds per model); tests/test_fem_compiled_decoding.py turns it back on
os.environ.setdefault("ENERGYZOO_EAGER_DECODING", "1")
