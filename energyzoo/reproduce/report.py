"""The one report writer of `energyzoo reproduce`: markdown, JSON and a figure per experiment, and the ledger of
every experiment's verdicts (`energyzoo reproduce all`)."""

import fnmatch
import hashlib
import json
import math
import os
import platform
import subprocess
import tempfile
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from ..modeling.errors import UserError, needs_extra
from ..training.recipe import typed_settings
from .experiments import EXPERIMENTS
from .verdict import ALPHA, LEDGER_HEADER, MIN_SEEDS, UNDECIDED, VERDICTS, decide

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
    already in ``output_dir`` from the same settings and the same code is read back instead (its JSON values: what
    the ledger needs), so an interrupted `reproduce all` loses no finished experiment."""
    experiment = EXPERIMENTS[name]
    code = experiment.code()
    settings = typed_settings(code.Settings, [*experiment.overrides(setting), *overrides], owner=f"{name} settings")
    saved = Path(output_dir) / f"{experiment.module}.json"
    if reuse and saved.is_file():
        report = json.loads(saved.read_text())
        if (report.get("settings") == json.loads(json.dumps(asdict(settings))) and report.get("setting") == setting
                and not stale_code(name, report)):
            progress(f"{name}: reusing the report in {saved} (same settings, same code)")
            return report
    state = code_state(name)  # before the run: the code that made the numbers
    report = code.run(settings, output_dir, progress) if experiment.trains_models else code.run(settings, progress)
    # a report's own verdicts: Holm over its claims (the ledger adjusts over its paper's); a quick run's are smoke
    report.update(verdicts=decide(report["verdicts"], smoke=setting == "quick"), setting=setting, machine=machine(),
                  packages=package_versions(), code=state)
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
            f"p <= {ALPHA:g}: each paper's primary claim first, its secondary claims Holm-adjusted where the primary "
            f"is decided ({ledger['tested']} claims tested in all).")


def experiment_heading(name: str, report: dict) -> str:
    """An experiment's line above its verdicts: setting, wall time, what it compares, and the files whose code
    differs from the ledger's where it ran other code."""
    other = report.get("other_code") or []
    code, replay = report.get("code") or {}, report.get("replay")
    ran = f" Ran at {code['commit'][:7]}{'-dirty' * bool(code.get('dirty'))}" if code.get("commit") else ""
    files = f"{', '.join(other[:3])}{', ...' * (len(other) > 3)}"
    marked = f"{ran}: other code than this ledger's, in {len(other)} of its files ({files})." if other else ""
    if replay and replay["matches"] and not other:
        marked = (f"{ran}; replayed ({' '.join(replay['overrides'])}) at {replay['code']['commit'][:7]}: the report's "
                  f"numbers to {replay['largest_difference']:.2g} (tolerance {replay['tolerance']:g}).")
    return (f"**{name}** ({report['setting']} setting, {report['seconds'] / 60:.1f} min): "
            f"{EXPERIMENTS[name].description}.{marked}")


def primary_table(ledger: dict) -> str:
    """Each paper's answer: its primary claim's verdict with the effect, its interval at the deciding level, the
    adjusted p, seeds and power (a paper whose primary claim has no report yet says so)."""
    lines = ["| paper | primary claim | verdict | difference [CI] | p (Holm) | seeds | power | experiment |",
             "|---|---|---|---|---|---|---|---|"]
    for family in dict.fromkeys(experiment.family for experiment in EXPERIMENTS.values()):
        found = [(name, record) for name, report in ledger["experiments"].items() if EXPERIMENTS[name].family == family
                 for record in report["verdicts"] if record["claim"].get("primary")]
        if not found:
            lines.append(f"| {family} | not in this ledger yet | – | – | – | – | – | – |")
            continue
        name, record = found[0]
        interval = "" if record["interval"] is None else (f" [{record['interval'][0]:+.3g}, "
                                                          f"{record['interval'][1]:+.3g}]")
        difference = "–" if record["difference"] is None else f"{record['difference']:+.3g}{interval}"
        adjusted = "–" if record["p_adjusted"] is None else f"{record['p_adjusted']:.2g}"
        if record["p_adjusted"] is not None and record["verdict"] in UNDECIDED:
            adjusted += " (of the opposite effect)"  # an undecided row's one test: whether it lies against the claim
        power = "–" if record["power"] is None else f"{record['power']:.2f}"
        lines.append(f"| {family} | {record['claim']['quote']} ({record['claim']['source']}) | "
                     f"**{record['verdict']}** | {difference} | {adjusted} | {record['seeds']} | {power} | {name} |")
    return "\n".join(lines)


