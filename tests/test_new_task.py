"""A new task joins the zoo by one row: a copy of this checkout with the fill-mask head of ``tests/support/new_task``
added as docs/contributing.md ("A head") says, its task's row in `registry.TASKS`, the head class and its place in
FEM's entry, a contract tester, and nothing else, is read by every table that depends on the task (the fuzz tests'
batches, the doctor's, the contract's labels, transformers' task tables) and passes the contract, the fuzz tests and the
input checks. The counts
docs/contributing.md states for a new task are the toy's."""

import re
from pathlib import Path

import pytest
from checkout_copy import ROOT, copied_checkout, passing_tests_in, run_in

TOY = Path(__file__).parent / "support" / "new_task"

pytestmark = pytest.mark.slow  # a copy of the checkout, collected whole


def sections(name: str) -> dict[str, str]:
    """The ``# name`` sections of a toy file."""
    parts = re.split(r"^# (\w+)\n", (TOY / name).read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def add_to_registry(registry: Path) -> None:
    """The task's row at the end of `TASKS`, the head in FEM's entry, their imports after the registry's own."""
    toy, text = sections("registry.txt"), registry.read_text()
    task, bench = "\n\n@dataclass(frozen=True)\nclass Task:", "\n}\n\n\n@dataclass(frozen=True)\nclass Bench:"
    text = text.replace(task, f"\n{toy['import']}{task}", 1).replace(bench, f"\n{toy['row']}{bench[1:]}", 1)
    text = text.replace('"sequence-classification": FEMForSequenceClassification}',
                        f'"sequence-classification": FEMForSequenceClassification, {toy["head"].strip()}}}', 1)
    registry.write_text(text)


def add_head(modeling: Path) -> None:
    """The head class at the end of modeling_fem.py, the two names it uses among the file's imports."""
    text = modeling.read_text().replace("\nfrom .positions import", "\nfrom .inputs import check_labels\n"
                                        "from .outputs import MaskedLMOutputWithEnergies\nfrom .positions import", 1)
    modeling.write_text(text + (TOY / "modeling_fem.txt").read_text())


def add_tester(contract: Path) -> None:
    text = contract.read_text().replace("from contract import CausalLMContract,",
                                        "from contract import CausalLMContract, TokenContract,", 1)
    contract.write_text(text + (TOY / "test_fem_contract.txt").read_text())


EDITS = {"energyzoo/registry.py": add_to_registry, "energyzoo/modeling/modeling_fem.py": add_head,
         "tests/test_fem_contract.py": add_tester}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return copied_checkout(tmp_path_factory.mktemp("checkout"), {}, EDITS)


READING_THE_ROW = """
import torch
from transformers.models.auto import modeling_auto
from energyzoo.bench.task_inputs import task_inputs
from energyzoo.registry import ARCHITECTURES, TASKS
from energyzoo.training.tasks import TRAINING_TASKS

config = ARCHITECTURES["fem"].config_class(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=4)
batch = task_inputs("fill-mask", config, torch.Generator().manual_seed(0))
model = ARCHITECTURES["fem"].heads["fill-mask"](config)
print(sorted(batch), tuple(batch["labels"].shape), int(batch["labels"].max()) < 50, bool(model(**batch).loss > 0))
table = getattr(modeling_auto, TASKS["fill-mask"].transformers_mapping)  # where transformers' tests look it up
print(table is modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "fill-mask" in TRAINING_TASKS)
"""


def test_the_tables_that_depend_on_a_task_read_its_row(checkout):
    batch, tables = run_in(checkout, "-c", READING_THE_ROW).strip().splitlines()
    assert batch == "['input_ids', 'labels'] (2, 8) True True"  # a label per token, of the vocabulary's values
    assert tables == "True False"  # transformers' table of masked LMs; energyzoo trains it once it has data for it


def test_every_matrix_over_heads_collects_the_new_task_and_its_contract_passes(checkout):
    collected = run_in(checkout, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0",
                    "tests").splitlines()
    named = {line.split("::")[0].removeprefix("tests/") for line in collected if re.search("fill|MaskedLM", line)}
    assert {"test_fem_contract.py", "test_registry.py", "test_fuzz.py", "test_input_checks.py",
            "test_trainer_accumulation.py"} <= named
    passing_tests_in(checkout, "tests/test_fem_contract.py", "tests/test_registry.py", "tests/test_fuzz.py",
                     "tests/test_input_checks.py", "tests/test_layout.py", "tests/test_readme.py",
                     "-k", "fill or MaskedLM or layout or readme")


def test_contributing_states_the_files_a_new_task_edits():
    text = (ROOT / "docs" / "contributing.md").read_text()
    stated = re.search(r"a new task: no new file, (\d+) edited", text)
    assert stated, "docs/contributing.md no longer states the count of a new task"
    assert int(stated.group(1)) == len(EDITS)
