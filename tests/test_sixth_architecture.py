"""A sixth architecture joins the zoo by its own files: a copy of this checkout with the toy architecture of
``tests/support/sixth_architecture`` added as docs/contributing.md ("A new architecture") says, its new files and its
one registry entry and nothing else, collects it in every matrix of the suite (each test module that draws its models
from `tests/zoo.py` or parametrizes over the registry), exports it as its own, and passes the registry's tests with
neither a bench entry nor an experiment. The file counts docs/contributing.md states are the toy's."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).parent / "support" / "sixth_architecture"
NEW_FILES = sorted(str(path.relative_to(TOY)) for path in TOY.rglob("*")
                   if path.is_file() and path.name not in ("README.md", "registry_entry.txt"))
EDITED_FILES = ["energyzoo/registry.py"]
COPIED = ("energyzoo", "tests", "docs", "README.md", "pyproject.toml")

pytestmark = pytest.mark.slow  # a copy of the checkout, collected whole


def add_registry_entry(registry: Path) -> None:
    """The entry's imports after the registry's model imports, the entry at the end of `ARCHITECTURES`."""
    imports, entry = (TOY / "registry_entry.txt").read_text().split("# entry\n")
    text = registry.read_text()
    task = "\n\n@dataclass(frozen=True)\nclass Task:"
    text = text.replace(task, f"\n{imports}{task}", 1)
    text = text.replace("\n}\n\n\ndef architecture(", f"\n{entry}}}\n\n\ndef architecture(", 1)
    registry.write_text(text)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("checkout")
    ignored = shutil.ignore_patterns("__pycache__", "sixth_architecture")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=ignored)
        else:
            shutil.copy2(source, copy / name)
    for name in NEW_FILES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(TOY / name, copy / name)
    for name in EDITED_FILES:
        add_registry_entry(copy / name)
    return copy


def run(checkout: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    result = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def matrices(checkout: Path) -> list[str]:
    """The test modules that draw their models from tests/zoo.py or parametrize over the registry."""
    return sorted(path.name for path in (checkout / "tests").glob("test_*.py")
                  if re.search(r"^import zoo$|parametrize\([^)]*sorted\(ARCHITECTURES\)", path.read_text(), re.M))


def test_the_copy_imports_its_own_energyzoo(checkout):
    assert run(checkout, "-c", "import energyzoo; print(energyzoo.__file__)").strip() == str(
        checkout / "energyzoo" / "__init__.py")


def test_every_matrix_collects_the_sixth_architecture(checkout):
    collected = run(checkout, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests").splitlines()
    toy = {line.split("::")[0].removeprefix("tests/") for line in collected if "toy" in line.lower()}
    assert set(matrices(checkout)) - toy == set()
    assert {"test_toy_contract.py", "test_registry.py", "test_static_caches.py"} <= toy


def test_the_sixth_architecture_is_public_registered_and_exported_as_its_own(checkout):
    script = ("import energyzoo, transformers\n"
              "from energyzoo.registry import ARCHITECTURES\n"
              "assert {'ToyConfig', 'ToyModel', 'ToyForCausalLM'} <= set(energyzoo.__all__)\n"
              "assert energyzoo.ToyForCausalLM is ARCHITECTURES['toy'].heads['causal-lm']\n"
              "assert type(transformers.AutoConfig.for_model('toy')).__name__ == 'ToyConfig'\n"
              "print('ok')")
    assert run(checkout, "-c", script).strip() == "ok"
    run(checkout, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_registry.py", "-k", "toy or Toy")


def test_contributing_states_the_files_an_architecture_adds_and_edits():
    text = (ROOT / "docs" / "contributing.md").read_text()
    stated = re.search(r"That is (\d+) new files \(([^)]*)\) and (\d+) edited", text)
    assert stated, "docs/contributing.md no longer states the counts of 'A new architecture'"
    assert (int(stated.group(1)), int(stated.group(3))) == (len(NEW_FILES), len(EDITED_FILES)), NEW_FILES
