"""A sixth architecture joins the zoo by its own files: a copy of this checkout with the toy architecture of
``tests/support/sixth_architecture`` added as docs/contributing.md ("A new architecture") says, its new files and its
one registry entry and nothing else, collects it in every matrix of the suite (each test module that draws its models
from `tests/zoo.py` or parametrizes over the registry), exports it as its own, and passes the registry's tests with
neither a bench entry nor an experiment. The file counts docs/contributing.md states are the toy's."""

import re
from pathlib import Path

import pytest
from checkout_copy import ROOT, copied_checkout, passing_tests_in, run_in

TOY = Path(__file__).parent / "support" / "sixth_architecture"
EDIT_TEXTS = ("README.md", "registry_entry.txt", "layout_entries.txt")  # what the toy is and adds to edited files
NEW_FILES = sorted(str(path.relative_to(TOY)) for path in TOY.rglob("*")
                   if path.is_file() and path.name not in EDIT_TEXTS)

pytestmark = pytest.mark.slow  # a copy of the checkout, collected whole


def add_registry_entry(registry: Path) -> None:
    """The entry's imports after the registry's model imports, the entry at the end of `ARCHITECTURES`."""
    imports, entry = (TOY / "registry_entry.txt").read_text().split("# entry\n")
    text = registry.read_text()
    task = "\n\n@dataclass(frozen=True)\nclass Task:"
    text = text.replace(task, f"\n{imports}{task}", 1)
    text = text.replace("\n}\n\n\ndef architecture(", f"\n{entry}}}\n\n\ndef architecture(", 1)
    registry.write_text(text)


def add_layout_entries(contributing: Path) -> None:
    """The toy's modeling files in the layout tree, after the last family's."""
    text = contributing.read_text()
    last = next(line for line in text.splitlines() if line.startswith("    eer_energy.py"))
    contributing.write_text(text.replace(f"{last}\n", f"{last}\n{(TOY / 'layout_entries.txt').read_text()}", 1))


EDITS = {"energyzoo/registry.py": add_registry_entry, "docs/contributing.md": add_layout_entries}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return copied_checkout(tmp_path_factory.mktemp("checkout"), {name: TOY / name for name in NEW_FILES}, EDITS)


def matrices(checkout: Path) -> list[str]:
    """The test modules that draw their models from tests/zoo.py or parametrize over the registry."""
    return sorted(path.name for path in (checkout / "tests").glob("test_*.py")
                  if re.search(r"^import zoo$|parametrize\([^)]*sorted\(ARCHITECTURES\)", path.read_text(), re.M))


def test_the_copy_imports_its_own_energyzoo(checkout):
    assert run_in(checkout, "-c", "import energyzoo; print(energyzoo.__file__)").strip() == str(
        checkout / "energyzoo" / "__init__.py")


HOLDING_THE_TOY = """
import importlib, sys
sys.path[:0] = ["tests", "tests/support"]
for name in sys.argv[1:]:
    module = importlib.import_module(name.removesuffix(".py"))
    values = [value for value in vars(module).values() if isinstance(value, (list, dict))]
    testers = [tester for value in values for tester in (value.values() if isinstance(value, dict) else value)]
    if any(getattr(tester, "model_type", None) == "toy" for tester in testers):
        print(name)
"""


def test_every_matrix_collects_the_sixth_architecture(checkout):
    """Every matrix names the toy among its test ids, or (one test over all models, such as the side-by-side export
    check) holds its tester in the list it runs over."""
    collected = run_in(checkout, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0",
                    "tests").splitlines()
    named = {line.split("::")[0].removeprefix("tests/") for line in collected if "toy" in line.lower()}
    unnamed = sorted(set(matrices(checkout)) - named)
    holding = set(run_in(checkout, "-c", HOLDING_THE_TOY, *unnamed).split()) if unnamed else set()
    assert set(unnamed) - holding == set()
    assert {"test_toy_contract.py", "test_registry.py", "test_static_caches.py", "test_trainer_accumulation.py",
            "test_input_checks.py", "test_fuzz.py"} <= named


def test_the_sixth_architecture_is_public_registered_and_exported_as_its_own(checkout):
    script = ("import energyzoo, transformers\n"
              "from energyzoo.registry import ARCHITECTURES\n"
              "assert {'ToyConfig', 'ToyModel', 'ToyForCausalLM'} <= set(energyzoo.__all__)\n"
              "assert energyzoo.ToyForCausalLM is ARCHITECTURES['toy'].heads['causal-lm']\n"
              "assert type(transformers.AutoConfig.for_model('toy')).__name__ == 'ToyConfig'\n"
              "print('ok')")
    assert run_in(checkout, "-c", script).strip() == "ok"
    run_in(checkout, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/test_registry.py", "-k",
        "toy or Toy")


def test_the_layout_and_documents_rules_hold_with_the_sixth_architecture(checkout):
    """Its files sit where the layout rules want them (modeling files importing their siblings and the shared ones;
    every document's rendered blocks current), with no other file edited."""
    passing_tests_in(checkout, "-n", "0", "tests/test_layout.py", "tests/test_readme.py")


def test_contributing_states_the_files_an_architecture_adds_and_edits():
    text = (ROOT / "docs" / "contributing.md").read_text()
    stated = re.search(r"That is (\d+) new files \(([^)]*)\) and (\d+) edited", text)
    assert stated, "docs/contributing.md no longer states the counts of 'A new architecture'"
    assert (int(stated.group(1)), int(stated.group(3))) == (len(NEW_FILES), len(EDITS)), NEW_FILES
