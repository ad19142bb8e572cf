"""The shipped reproduction ledger (``ledger.json``, `energyzoo reproduce all`'s output) as the tables the documents
and the model cards show."""

import json
from importlib import resources

from ..reproduce.experiments import EXPERIMENTS
from ..reproduce.report import experiment_markdown


def measured_ledger() -> dict:
    """The shipped ledger (`energyzoo.reproduce.report.build_ledger`'s)."""
    return json.loads(resources.files(__package__).joinpath("ledger.json").read_text())


def ledger_tables(experiments: list[str]) -> str:
    ledger = measured_ledger()["experiments"]
    sections = []
    for name in experiments:
        report = ledger[name]
        sections.append("\n".join(experiment_markdown(name, report)))
    return "\n\n".join(sections)


def family_ledger(family: str) -> str:
    """The verdict tables of a paper family's experiments (a model card's reproduction section)."""
    return ledger_tables([name for name, experiment in EXPERIMENTS.items() if experiment.family == family])


