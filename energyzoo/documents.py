"""The measured numbers of the repository's documents, rendered from their one source as the cards are: the bench
tables from ``bench.json`` (`energyzoo bench --all`) and the reproduction tables from ``ledger.json`` (`energyzoo
reproduce all`), both shipped in `energyzoo.measured`. A document marks each rendered block::

    <!-- rendered: bench fem -->
    ... (written by `render_document`) ...
    <!-- end rendered -->

Blocks: ``bench MODEL_TYPE...`` (each bench table of those architectures), ``profiles MODEL_TYPE...`` (their
operator counts and time splits, ``profiles.json`` from `energyzoo bench NAME --profile WORKLOAD`), ``speed-summary``
(a row per bench table), ``offload PRESET...`` (`energyzoo bench PRESET --offload`'s table, ``offload.json``),
``ledger EXPERIMENT...`` (each experiment's verdicts), ``ledger-summary`` (a row per
experiment), ``reference-differences FAMILY`` (the family's differences from its authors' public code, as its model
card has).
``python -m energyzoo.documents FILE...`` rewrites the blocks of each file; a test checks they are current.
"""

import re
import sys
from collections import Counter
from pathlib import Path

from .bench.offload import format_offload_table
from .bench.table import format_table, profile_table
from .export.hub_folder import reference_differences
from .measured import measured_ledger, measured_offload, measured_profiles, measured_speed
from .reproduce.experiments import EXPERIMENTS
from .reproduce.ledger_tables import ledger_tables
from .reproduce.report import headline, primary_table
from .reproduce.verdict import VERDICTS

BLOCK = re.compile(r"(<!-- rendered: (?P<kind>[\w-]+)(?P<names>(?: [\w.-]+)*) -->\n)(?P<body>.*?)"
                   r"(<!-- end rendered -->)", re.S)
SUMMARY_WORKLOADS = ("forward", "train_step", "peak_memory", "decode")


def _architecture(result: dict) -> str:
    return result["name"]


def bench_tables(model_types: list[str]) -> str:
    return "\n\n".join(format_table(result) for result in measured_speed() if _architecture(result) in model_types)


def profile_tables(model_types: list[str]) -> str:
    return "\n\n".join(profile_table(result) for result in measured_profiles()
                        if _architecture(result) in model_types)


def speed_summary() -> str:
    """Each bench table's first preset against its baseline: the median ratio of each workload (of a swept entry,
    the arm with a target), and whether it meets its target."""
    lines = ["| architecture | preset vs baseline | " + " | ".join(SUMMARY_WORKLOADS) + " |",
             "|---|---|" + "---|" * len(SUMMARY_WORKLOADS)]
    for result in measured_speed():
        preset = result["presets"][0]
        cells = []
        for workload in SUMMARY_WORKLOADS:
            rows = [row for row in result["rows"] if row["workload"] == workload
                    and row["arm"].split(" ")[0] == preset and " vs " not in row["arm"]]
            row = next((row for row in rows if row["target"] is not None), rows[0] if rows else None)
            notes = [row["arm"].removeprefix(preset).strip()] if row else []
            if row and row["target"] is not None:
                notes.append(row["decision"])
            notes = [note for note in notes if note]
            cells.append("" if row is None else f"{row['ratio']:.2f}" + (f" ({', '.join(notes)})" if notes else ""))
        lines.append(f"| {_architecture(result)} | `{preset}` vs `{result['baseline']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ledger_summary() -> str:
    """The ledger's headline, each paper's primary claim, a row per experiment (its setting, wall time, the count of
    each verdict, the commit it ran at, and whether its code is this ledger's or a replay showed its numbers to be,
    the machine), and what each full setting leaves out of its paper's protocol (`Experiment.cut`)."""
    ledger = measured_ledger()
    columns = (*VERDICTS, "smoke")
    lines = [headline(ledger), "", "Each paper's primary claim, declared before its run:", "", primary_table(ledger),
             "", "| experiment | setting | min | " + " | ".join(columns) + " | code | ran on |",
             "|---|---|---|" + "---|" * (len(columns) + 2)]
    for name, report in ledger["experiments"].items():
        counts = Counter(record["verdict"] for record in report["verdicts"])
        ran = (report.get("code") or {}).get("commit", "unknown")[:7]
        other, replay = report.get("other_code"), report.get("replay")
        code = f"{ran}: other code than the ledger's ({len(other)} files)" if other else (
            f"{ran}, replayed at {replay['code']['commit'][:7]}: the ledger's" if replay else f"{ran}: the ledger's")
        lines.append(f"| {name} | {report['setting']} | {report['seconds'] / 60:.0f} | "
                     + " | ".join(str(counts[verdict]) for verdict in columns) + f" | {code} | {report['machine']} |")
    lines += ["", "What each full setting leaves out of its paper's protocol, to fit 2 CPU cores:", "",
              *(f"- {name}: {EXPERIMENTS[name].cut}." for name in ledger["experiments"])]
    provenance = ledger["provenance"]
    code = provenance["code"] or {"commit": "unknown"}
    commit = f"{code['commit'][:7]}{'-dirty' * bool(code.get('dirty'))}"
    lines += ["", f"Made by `{ledger['command']}` at commit {commit} on "
                  f"{provenance['date']} ({provenance['machine']}; transformers "
                  f"{provenance['packages']['transformers']})."]
    return "\n".join(lines)


def offload_tables(presets: list[str]) -> str:
    return "\n\n".join(format_offload_table(result) for result in measured_offload() if result["preset"] in presets)


RENDERERS = {"bench": bench_tables, "profiles": profile_tables, "speed-summary": lambda names: speed_summary(),
             "offload": offload_tables,
             "ledger": ledger_tables, "ledger-summary": lambda names: ledger_summary(),
             "reference-differences": lambda names: "\n\n".join(map(reference_differences, names))}


def render_document(text: str) -> str:
    """``text`` with every rendered block written from the shipped measurements."""
    def render(match: re.Match) -> str:
        body = RENDERERS[match["kind"]](match["names"].split())
        return f"{match.group(1)}{body}\n{match.group(5)}"

    return BLOCK.sub(render, text)


if __name__ == "__main__":
    for path in map(Path, sys.argv[1:]):
        path.write_text(render_document(path.read_text()))
