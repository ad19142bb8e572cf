"""The zoo's test matrix, read from the registry rather than kept by hand: every contract tester (the ``Test*Contract``
classes of tests/test_*_contract.py), and the groups the other suites draw from.

- `ONE_PER_HEAD`: one tester per registered (architecture, head), the first its module defines with FEM's default prior;
  `HEADS_AND_PRIORS` adds FEM's language model with each further prior of `FEM_PRIORS`: the set a suite covering
  "every model" runs.
- `token_testers` / `image_testers` / `causal_lm_testers` / `padded_testers` pick from a list by what the head reads
  and predicts (an attention mask: its forward's signature).
- `missing_coverage(testers)` names each registered head and each FEM prior the list lacks; every suite that draws from
  here asserts it is empty, so a sixth architecture or a fifth prior without testers fails them all.

The contract modules are imported as modules (a test class imported into another test module would be collected and
run there again).
"""

import importlib
import inspect
from pathlib import Path

from energyzoo.modeling.configuration_fem import FEM_PRIORS
from energyzoo.registry import ARCHITECTURES

CONTRACT_MODULES = sorted(path.stem for path in Path(__file__).parent.glob("test_*_contract.py"))
DEFAULT_PRIOR = FEM_PRIORS[0]


def contract_testers() -> list:
    """An instance of every concrete contract tester, in module order and, within a module, definition order."""
    testers = []
    for name in CONTRACT_MODULES:
        module = importlib.import_module(name)
        testers += [value() for key, value in vars(module).items()
                    if isinstance(value, type) and key.startswith("Test") and key.endswith("Contract")
                    and value.__module__ == name]
    return testers


def prior_of(tester) -> str | None:
    """The FEM prior a tester's configs use (None for the other architectures)."""
    return getattr(tester, "prior_fields", {}).get("prior", DEFAULT_PRIOR) if tester.model_type == "fem" else None


def name_of(tester) -> str:
    """A short id: the architecture, its head's task unless it is the main head, FEM's prior unless the default."""
    architecture = ARCHITECTURES[tester.model_type]
    parts = [tester.model_type]
    if tester.task != next(iter(architecture.heads)):
        parts.append(tester.task)
    if prior_of(tester) not in (None, DEFAULT_PRIOR):
        parts.append(prior_of(tester))
    return "-".join(parts)


def token_testers(testers: list) -> list:
    return [tester for tester in testers if tester.head_class.main_input_name == "input_ids"]


def image_testers(testers: list) -> list:
    return [tester for tester in testers if tester.head_class.main_input_name == "pixel_values"]


def padded_testers(testers: list) -> list:
    """The token testers whose head takes an attention mask."""
    return [tester for tester in token_testers(testers)
            if "attention_mask" in inspect.signature(tester.head_class.forward).parameters]


def causal_lm_testers(testers: list) -> list:
    return [tester for tester in testers if tester.task == "causal-lm"]


def _one_per_head(testers: list) -> list:
    chosen, heads = [], set()
    for tester in testers:
        if (tester.model_type, tester.task) not in heads and prior_of(tester) in (None, DEFAULT_PRIOR):
            heads.add((tester.model_type, tester.task))
            chosen.append(tester)
    return chosen


def _further_priors(testers: list) -> list:
    chosen, priors = [], {None, DEFAULT_PRIOR}
    for tester in causal_lm_testers(testers):
        if prior_of(tester) not in priors:
            priors.add(prior_of(tester))
            chosen.append(tester)
    return chosen


def missing_coverage(testers: list, priors: bool = True, tasks: set[str] | None = None) -> list[str]:
    """The registered (architecture, head) pairs (of ``tasks``' heads only, where given), and with ``priors`` the FEM
    priors of the language model, that ``testers`` lack."""
    heads = {(tester.model_type, tester.task) for tester in testers}
    missing = [f"{name} {task}" for name, architecture in ARCHITECTURES.items() for task in architecture.heads
               if (name, task) not in heads and (tasks is None or task in tasks)]
    covered = {prior_of(tester) for tester in causal_lm_testers(testers)}
    return missing + [f"fem causal-lm with prior {prior}" for prior in FEM_PRIORS if priors and prior not in covered]


def tester_for(model_type: str, task: str | None = None):
    """The `ONE_PER_HEAD` tester of an architecture's head (its main head by default)."""
    task = task or next(iter(ARCHITECTURES[model_type].heads))
    return next(tester for tester in ONE_PER_HEAD if (tester.model_type, tester.task) == (model_type, task))


TESTERS = contract_testers()
ONE_PER_HEAD = _one_per_head(TESTERS)
MAIN_HEADS = [tester for tester in ONE_PER_HEAD if tester is tester_for(tester.model_type)]
HEADS_AND_PRIORS = ONE_PER_HEAD + _further_priors(TESTERS)
