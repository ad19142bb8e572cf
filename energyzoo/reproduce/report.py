"""The one report writer of `energyzoo reproduce`: markdown, JSON and a figure per experiment."""

import json
from pathlib import Path

from ..extras import needs_extra
from .experiments import EXPERIMENTS


def _is_json(value) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def write_report(name: str, report: dict, output_dir: str | Path) -> dict[str, Path]:
    """``<stem>.md`` (the experiment's ``format_markdown``), ``<stem>.json`` (the report's JSON values; objects such as
    an `EnergyTrace` are only drawn) and ``<stem>.png`` (its ``plot``) in ``output_dir``; returns their paths."""
    code = EXPERIMENTS[name].code()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = EXPERIMENTS[name].module
    paths = {"markdown": output_dir / f"{stem}.md", "json": output_dir / f"{stem}.json",
             "plot": output_dir / f"{stem}.png"}
    paths["markdown"].write_text(code.format_markdown(report) + "\n")
    paths["json"].write_text(json.dumps({key: value for key, value in report.items() if _is_json(value)}, indent=2))
    with needs_extra("plots"):
        code.plot(report, paths["plot"])
    return paths
