"""The bench's workloads and its two tables, without torch: what `energyzoo bench` measures (`WORKLOADS`; `speed`
times them) and the tables it prints, which the docs renderer and the model cards render from the shipped
measurements without importing the benchmark engine."""

from dataclasses import dataclass

BUSY_IQR = 0.10  # IQR / median of the per-repeat ratios above which a run is flagged (quiet pinned runs: <= 7 %)
DECODE_PADDED_BATCH = 8  # prompts of the padded decode workload, left-padded to the decode prompt's tokens
# What a profiled call's top-level operators are counted as (`profile_split`); every other operator is "other".
PROFILE_GROUPS = {"projections": ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm"),
                  "attention": ("aten::scaled_dot_product_attention",)}




@dataclass(frozen=True)
class Workload:
    """One thing `energyzoo bench` measures: its unit; whether it is a ``rate`` (tokens/s: the ratio is baseline /
    arm and a target bounds it from below) or a cost (time, memory: arm / baseline, bounded from above); ``timed``
    (False: measured apart, as peak memory is, in a process of its own); ``language_models``: only for causal LMs;
    ``sequences``: the sequences a call decodes (a rate counts the tokens of all)."""

    name: str
    unit: str
    rate: bool = False
    timed: bool = True
    language_models: bool = False
    sequences: int = 1


WORKLOADS = {workload.name: workload for workload in (
    Workload("forward", "s"),
    Workload("train_step", "s"),
    Workload("peak_memory", "MiB", timed=False),
    Workload("decode", "tok/s", rate=True, language_models=True),
    Workload("decode_static", "tok/s", rate=True, language_models=True),
    Workload("decode_padded", "tok/s", rate=True, language_models=True, sequences=DECODE_PADDED_BATCH),
    # a fresh process's first greedy `generate` (batch 1, the decode prompt): what a user's first call waits, compiles
    # included, which the decode rows leave out as warm-up
    Workload("first_generate", "s", timed=False, language_models=True),
)}
TIMED = tuple(name for name, workload in WORKLOADS.items() if workload.timed)


# a row's verdict on its target: the whole IQR of the per-repeat ratios on the right side of it, on the wrong side,
# or around it (the one vocabulary of the bench's tables, its JSON and the documents)
DECISIONS = ("met", "missed", "undecided")


def format_table(result: dict) -> str:
    """The one bench table: a row per arm and workload, then the notes and a warning for a busy machine."""
    lines = [result["title"],
             "| model | metric | value | baseline | ratio | IQR of the ratios | target | target met |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        rate = WORKLOADS[row["workload"]].rate
        bound = "" if row["target"] is None else f"{'>=' if rate else '<='} {row['target']:.2f}"
        decision = row["decision"] or ""
        low, high = row["iqr"]
        lines.append(f"| {row['arm']} | {row['workload']} ({row['unit']}) | {row['value']:.4g} | {row['baseline']:.4g} "
                     f"| {row['ratio']:.3f} | {low:.3f}-{high:.3f} | {bound} | {decision} |")
    lines += result["notes"]
    busy = sorted({f"{row['arm']} {row['workload']}" for row in result["rows"] if row["busy"]})
    if busy:
        lines.append(f"WARNING: the IQR of the per-repeat ratios is wider than {BUSY_IQR:.0%} of the ratio ("
                     f"{', '.join(busy)}): the machine was busy; rerun on a quiet machine before quoting the ratios")
    return "\n".join(lines)


def profile_table(result: dict) -> str:
    """The operators, seconds and time split per unit of each profiled model, against the first (the baseline)."""
    groups = (*PROFILE_GROUPS, "other operators", "between operators")
    lines = [result["title"], "| model | operators | ms | " + " | ".join(groups) + " |",
             "|---|---|---|" + "---|" * len(groups)]
    for entry in result["models"]:
        shares = " | ".join(f"{entry['split'][group]:.0%}" for group in groups)
        lines.append(f"| {entry['model']} | {entry['operators']:.0f} | {entry['seconds'] * 1e3:.2f} | {shares} |")
    return "\n".join(lines)