def curve_table(curves: dict) -> str:
    """An experiment's validation curves (``{arm: [{step, mean, std}]}``, mean over seeds) as a table: one row per
    arm, one column per evaluated step."""
    steps = [point["step"] for point in next(iter(curves.values()))]
    lines = ["Validation loss (mean over seeds) as training goes:", "",
             "| arm | " + " | ".join(f"step {step}" for step in steps) + " |", "|---|" + "---|" * len(steps)]
    lines += [f"| {arm} | " + " | ".join(f"{point['mean']:.4f}" for point in points) + " |"
              for arm, points in curves.items()]
    return "\n".join(lines)


def experiment_markdown(name: str, report: dict) -> list[str]:
    """An experiment's section of a ledger: its heading, its verdicts and, where it keeps them, its curves."""
    lines = [experiment_heading(name, report), "", LEDGER_HEADER, *(record["row"] for record in report["verdicts"])]
    return lines + (["", curve_table(report["validation_curves"])] if report.get("validation_curves") else [])


def ledger_markdown(ledger: dict) -> str:
    """Every experiment's verdicts in one table per experiment, with its wall time, under the `headline`."""
    lines = [headline(ledger), "", "Each paper's primary claim:", "", primary_table(ledger)]
    for name, report in ledger["experiments"].items():
        lines += ["", *experiment_markdown(name, report)]
    return "\n".join(lines)


def _git(*arguments: str) -> str | None:
    """A git command's output at the root of the checkout this package runs from (paths are relative to it); None
    outside one (an install)."""
    try:
        return subprocess.run(["git", *arguments], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parents[2]).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _diff_sha256(commit: str, paths: list[str]) -> str:
    """The SHA-256 of the working tree's difference from ``commit`` in ``paths``: tracked changes, and the names and
    contents of untracked files (git diff leaves them out)."""
    root = Path(__file__).parents[2]
    digest = hashlib.sha256(_git("diff", "--binary", commit, "--", *paths).encode())
    for untracked in sorted(_git("ls-files", "--others", "--exclude-standard", "--", *paths).splitlines()):
        digest.update(untracked.encode() + b"\0" + (root / untracked).read_bytes())
    return digest.hexdigest()


