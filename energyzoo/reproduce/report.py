"""The one report writer of `energyzoo reproduce`: markdown, JSON and a figure per experiment, and the ledger of
every experiment's verdicts (`energyzoo reproduce all`)."""

import json
import os
import platform
import subprocess
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from ..extras import needs_extra
from ..training.recipe import typed_settings
from .experiments import EXPERIMENTS
from .verdict import ALPHA, LEDGER_HEADER, MIN_SEEDS, VERDICTS, decide

PROVENANCE_PACKAGES = ("energyzoo", "torch", "transformers", "accelerate", "scipy", "statsmodels", "scikit-learn")


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


def run_experiment(name: str, overrides: list[str], output_dir: str | Path, setting: str = "full",
                   progress=print, reuse: bool = False) -> dict:
    """Run experiment ``name`` at ``setting`` (its default settings, or its ``quick`` or ``paper-scale`` overrides
    first, then ``overrides``) and write its report in ``output_dir``; returns the report. With ``reuse``, a report
    already in ``output_dir`` from the same settings is read back instead (its JSON values: what the ledger needs),
    so an interrupted `reproduce all` loses no finished experiment."""
    experiment = EXPERIMENTS[name]
    code = experiment.code()
    settings = typed_settings(code.Settings, [*experiment.overrides(setting), *overrides], owner=f"{name} settings")
    saved = Path(output_dir) / f"{experiment.module}.json"
    if reuse and saved.is_file():
        report = json.loads(saved.read_text())
        if report.get("settings") == json.loads(json.dumps(asdict(settings))) and report.get("setting") == setting:
            progress(f"{name}: reusing the report in {saved} (same settings)")
            return report
    report = code.run(settings, output_dir, progress) if experiment.trains_models else code.run(settings, progress)
    # a report's own verdicts: Holm over its claims (the ledger adjusts over all of them); a quick run's are smoke
    report.update(verdicts=decide(report["verdicts"], smoke=setting == "quick"), setting=setting, machine=machine(),
                  commit=_commit())
    write_report(name, report, output_dir)
    return report


def _counts(records) -> Counter:
    return Counter(record["verdict"] for record in records)


def headline(ledger: dict) -> str:
    """The ledger's one line: its setting, wall time and the count of each verdict (smoke rows are not verdicts)."""
    records = [record for report in ledger["experiments"].values() for record in report["verdicts"]]
    counts, seconds = _counts(records), ledger["provenance"]["seconds"]
    verdicts = ", ".join(f"{counts[verdict]} {verdict}" for verdict in VERDICTS if counts[verdict])
    smoke = f"{counts['smoke']} smoke rows (quick settings: no verdicts)" if counts["smoke"] else ""
    settings = Counter(report["setting"] for report in ledger["experiments"].values())
    return (f"Reproduction ledger ({', '.join(f'{count} {setting}' for setting, count in settings.items())} "
            f"setting{'s' if len(ledger['experiments']) > 1 else ''}, {seconds / 60:.0f} min): "
            + "; ".join(part for part in (verdicts, smoke) if part) + f". Verdicts need >= {MIN_SEEDS} seeds and "
            f"Holm-adjusted p <= {ALPHA:g} over the ledger's {ledger['tested']} tested claims.")


def ledger_markdown(ledger: dict) -> str:
    """Every experiment's verdicts in one table per experiment, with its wall time, under the `headline`."""
    lines = [headline(ledger)]
    for name, report in ledger["experiments"].items():
        lines += ["", f"**{name}** ({report['setting']} setting, {report['seconds'] / 60:.1f} min): "
                      f"{EXPERIMENTS[name].description}", "",
                  LEDGER_HEADER, *(record["row"] for record in report["verdicts"])]
    return "\n".join(lines)


def _commit() -> str | None:
    """The checkout's commit, "-dirty" when its files differ from it; None outside a git checkout (an install)."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine() -> str:
    """The processor, its threads, the GPU and the torch a report ran on."""
    import torch

    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    return f"{platform.machine()}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={threads}{gpu}, torch {torch.__version__}"


def provenance(reports: dict[str, dict]) -> dict:
    """What made a ledger: the commit, package versions, machine, date and summed wall time of its reports (each
    report keeps the machine and commit it ran on)."""
    versions = {}
    for package in PROVENANCE_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"commit": _commit(), "packages": versions, "python": platform.python_version(),
            "machine": machine(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "seconds": sum(report["seconds"] for report in reports.values())}


def build_ledger(reports: dict[str, dict], command: str) -> dict:
    """The ledger of ``reports`` (name: report, each run at its own setting), made by ``command``: every verdict
    decided again with Holm over the whole ledger (a quick report's rows stay smoke), each experiment's setting,
    settings and wall time, and the `provenance`."""
    flat = [(name, {**record, "smoke": record["smoke"] or report["setting"] == "quick"})
            for name, report in reports.items() for record in report["verdicts"]]
    decided = decide([record for _, record in flat])
    experiments = {name: {"setting": report["setting"], "seconds": report["seconds"], "settings": report["settings"],
                          "machine": report["machine"], "commit": report["commit"],
                          "verdicts": [record for (owner, _), record in zip(flat, decided) if owner == name]}
                   for name, report in reports.items()}
    tested = sum(record["p_adjusted"] is not None for record in decided)
    return {"command": command, "tested": tested, "provenance": provenance(reports), "experiments": experiments}


def write_ledger(ledger: dict, output_dir: str | Path) -> dict[str, Path]:
    """``ledger.md`` (`ledger_markdown`) and ``ledger.json`` (`build_ledger`'s) in ``output_dir``."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": output_dir / "ledger.md", "json": output_dir / "ledger.json"}
    paths["markdown"].write_text(ledger_markdown(ledger) + "\n")
    paths["json"].write_text(json.dumps(ledger, indent=2))
    return paths
