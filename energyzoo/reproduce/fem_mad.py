"""`energyzoo reproduce fem-mad`: fem.txt Table 1's MAD ablation ladder of FEM-SM at CPU scale.

Tasks: the six MAD tasks of `energyzoo.data.mad` at MAD's baseline settings, sequences shortened to
``max_length`` (64 by default: MAD's recall tasks use 128, selective copy 256), one fixed training set per task (MAD's
sizes; data seed fixed) and 1,280 test instances, shared by every arm and seed. Arms, the rows of Table 1's ladder,
each a FEM-SM of ``layers`` blocks whose switches (FEM §2.3, App. I) are on as named: ``softmax`` (every switch off:
with ``value_ratio=1``, exactly a Llama Transformer, Table 1's "SMAttn; Transformer"), ``C`` (+ the time-decay
conditioner), ``CL`` (+ the log-sum-exp branch, eq. 9), ``CLT`` (+ the temperature gate, eq. 10) and ``CLTG`` (+ the
outer gate, eq. 11: the full FEM-SM). Every arm trains by the same loop (AdamW, warmup then cosine decay, gradient
clipping 1.0, the same batches per seed; the recall tasks as language models, the others on their targets) at each
point of the learning-rate x weight-decay grid, and the point with the best mean validation accuracy over seeds (a
validation split of the task's generator, disjoint seed) is scored on the test split: MAD's protocol (best of its
grid of six). Accuracy is MAD's macro accuracy: the recall of each target token class averaged over the classes
present (`sklearn.metrics.balanced_accuracy_score`), so a model that emits the commonest class scores 1 / classes.
Compress uses MAD's autoencoder backbone (`MadCompressor`). A switch adds its parameters (the report lists each
arm's count), as in the paper's ladder.

Verdicts, seeds paired: per task, the full FEM-SM against softmax attention (better by half Table 1's gap where it
has one, not worse by more than 1 point where both are at 99.9 or 85.7-85.9); on the mean over Table 1's tasks but
memorize (`LADDER_TASKS`: every Table 1 row has memorize at 85.4-85.9, and every arm learns our generator's to the
ceiling, so it moves no rung and no run sits in its band; Table 1's rows are averaged alike), the full model
against softmax, the first rung (+C over softmax) and the two rungs the paper names as the major jumps (+L over +C,
+T over +C,L), each better by half its Table 1 step. Each needs its baseline within ``REGIME_BAND`` of its Table 1
level: MAD's regime, where the tasks separate the arms (the ladder's rungs are those averages at MAD's budget,
judged only there). The CPU setting (width 64 instead of MAD's 128, sequences of 64, 300 steps of
batch 32, a grid of two learning rates) runs the four tasks softmax can learn there and writes "needs a GPU" rows for
compress and fuzzy recall, which no arm learned at that budget; ``--paper-scale`` is MAD's own budget (width 128,
full lengths, 200 epochs of 12,800 examples in batches of 128 = 20,000 steps, the grid of six, all six tasks).
"""

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import cache, partial
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import get_cosine_schedule_with_warmup

from ..data.mad import IGNORE, TASKS, MadTask, mad_split
from ..modeling.configuration_fem import FEMConfig
from ..modeling.errors import UserError
from ..modeling.modeling_fem import FEMForCausalLM, FEMModel
from .processes import runs_mapped
from .verdict import Claim, judged, ledger_lines, mean_std

SWITCHES = {"C": "use_time_decay", "L": "use_lse", "T": "use_temperature_gate", "G": "use_outer_gate"}
ARMS = ("softmax", "C", "CL", "CLT", "CLTG")  # Table 1's ladder; an arm's letters are its switches
FULL = "CLTG"
TABLE_1 = {  # task: (softmax, full FEM-SM) accuracy (%) of fem.txt Table 1
    "compress": (44.3, 53.1), "fuzzy_recall": (24.5, 43.1), "in_context_recall": (99.9, 99.9),
    "memorize": (85.7, 85.9), "noisy_recall": (98.5, 99.9), "selective_copy": (95.1, 99.3)}