def code_state(name: str | None = None) -> dict | None:
    """The code a report (of experiment ``name``) or a ledger ran: the commit, whether the tree differed from it
    (its changed files and the SHA-256 of the whole difference), and for an experiment the SHA-256 of the
    difference in its own files (`Experiment.code_paths`), which `stale_code` compares; None outside a checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None
    commit = commit.strip()
    changed = sorted(line[3:] for line in _git("status", "--porcelain", "--untracked-files=all").splitlines())
    state = {"commit": commit, "dirty": bool(changed), "changed_files": changed,
             "diff_sha256": _diff_sha256(commit, ["."]) if changed else None}
    if name is not None:
        state["experiment_diff_sha256"] = _diff_sha256(commit, EXPERIMENTS[name].code_paths())
    return state


def stale_code(name: str, report: dict) -> list[str] | None:
    """The files of experiment ``name`` (`Experiment.code_paths`) whose code differs between the report's run and
    this checkout ("unknown" where either is not a git checkout); None where they are the same, or where the report's
    replay (`replay_experiment`) ran this checkout's code and gave the report's numbers. A report run on a clean tree
    matches where the checkout has no difference from its commit in those files; one run on a changed tree, where the
    difference is the one it recorded (its SHA-256)."""
    paths = EXPERIMENTS[name].code_paths()
    files = _code_differs(report.get("code"), paths)
    replay = report.get("replay")
    if files and replay and replay["matches"] and _code_differs(replay["code"], paths) is None:
        return None
    return files


def _code_differs(recorded: dict | None, paths: list[str]) -> list[str] | None:
    """`stale_code` of one recorded code state (a run's, or a replay's)."""
    if not recorded or _git("rev-parse", "HEAD") is None:
        return ["unknown: the report or this tree is not a git checkout"]
    if _git("cat-file", "-e", f"{recorded['commit']}^{{commit}}") is None:
        return [f"unknown: commit {recorded['commit']} is not in this repository"]
    expected = recorded["experiment_diff_sha256"] if recorded["dirty"] else hashlib.sha256().hexdigest()
    if _diff_sha256(recorded["commit"], paths) == expected:
        return None
    since = set(_git("diff", "--name-only", recorded["commit"], "--", *paths).split())
    since |= set(_git("ls-files", "--others", "--exclude-standard", "--", *paths).split())
    at_run = {path for path in recorded["changed_files"]
              if any(fnmatch.fnmatchcase(path, own) or path.startswith(own + "/") for own in paths)}
    return sorted(since | at_run) or ["edits uncommitted when it ran"]


def replay_experiment(name: str, output_dir: str | Path, progress=print) -> dict:
    """Rerun the designated part (`Experiment.replay`) of the report in ``output_dir`` with this checkout's code, at
    the report's own settings cut down to that part, and record in the report (``replay``: the code, the overrides,
    the replayed numbers, the largest difference from the report's, the tolerance, whether they match); returns it."""
    experiment = EXPERIMENTS[name]
    if not experiment.replay:
        raise UserError(f"{name} has no designated replay part yet (`Experiment.replay` in reproduce/experiments.py)")
    path = Path(output_dir) / f"{experiment.module}.json"
    if not path.is_file():
        raise UserError(f"no report of {name} in {output_dir} (`energyzoo reproduce {name} --output-dir "
                        f"{output_dir}` writes one)")
    report = json.loads(path.read_text())
    code = experiment.code()
    settings = typed_settings(code.Settings, list(experiment.replay), base=report["settings"],
                              owner=f"{name} replay settings")
    state = code_state(name)  # before the run: the code that made the numbers
    with tempfile.TemporaryDirectory() as scratch:
        replayed = code.run(settings, scratch, progress) if experiment.trains_models else code.run(settings, progress)
    values, reported = _leaves(code.replayed_part(replayed)), _leaves(code.replayed_part(report))
    largest = max((_difference(values[key], reported[key]) for key in reported.keys() & values.keys()),
                  default=math.inf)
    report["replay"] = {"code": state, "overrides": list(experiment.replay), "values": values,
                        "largest_difference": largest, "tolerance": experiment.replay_tolerance,
                        "matches": values.keys() == reported.keys() and largest <= experiment.replay_tolerance}
    path.write_text(json.dumps(report, indent=2))
    return report["replay"]


def _leaves(part, path: str = "") -> dict[str, object]:
    """Every value of a report's part (nested dicts and lists of JSON values) under its path ("rows.0.mse")."""
    if isinstance(part, (list, tuple)):
        part = dict(enumerate(part))
    if isinstance(part, dict):
        return {key: value for name, child in part.items() for key, value in _leaves(child, f"{path}{name}.").items()}
    return {path.rstrip("."): part}


def _difference(replayed, reported) -> float:
    """|replayed - reported| for numbers (bit-identical: 0), 0 or infinity for anything else (equal or not)."""
    numbers = all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in (replayed, reported))
    if numbers:
        return abs(replayed - reported)
    return 0.0 if replayed == reported else math.inf


def machine() -> str:
    """The processor, its threads, the GPU and the torch (and CUDA) a report ran on."""
    import torch

    gpu = f", {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}" if torch.cuda.is_available() else ""
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    return f"{platform.machine()}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={threads}{gpu}, torch {torch.__version__}"


