"""A copy of this checkout with a contributor's additions, and commands run in it: how tests/test_sixth_architecture.py
and tests/test_new_task.py show that an addition joins the suite by the files docs/contributing.md names."""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = ("__pycache__", ".git", "build", "dist", "runs", "*.egg-info")  # not part of a checkout


def copied_checkout(folder: Path, new_files: dict[str, Path], edits: dict[str, Callable[[Path], None]]) -> Path:
    """This checkout copied into ``folder``, with ``new_files`` (path in the checkout -> the file to copy there) and
    ``edits`` (path -> a function that edits the copy's file) applied, its files tracked by a fresh git repository
    (the layout test lists the tracked files)."""
    copy = folder / "energyzoo-checkout"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*LEFT_OUT))
    for name, source in new_files.items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy / name)
    for name, edit in edits.items():
        edit(copy / name)
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run(["git", "add", "-A"], cwd=copy, check=True)
    return copy


def run_in(checkout: Path, *args: str) -> str:
    """``python ARGS`` in ``checkout``, importing its energyzoo; its standard output, or a failure with its tail."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    result = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def passing_tests_in(checkout: Path, *pytest_args: str) -> None:
    """The fast tier of the tests ``pytest_args`` name, in ``checkout``: all pass (none fails or errs)."""
    summary = run_in(checkout, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                     *pytest_args).strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