PARITY_MARGIN = 0.01  # where Table 1's two rows are within 0.2 points, the claim is "not worse by 1 point"
# A replay's tolerance: FEM's float32 sums have run in another order since this report's code (the joint projections'
# backward, issues 64-65), which 300 steps grow to 1.2e-4 of accuracy in the replayed part; 3.5e-4 is a tenth of the
# smallest effect of interest here (the ladder's first rung, 0.0035): a replay within it shows rounding, not a change
REPLAY_TOLERANCE = 3.5e-4
REGIME_BAND = 0.10  # how far (accuracy) softmax may sit from its Table 1 level for the run to answer the claim
TABLE_1_ROWS = {  # arm: Table 1's accuracies (%) per task, in `TABLE_1`'s order
    "softmax": (44.3, 24.5, 99.9, 85.7, 98.5, 95.1), "C": (45.0, 31.4, 99.9, 85.5, 99.9, 96.3),
    "CL": (50.3, 39.0, 99.9, 85.4, 99.9, 98.0), "CLT": (52.3, 39.1, 99.9, 85.8, 99.9, 99.4),
    "CLTG": (53.1, 43.1, 99.9, 85.9, 99.9, 99.3)}
# The ladder's means leave memorize out: every Table 1 row has it at 85.4-85.9 (it moves no rung), and our generator's
# memorize is learned to the ceiling by every arm, so no run can sit in its band; Table 1's rows are averaged over the
# same five tasks
LADDER_TASKS = tuple(name for name in TABLE_1 if name != "memorize")
LADDER = {  # (arm, baseline): the paper's words (with Table 1's six-task averages)
    (FULL, "softmax"): "FEM-SM outperforms all other baselines by a clear margin (average 80.2 vs 74.7)",
    ("C", "softmax"): "the ladder's first rung, the time-decay conditioner (Table 1: 76.3 vs 74.7 average)",
    ("CL", "C"): "the two major performance jumps occur after introducing +L (LSE) (78.8 vs 76.3)",
    ("CLT", "CL"): "... and +T (temperature) (79.4 vs 78.8)",
}


def ladder_mean(arm: str) -> float:
    """Table 1's accuracy (%) of a ladder row, averaged over `LADDER_TASKS`."""
    return statistics.fmean(value for name, value in zip(TABLE_1, TABLE_1_ROWS[arm]) if name in LADDER_TASKS)


UNLEARNED_ON_CPU = ("compress", "fuzzy_recall")  # no arm learns them at the CPU budget (the quick ledger's finding)


def task_claim(task: MadTask) -> Claim:
    softmax, full = TABLE_1[task.name]
    parity = full - softmax < 1.0
    effect = dict(effect=PARITY_MARGIN, effect_source="1 point: Table 1's rows within 0.2") if parity else dict(
        effect=round((full - softmax) / 200, 4), effect_source=f"half Table 1's {full - softmax:.1f}-point gap")
    return Claim(f"FEM-SM {'matches' if parity else 'beats'} softmax attention on {task.name} ({full} vs {softmax})",
                 "fem.txt Table 1", FULL, "softmax", f"{task.name} test macro accuracy",
                 kind="not_worse" if parity else "better", chance=task.chance, ceiling=1.0,
                 paper_baseline=softmax / 100, paper_band=REGIME_BAND, **effect)


def ladder_claim(arm: str, baseline: str) -> Claim:
    """A rung of Table 1's ladder on the mean over `LADDER_TASKS`: better by half the step Table 1's rows give on
    those tasks, the baseline within ``REGIME_BAND`` of its Table 1 mean; the first claim is FEM's ladder claim."""
    upper, lower = ladder_mean(arm), ladder_mean(baseline)
    return Claim(LADDER[arm, baseline], "fem.txt §4, Table 1", arm, baseline,
                 "mean test macro accuracy over Table 1's tasks but memorize", effect=round((upper - lower) / 200, 4),
                 effect_source=f"half Table 1's {upper - lower:.2f}-point step on those tasks",
                 paper_effect=round((upper - lower) / 100, 4), paper_baseline=round(lower / 100, 4),
                 paper_band=REGIME_BAND, regime_source=f"Table 1's {baseline} at {lower:.2f} on those tasks; the "
                                                       f"10-point band is our choice (Table 1 gives no spread)")


