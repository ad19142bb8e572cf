"""What energyzoo measured, as shipped: ``bench.json`` (`energyzoo bench --all`), ``profiles.json`` (`energyzoo bench
NAME --profile WORKLOAD`), ``offload.json`` (`energyzoo bench PRESET --offload MEMORY` per 1.3B language model) and
``ledger.json`` (`energyzoo reproduce all`, with its provenance): data, and their reader. The model cards and the
documents (`energyzoo.documents`) read them here; `energyzoo.reproduce.ledger_tables` renders the ledger's tables."""

import json
from importlib import resources


def _shipped(name: str):
    return json.loads(resources.files(__package__).joinpath(name).read_text())


def measured_speed() -> list[dict]:
    """`energyzoo bench --all` as measured for the documents and cards (one result per benched architecture)."""
    return _shipped("bench.json")


def measured_profiles() -> list[dict]:
    """`energyzoo bench NAME --profile WORKLOAD` per family as measured (docs/speed.md)."""
    return _shipped("profiles.json")


def measured_offload() -> list[dict]:
    """`energyzoo bench PRESET --offload 2GiB --dtype bfloat16` of the 1.3B language models (docs/big-models.md)."""
    return _shipped("offload.json")


def measured_ledger() -> dict:
    """The shipped ledger (`energyzoo.reproduce.report.build_ledger`'s)."""
    return _shipped("ledger.json")