def package_versions() -> dict:
    """The versions of `PROVENANCE_PACKAGES` and Python on this machine."""
    versions = {"python": platform.python_version()}
    for package in PROVENANCE_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def provenance(reports: dict[str, dict]) -> dict:
    """What assembled a ledger: the code, package versions, machine, date and the summed wall time of its reports
    (each report keeps the code, packages and machine it ran on)."""
    return {"code": code_state(), "packages": package_versions(), "machine": machine(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "seconds": sum(report["seconds"] for report in reports.values())}


def build_ledger(reports: dict[str, dict], command: str, keep_other_code: bool = False) -> dict:
    """The ledger of ``reports`` (name: report, each run at its own setting), made by ``command``: every verdict
    (`report_verdicts`) decided again within its paper (the family: one paper's claims, `verdict.decide`; a quick
    report's rows stay smoke), each experiment's setting, settings, wall time, code, packages, machine and
    validation curves (where it keeps them), and the `provenance`. A report whose experiment's code differs from
    this checkout's (`stale_code`) is refused, its numbers not being this code's; with ``keep_other_code`` it joins,
    and its entry's ``other_code`` names the files that differ."""
    stale = {name: files for name, report in reports.items() if (files := stale_code(name, report))}
    if stale and not keep_other_code:
        raise UserError("these reports ran other code than this checkout's, so a ledger of this commit cannot hold "
                        "them: " + "; ".join(f"{name} ({', '.join(files)})" for name, files in stale.items())
                        + ": rerun them (`energyzoo reproduce NAME`), assemble the ledger at their commit, or keep "
                          "them marked (`energyzoo reproduce ledger --keep-other-code`)")
    decided = {}
    for family in dict.fromkeys(EXPERIMENTS[name].family for name in reports):
        members = [(name, {**record, "smoke": record["smoke"] or report["setting"] == "quick"})
                   for name, report in reports.items() if EXPERIMENTS[name].family == family
                   for record in report_verdicts(name, report)]
        for (name, _), record in zip(members, decide([record for _, record in members])):
            decided.setdefault(name, []).append(record)
    experiments = {name: {key: report.get(key) for key in ("setting", "seconds", "settings", "machine", "packages",
                                                            "code", "replay", "validation_curves")}
                   | {"other_code": stale.get(name), "verdicts": decided.get(name, [])}
                   for name, report in reports.items()}
    tested = sum(record["p_adjusted"] is not None for records in decided.values() for record in records)
    return {"command": command, "tested": tested, "provenance": provenance(reports), "experiments": experiments}


def report_verdicts(name: str, report: dict) -> list[dict]:
    """A report's verdict records: derived afresh from its per-seed results by this checkout's ``verdicts`` where the
    experiment names them (`Experiment.rows`), so that a report whose numbers a replay showed to be this code's is
    judged by the claims and the rule that ship; else the records it carries."""
    experiment = EXPERIMENTS[name]
    if experiment.rows is None:
        return report["verdicts"]
    code = experiment.code()
    settings = typed_settings(code.Settings, [], base=report["settings"], owner=f"{name} report settings")
    return code.verdicts(report[experiment.rows], settings)


def read_reports(output_dir: str | Path) -> dict[str, dict]:
    """The reports `energyzoo reproduce all` keeps in ``output_dir`` (``<name>/<module>.json``), in the experiments
    table's order; an experiment without one is left out."""
    found = {name: Path(output_dir) / name / f"{experiment.module}.json" for name, experiment in EXPERIMENTS.items()}
    reports = {}
    for name, path in found.items():
        if path.is_file():
            try:
                reports[name] = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                raise UserError(f"{path} is not a report (invalid JSON: {error})") from None
    return reports


def write_ledger(ledger: dict, output_dir: str | Path) -> dict[str, Path]:
    """``ledger.md`` (`ledger_markdown`) and ``ledger.json`` (`build_ledger`'s) in ``output_dir``."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": output_dir / "ledger.md", "json": output_dir / "ledger.json"}
    paths["markdown"].write_text(ledger_markdown(ledger) + "\n")
    paths["json"].write_text(json.dumps(ledger, indent=2))
    return paths
