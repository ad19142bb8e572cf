"""The shipped reproduction ledger (``ledger.json``, `energyzoo reproduce all`'s output) as the tables the documents
and the model cards show."""

from ..measured import measured_ledger
from .experiments import EXPERIMENTS
from .report import experiment_markdown

NO_EXPERIMENT = "No reproduction experiment yet: `energyzoo reproduce` has none for this paper."
NO_REPORT = "No report yet: the shipped ledger has none of `energyzoo reproduce {name}`."


def ledger_tables(experiments: list[str]) -> str:
    """Each experiment's verdict tables from the shipped ledger, or a line saying it has no report there yet (an
    experiment added after the ledger was assembled)."""
    ledger = measured_ledger()["experiments"]
    sections = []
    for name in experiments:
        report = ledger.get(name)
        sections.append(NO_REPORT.format(name=name) if report is None else "\n".join(experiment_markdown(name, report)))
    return "\n\n".join(sections)


def family_ledger(family: str) -> str:
    """The verdict tables of a paper family's experiments (a model card's reproduction section), or a line saying
    it has none yet."""
    names = [name for name, experiment in EXPERIMENTS.items() if experiment.family == family]
    return ledger_tables(names) if names else NO_EXPERIMENT


