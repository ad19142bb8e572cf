"""`energyzoo reproduce fem-lm`: fem.txt §4's language-modelling claim (Table 2: FEM-SM against a Transformer of the
same budget) at CPU scale.

Arms, trained by the same recipe (`fem-lm-tiny`: blocks of 128 tokens, batch 16, AdamW with the paper's betas,
weight decay 0.1 and clipping 1.0) on the same blocks in the same order per seed: ``fem`` (`fem-lm-tiny`, FEM-SM with
every switch on, the paper's budget (i): value path at D/2) and ``llama`` (`llama-tiny`, the Transformer++ of Table 2,
same width, depth, heads, MLP and vocabulary; 1.1 % fewer parameters).

The corpus is the CPython standard library's source (`energyzoo.data.text.python_stdlib_corpus`: every module file
that ships with Python, 2.70M training tokens under the 2,048-token BPE trained on it), split by file into
training, validation and test parts; the full setting's 1,000 steps of 16 x 128 tokens read 0.76 of the training
part, so no block is seen twice. Each arm gets its own learning rate: every point of ``learning_rates`` is trained
with the first ``grid_seeds`` seeds, and the one with the lowest mean validation loss at the last step is the arm's
(the paper tunes neither arm on our data, so neither inherits the other's rate); the remaining seeds run at it.

Declared before the run: the primary claim is held-out loss (nats per token) on the test part, read once per run
after the last step; next-token accuracy there is secondary. The validation curve of every run (``evaluations``
points) is kept in the report and the ledger, so that "faster early, equal later" shows. Differences from the paper,
by necessity of a CPU run: 1.3M parameters instead of 340M, 2M tokens of Python source instead of 15B of
FineWeb-Edu, and held-out loss instead of lm-eval's tasks (a 1M-parameter model scores at chance on every Table 2
task, and Table 2 reports no loss: the smallest effect of interest is ours, the row says why). A corpus of the
paper's kind needs the Hub, so this experiment has no paper-scale setting here.
"""

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..data.text import pack_into_blocks, python_stdlib_test_documents
from ..modeling.errors import UserError
from ..training.checkpoints import METRICS
from ..training.recipe import load_recipe
from ..training.run import run_training
from ..training.tasks import TrainingData, training_task
from ..training.validation import evaluate
from .report import curve_table
from .verdict import Claim, judged, ledger_lines, mean_std

RECIPE = "fem-lm-tiny"
ARMS = {"fem": "fem-lm-tiny", "llama": "llama-tiny"}  # arm: preset
# the recipe's data moved to the standard library; a twentieth of its files validate (about 1,200 blocks, read at
# every point of the curve)
CORPUS = ("data.source=python-stdlib", "data.language=null", "data.validation_fraction=0.05")
TABLE_2 = "FEM-SM outperforms the Transformer baseline of the same size across model scales"
METRICS_OF_CLAIMS = {"loss": False, "next_token_accuracy": True}  # metric on the test part: higher is better
PRIMARY_METRIC = "loss"  # declared before the run (module docstring)
# A replay's tolerance: FEM's float32 sums have run in another order since this report's code (the joint projections'
# backward, issues 64-65): Llama's arm replays to the bit and FEM's first differs at step 2 by one ulp of the loss,
# growing over 1,000 steps to 7e-4 nats of test loss and 4e-4 of accuracy. 1e-3 is a twentieth of the loss effect
# (0.02) and a fifth of the accuracy effect (0.005): a replay within it shows rounding, not a change of the model
REPLAY_TOLERANCE = 1e-3
EFFECTS = {  # metric: (smallest effect of interest, where it comes from)
    "loss": (0.02, "Table 2 reports lm-eval accuracies only, at chance for a 1M-parameter model: 2 % of perplexity "
                   "(0.02 nats), our choice"),
    "next_token_accuracy": (0.005, "Table 2 reports no token accuracy: half a point, our choice"),
}