@dataclass
class Settings:
    tasks: list[str] = field(default_factory=lambda: [name for name in TASKS if name not in UNLEARNED_ON_CPU])
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    value_ratio: float = 1.0
    steps: int = 300
    batch_size: int = 32
    learning_rates: list[float] = field(default_factory=lambda: [5e-4, 2e-3])  # MAD's grid: 1e-4, 5e-4, 1e-3
    weight_decays: list[float] = field(default_factory=lambda: [0.0])  # MAD's grid: 0.0, 0.1
    test_examples: int = 1280
    max_length: int | None = 64
    workers: int = 2
    device: str = "cpu"  # where each model trains ("cuda" at MAD's budget, with workers=1)

    def __post_init__(self):
        unknown = [name for name in self.tasks if name not in TASKS] + [arm for arm in self.arms if arm not in ARMS]
        if self.workers < 1:
            raise UserError(f"fem-mad workers must be >= 1, got {self.workers}")
        if not self.learning_rates or not self.weight_decays:
            raise UserError(f"fem-mad learning_rates and weight_decays are the grid: each needs a value, got "
                            f"{self.learning_rates} and {self.weight_decays}")
        if unknown or not {"softmax", FULL} <= set(self.arms):
            raise UserError(f"fem-mad tasks must be among {list(TASKS)} and arms among {list(ARMS)} (softmax and "
                             f"{FULL} included), got tasks {self.tasks}, arms {self.arms}")


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """(length, width) sine-cosine position codes (Vaswani et al. 2017), the decoder's positions in MAD's
    autoencoder."""
    frequencies = torch.exp(-math.log(10_000.0) * torch.arange(0, width, 2) / width)
    angles = torch.arange(length).unsqueeze(1) * frequencies
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class MadCompressor(torch.nn.Module):
    """MAD's autoencoder for compress: the FEM model encodes the sequence; its last position's state plus each
    position's sine-cosine code is decoded by a non-expanding two-layer GELU MLP and a linear readout."""

    def __init__(self, config: FEMConfig):
        super().__init__()
        width = config.hidden_size
        self.encoder = FEMModel(config)
        self.decoder = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.RMSNorm(width),
            torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.RMSNorm(width),
            torch.nn.Linear(width, config.vocab_size))
        self.register_buffer("positions", sinusoidal_positions(config.max_position_embeddings, width),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        state = self.encoder(input_ids=input_ids).last_hidden_state[:, -1:]
        return self.decoder(state + self.positions[: input_ids.shape[1]])


class MadLanguageModel(torch.nn.Module):
    """The FEM causal LM's logits, for every other task."""

    def __init__(self, config: FEMConfig):
        super().__init__()
        self.model = FEMForCausalLM(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def build(arm: str, task: MadTask, settings: Settings) -> torch.nn.Module:
    switches = {} if arm == "softmax" else set(arm)
    config = FEMConfig(hidden_size=settings.hidden_size, num_hidden_layers=settings.layers,
                       num_attention_heads=settings.heads, intermediate_size=4 * settings.hidden_size,
                       vocab_size=task.vocab_size, max_position_embeddings=task.seq_len,
                       value_ratio=settings.value_ratio, tie_word_embeddings=False,
                       **{name: letter in switches for letter, name in SWITCHES.items()})
    config._attn_implementation = "sdpa"
    return (MadCompressor if task.autoencoder else MadLanguageModel)(config)


def _loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


@torch.no_grad()
def accuracy(model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 256) -> float:
    """MAD's macro accuracy over the scored targets: each target class's recall, averaged over the classes present."""
    from sklearn.metrics import balanced_accuracy_score

    model.eval()
    predicted, wanted = [], []
    for start in range(0, len(inputs), batch_size):
        labels = targets[start:start + batch_size]
        scored = labels != IGNORE
        device = next(model.parameters()).device
        predicted.append(model(inputs[start:start + batch_size].to(device)).argmax(-1).cpu()[scored])
        wanted.append(labels[scored])
    return float(balanced_accuracy_score(torch.cat(wanted).numpy(), torch.cat(predicted).numpy()))


@cache
def task_data(name: str, max_length: int | None, test_examples: int):
    """The task (shortened), its training set (MAD's size, data seed 12345), its validation set (seed 11111) and its
    test set (seed 54321), the same for every arm and seed."""
    task = TASKS[name].shortened(max_length)
    return (task, mad_split(task, task.train_examples, seed=12345, training=True),
            mad_split(task, test_examples, seed=11111, training=False),
            mad_split(task, test_examples, seed=54321, training=False))


def train_arm(settings: Settings, arm: str, name: str, seed: int, learning_rate: float, weight_decay: float) -> dict:
    """One model trained ``steps`` steps on epochs of the task's training set in the seed's order; its validation
    and test accuracy."""
    task, (inputs, targets), validation, test = task_data(name, settings.max_length, settings.test_examples)
    torch.manual_seed(seed)
    model = build(arm, task, settings).to(settings.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    schedule = get_cosine_schedule_with_warmup(optimizer, settings.steps // 10, settings.steps)
    generator = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    for _ in range(settings.steps):
        if len(order) < settings.batch_size:
            order = torch.cat([order, torch.randperm(len(inputs), generator=generator)])
        batch, order = order[:settings.batch_size], order[settings.batch_size:]
        loss = _loss(model, inputs[batch].to(settings.device), targets[batch].to(settings.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return {"task": name, "length": task.seq_len, "arm": arm, "seed": seed, "learning_rate": learning_rate,
            "weight_decay": weight_decay, "train_loss": loss.item(),
            "validation_accuracy": accuracy(model, *validation), "accuracy": accuracy(model, *test),
            "parameters": sum(p.numel() for p in model.parameters())}


def chosen_on_validation(runs: list[dict], settings: Settings) -> list[dict]:
    """Per (task, arm), the runs of the grid point with the best mean validation accuracy over seeds."""
    chosen = []
    for name in settings.tasks:
        for arm in settings.arms:
            points = {}
            for row in runs:
                if row["task"] == name and row["arm"] == arm:
                    points.setdefault((row["learning_rate"], row["weight_decay"]), []).append(row)
            best = max(points.values(), key=lambda rows: statistics.fmean(row["validation_accuracy"] for row in rows))
            chosen += best
    return chosen


def run(settings: Settings, progress=print) -> dict:
    """Every (task, seed, arm) run, in ``workers`` processes (`runs_mapped`)."""
    started = time.perf_counter()
    jobs = [(arm, name, seed, rate, decay) for name in settings.tasks for seed in settings.seeds
            for arm in settings.arms for rate in settings.learning_rates for decay in settings.weight_decays]
    progress(f"{len(jobs)} runs of {settings.steps} steps ({len(settings.tasks)} tasks x {len(settings.seeds)} seeds "
             f"x arms {settings.arms} x learning rates {settings.learning_rates} x weight decays "
             f"{settings.weight_decays}) in {settings.workers} process(es)")
    with runs_mapped(settings.workers) as mapped:
        runs = []
        for row in mapped(partial(train_arm, settings), *zip(*jobs)):
            progress(f"{row['task']} (L = {row['length']}), seed {row['seed']}, {row['arm']}, lr "
                     f"{row['learning_rate']:g}, wd {row['weight_decay']:g}: validation "
                     f"{100 * row['validation_accuracy']:.1f} %")
            runs.append(row)
    rows = chosen_on_validation(runs, settings)
    return {"settings": asdict(settings), "grid": runs, "rows": rows, "verdicts": verdicts(rows, settings),
            "seconds": time.perf_counter() - started}


def replayed_part(report: dict) -> list[dict]:
    """The replayed part (`Experiment.replay`: in-context recall, seed 0, every arm at every grid point) of
    ``report``: those runs of its grid."""
    return [row for row in report["grid"] if row["task"] == "in_context_recall" and row["seed"] == 0]


def verdicts(rows: list[dict], settings: Settings) -> list[dict]:
    def scores(arm: str, task: str | None = None) -> list[float]:
        """Per seed: the task's accuracy, or the mean over `LADDER_TASKS`."""
        return [statistics.fmean(row["accuracy"] for row in rows if row["arm"] == arm and row["seed"] == seed
                                 and (row["task"] == task if task else row["task"] in LADDER_TASKS))
                for seed in settings.seeds]

    paper_budget = settings.steps * settings.batch_size >= 200 * 12_800 and settings.max_length is None
    records = [judged(task_claim(TASKS[name]), scores(FULL, name), scores("softmax", name), task=name)
               for name in settings.tasks]
    if not paper_budget:  # the rows of the tasks the CPU setting leaves out
        records += [judged(task_claim(TASKS[name]), [], [], task=name, needs_gpu="no arm learns it at the CPU "
                           "budget; MAD's budget: energyzoo reproduce fem-mad --paper-scale")
                    for name in UNLEARNED_ON_CPU if name not in settings.tasks]
    # Table 1's averages are over its tasks at MAD's budget: a mean over fewer tasks or budgets is another number
    ladder_regime = None if paper_budget and set(LADDER_TASKS) <= set(settings.tasks) else (
        "the ladder's means are over Table 1's tasks (but memorize) at MAD's budget: energyzoo reproduce fem-mad "
        "--paper-scale")
    records += [judged(ladder_claim(arm, baseline), scores(arm), scores(baseline), needs_gpu=ladder_regime)
                for arm, baseline in LADDER if {arm, baseline} <= set(settings.arms)]
    return records


def format_markdown(report: dict) -> str:
    settings = report["settings"]
    arms, tasks = settings["arms"], settings["tasks"]
    lines = [f"MAD ({report['seconds']:.0f} s): width {settings['hidden_size']}, {settings['layers']} blocks, "
             f"{settings['steps']} steps of batch {settings['batch_size']}, the grid point best on validation of "
             f"learning rates {settings['learning_rates']} x weight decays {settings['weight_decays']}, sequences "
             f"shortened to {settings['max_length']}; test macro accuracy (%), mean +- std over seeds "
             f"{settings['seeds']}. Table 1's softmax / FEM-SM in brackets.", "",
             "| task | " + " | ".join(arms) + " | Table 1 |", "|---|" + "---|" * (len(arms) + 1)]
    for task in tasks:
        cells = []
        for arm in arms:
            mean, std = mean_std([100 * row["accuracy"] for row in report["rows"]
                                  if row["task"] == task and row["arm"] == arm])
            cells.append(f"{mean:.1f} +- {std:.1f}")
        lines.append(f"| {task} | " + " | ".join(cells) + f" | {TABLE_1[task][0]} / {TABLE_1[task][1]} |")
    counts = {arm: next(row["parameters"] for row in report["rows"] if row["arm"] == arm and row["task"] == tasks[0])
              for arm in arms}
    lines += ["", f"Parameters on {tasks[0]}: " + ", ".join(f"{arm} {count:,}" for arm, count in counts.items()) + "."]
    lines += ledger_lines(report["verdicts"], "Verdicts (`energyzoo.reproduce.verdict`, seeds paired):")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Test accuracy per task along the ladder, one line per seed."""
    from matplotlib.figure import Figure

    settings = report["settings"]
    tasks, arms = settings["tasks"], settings["arms"]
    figure = Figure(figsize=(3 * len(tasks), 3.2))
    axes = figure.subplots(1, len(tasks), squeeze=False)[0]
    for axis, task in zip(axes, tasks):
        for seed in settings["seeds"]:
            axis.plot(range(len(arms)), [100 * row["accuracy"] for arm in arms for row in report["rows"]
                                         if row["task"] == task and row["arm"] == arm and row["seed"] == seed], "o-")
        axis.set_xticks(range(len(arms)), arms)
        axis.set_title(task, fontsize=9)
    axes[0].set_ylabel("test accuracy (%)")
    figure.suptitle("fem.txt Table 1 at CPU scale: the MAD ladder")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
