"""The one report writer of `energyzoo reproduce`: markdown, JSON and a figure per experiment, and the ledger of
every experiment's verdicts (`energyzoo reproduce all`)."""

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from ..extras import needs_extra
from ..training.recipe import typed_settings
from .experiments import EXPERIMENTS
from .verdict import LEDGER_HEADER, VERDICTS


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


def run_experiment(name: str, overrides: list[str], output_dir: str | Path, quick: bool = False,
                   progress=print, reuse: bool = False) -> dict:
    """Run experiment ``name`` (its quick overrides first when ``quick``, then ``overrides``) and write its report
    in ``output_dir``; returns the report. With ``reuse``, a report already in ``output_dir`` from the same settings
    is read back instead (its JSON values: what the ledger needs), so an interrupted `reproduce all` loses no
    finished experiment."""
    experiment = EXPERIMENTS[name]
    code = experiment.code()
    settings = typed_settings(code.Settings, [*(experiment.quick if quick else ()), *overrides],
                              owner=f"{name} settings")
    saved = Path(output_dir) / f"{experiment.module}.json"
    if reuse and saved.is_file():
        report = json.loads(saved.read_text())
        if report.get("settings") == json.loads(json.dumps(asdict(settings))):
            progress(f"{name}: reusing the report in {saved} (same settings)")
            return report
    report = code.run(settings, output_dir, progress) if experiment.trains_models else code.run(settings, progress)
    write_report(name, report, output_dir)
    return report


def ledger_markdown(reports: dict[str, dict], quick: bool) -> str:
    """Every experiment's verdicts in one table per experiment, with its wall time, and the count of each verdict."""
    counts = Counter(record["verdict"] for report in reports.values() for record in report["verdicts"])
    seconds = sum(report["seconds"] for report in reports.values())
    lines = [f"Reproduction ledger ({'quick' if quick else 'full'} settings, {seconds / 60:.0f} min): "
             + ", ".join(f"{counts[verdict]} {verdict}" for verdict in VERDICTS) + "."]
    for name, report in reports.items():
        lines += ["", f"**{name}**: {EXPERIMENTS[name].description} ({report['seconds'] / 60:.1f} min)", "",
                  LEDGER_HEADER, *(record["row"] for record in report["verdicts"])]
    return "\n".join(lines)


def write_ledger(reports: dict[str, dict], output_dir: str | Path, quick: bool) -> dict[str, Path]:
    """``ledger.md`` (`ledger_markdown`) and ``ledger.json`` (each experiment's verdict records) in ``output_dir``."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": output_dir / "ledger.md", "json": output_dir / "ledger.json"}
    paths["markdown"].write_text(ledger_markdown(reports, quick) + "\n")
    paths["json"].write_text(json.dumps({"quick": quick, "experiments": {
        name: {"seconds": report["seconds"], "verdicts": report["verdicts"]} for name, report in reports.items()}},
        indent=2))
    return paths
