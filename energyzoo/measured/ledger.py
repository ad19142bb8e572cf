"""The shipped reproduction ledger (``ledger.json``, `energyzoo reproduce all`'s output) as the tables the documents
and the model cards show."""

from ..reproduce.experiments import EXPERIMENTS
from ..reproduce.report import experiment_markdown
from . import measured_ledger


def ledger_tables(experiments: list[str]) -> str:
    ledger = measured_ledger()["experiments"]
    sections = []
    for name in experiments:
        report = ledger[name]
        sections.append("\n".join(experiment_markdown(name, report)))
    return "\n\n".join(sections)


NO_EXPERIMENT = "No reproduction experiment yet: `energyzoo reproduce` has none for this paper."


def family_ledger(family: str) -> str:
    """The verdict tables of a paper family's experiments (a model card's reproduction section), or a line saying
    it has none yet."""
    names = [name for name, experiment in EXPERIMENTS.items() if experiment.family == family]
    return ledger_tables(names) if names else NO_EXPERIMENT