def language_model_claim(metric: str, vocabulary: int = 2048) -> Claim:
    """The uniform predictor's loss (log of the vocabulary the recipe trains, 2,048) and accuracy are the floor the
    regime guard checks."""
    effect, source = EFFECTS[metric]
    chance = math.log(vocabulary) if metric == "loss" else 1 / vocabulary
    return Claim(TABLE_2, "fem.txt §4, Table 2", "fem", "llama", f"test {metric.replace('_', ' ')}", effect=effect,
                 effect_source=source, higher_is_better=METRICS_OF_CLAIMS[metric], chance=chance,
                 regime_source="the uniform predictor over the 2,048-token vocabulary",
                 primary=metric == PRIMARY_METRIC)


@dataclass
class Settings:
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    steps: int = 1000
    # the budget: 14 runs of 1,000 steps, about two hours on 2 CPU cores (a validation pass over the ~1,200
    # validation blocks costs about 20 s)
    evaluations: int = 5  # points of the validation curve
    learning_rates: list[float] = field(default_factory=lambda: [1e-3, 3e-3, 1e-2])  # each arm's grid
    grid_seeds: int = 1  # the first seeds, which train every point of the grid

    def __post_init__(self):
        if not 1 <= self.grid_seeds <= len(self.seeds) or len(self.learning_rates) < 1:
            raise UserError(f"fem-lm grid_seeds must be between 1 and the number of seeds ({len(self.seeds)}) and "
                            f"learning_rates non-empty, got {self.grid_seeds} and {self.learning_rates}")


def _train(preset: str, seed: int, learning_rate: float, settings: Settings, output_dir: Path):
    steps = settings.steps
    recipe = load_recipe(RECIPE, [*CORPUS, f"model.preset={preset}", f"training.seed={seed}",
                                  f"training.learning_rate={learning_rate}", f"training.steps={steps}",
                                  f"training.eval_every={max(1, steps // settings.evaluations)}",
                                  f"training.save_every={steps}", f"output_dir={output_dir}"])
    return run_training(recipe, overwrite=True, progress=False)


def validation_curve(output_dir: Path) -> list[dict]:
    """Every evaluation of a run (its metrics file's rows with a validation loss): step, loss and accuracy."""
    rows = [json.loads(line) for line in (Path(output_dir) / METRICS).read_text().splitlines()]
    return [{"step": row["step"], **{metric: row[f"validation_{metric}"] for metric in METRICS_OF_CLAIMS}}
            for row in rows if "validation_loss" in row]


def test_metrics(model_dir: Path) -> dict:
    """Loss and next-token accuracy on the standard library's test part, with the run's own tokenizer (the
    validation code, given the test blocks)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    blocks = pack_into_blocks(python_stdlib_test_documents(), tokenizer, load_recipe(RECIPE).data.block_size)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    measured = evaluate(model, TrainingData(None, None, blocks, blocks), training_task("causal-lm"),
                        Accelerator(cpu=True))
    return {metric: measured[f"validation_{metric}"] for metric in METRICS_OF_CLAIMS}


def run(settings: Settings, output_dir: str | Path, progress=print) -> dict:
    started = time.perf_counter()
    rows, chosen, grid = [], {}, {}

    def train(arm: str, seed: int, rate: float) -> dict:
        progress(f"seed {seed}: training {arm} ({ARMS[arm]}) at learning rate {rate:g} for {settings.steps} steps")
        result = _train(ARMS[arm], seed, rate, settings, Path(output_dir) / f"{arm}-lr{rate:g}-s{seed}")
        curve = validation_curve(result.output_dir)
        return {"arm": arm, "seed": seed, "learning_rate": rate, "losses": result.losses, "curve": curve,
                "validation_loss": curve[-1]["loss"], "model_dir": result.model_dir}

    for arm in ARMS:
        grid_seeds = settings.seeds[:settings.grid_seeds]
        runs = [train(arm, seed, rate) for rate in settings.learning_rates for seed in grid_seeds]
        grid[arm] = {rate: statistics.fmean(run["validation_loss"] for run in runs if run["learning_rate"] == rate)
                     for rate in settings.learning_rates}
        chosen[arm] = min(grid[arm], key=lambda rate: grid[arm][rate] if math.isfinite(grid[arm][rate]) else math.inf)
        kept = [run for run in runs if run["learning_rate"] == chosen[arm]]
        kept += [train(arm, seed, chosen[arm]) for seed in settings.seeds[settings.grid_seeds:]]
        for run in kept:
            rows.append({**{key: value for key, value in run.items() if key != "model_dir"},
                         **test_metrics(run["model_dir"])})
    verdicts = [judged(language_model_claim(metric), *([row[metric] for row in rows if row["arm"] == arm]
                                                        for arm in ARMS)) for metric in METRICS_OF_CLAIMS]
    return {"settings": asdict(settings), "learning_rate_grid": {arm: {f"{rate:g}": loss for rate, loss in
                                                                      losses.items()} for arm, losses in grid.items()},
            "learning_rates": chosen, "rows": rows, "validation_curves": mean_curves(rows), "verdicts": verdicts,
            "seconds": time.perf_counter() - started}


def replayed_part(report: dict) -> list[dict]:
    """The replayed part (`Experiment.replay`: seed 0 of both arms at their learning rate, 3e-3 in the shipped
    report) of ``report``: what its tables and verdicts read of those runs (test metrics, validation curve), to
    ``REPLAY_TOLERANCE``; the per-step training losses (single batches, only plotted) are left out."""
    return [{key: value for key, value in row.items() if key != "losses"} for row in report["rows"]
            if row["seed"] == 0]


def mean_curves(rows: list[dict]) -> dict:
    """Per arm, the validation loss at each evaluated step: mean and std over the seeds at its learning rate."""
    curves = {}
    for arm in ARMS:
        runs = [row["curve"] for row in rows if row["arm"] == arm]
        curves[arm] = [{"step": point["step"], **dict(zip(("mean", "std"), mean_std([run[index]["loss"]
                                                                                     for run in runs])))}
                       for index, point in enumerate(runs[0])]
    return curves


def format_markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [f"Language modelling on the CPython standard library's source ({report['seconds']:.0f} s): recipe "
             f"`{RECIPE}`, {settings['steps']} steps per model, each arm at its learning rate of "
             f"{settings['learning_rates']} (lowest mean validation loss over seeds "
             f"{settings['seeds'][:settings['grid_seeds']]}), held-out test files, mean +- std over seeds "
             f"{settings['seeds']}.", "",
             "| arm | preset | learning rate | validation loss per rate of the grid | test loss | test next-token "
             "accuracy (%) |", "|---|---|---|---|---|---|"]
    for arm, preset in ARMS.items():
        runs = [row for row in report["rows"] if row["arm"] == arm]
        loss, loss_std = mean_std([row["loss"] for row in runs])
        accuracy, accuracy_std = mean_std([100 * row["next_token_accuracy"] for row in runs])
        grid = ", ".join(f"{rate}: {value:.4f}" for rate, value in report["learning_rate_grid"][arm].items())
        lines.append(f"| {arm} | {preset} | {report['learning_rates'][arm]:g} | {grid} | {loss:.4f} +- "
                     f"{loss_std:.4f} | {accuracy:.2f} +- {accuracy_std:.2f} |")
    lines += ["", curve_table(report["validation_curves"])]
    lines += ledger_lines(report["verdicts"], "Verdicts (`energyzoo.reproduce.verdict`, seeds paired):")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """The training loss of every run at its arm's learning rate, and the mean validation curves."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 3.6))
    training, validation = figure.subplots(1, 2)
    for index, arm in enumerate(ARMS):
        for row in report["rows"]:
            if row["arm"] == arm:
                training.plot(row["losses"], color=f"C{index}", alpha=0.6,
                              label=arm if row["seed"] == report["settings"]["seeds"][0] else None)
        points = report["validation_curves"][arm]
        validation.errorbar([point["step"] for point in points], [point["mean"] for point in points],
                            yerr=[point["std"] for point in points], color=f"C{index}", marker="o", label=arm)
    training.set(xlabel="step", ylabel="training loss")
    validation.set(xlabel="step", ylabel="validation loss (mean +- std over seeds)")
    training.legend()
    validation.legend()
    figure.suptitle("fem.txt Table 2 at CPU scale: FEM-SM vs Llama, each at its learning rate")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
