"""`energyzoo reproduce fem-lm`: fem.txt §4's language-modelling claim (Table 2: FEM-SM against a Transformer of the
same budget) at CPU scale.

Arms, trained by the same recipe (`fem-lm-tiny`: the embedded Python documentation, a BPE tokenizer trained on it,
blocks of 128 tokens, AdamW with the paper's betas, weight decay 0.1 and clipping 1.0) on the same blocks in the same
order per seed: ``fem`` (`fem-lm-tiny`, FEM-SM with every switch on, the paper's budget (i): value path at D/2) and
``llama`` (`llama-tiny`, the Transformer++ of Table 2, same width, depth, heads, MLP and vocabulary; 1.1 % fewer
parameters). Metrics on the held-out documents after the last step: validation loss (nats per token) and
next-token accuracy. Differences from the paper, by necessity of a CPU run: 1.3M parameters instead of 340M, a
~1 MB corpus instead of 15B tokens of FineWeb-Edu, lm-eval's task suite replaced by held-out loss (a 1M-parameter
model scores at chance on every Table 2 task). The full setting trains 400 steps (the corpus passes several times:
a corpus large enough for one epoch would need the Hub, so this experiment has no paper-scale setting here) and
reports the validation curve at ``evaluations`` points.
"""

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..training.checkpoints import METRICS
from ..training.recipe import load_recipe
from ..training.run import run_training
from .verdict import Claim, judged, ledger_lines, mean_std

RECIPE = "fem-lm-tiny"
ARMS = {"fem": "fem-lm-tiny", "llama": "llama-tiny"}  # arm: preset
TABLE_2 = "FEM-SM outperforms the Transformer baseline of the same size across model scales"
METRICS_OF_CLAIMS = {"validation_loss": False, "validation_next_token_accuracy": True}  # metric: higher is better
PRIMARY_METRIC = "validation_loss"  # FEM's primary claim: Table 2 on held-out loss, declared before the run


EFFECTS = {  # metric: (smallest effect of interest, where it comes from)
    "validation_loss": (0.02, "Table 2 reports no loss: 2 % perplexity, our choice"),
    "validation_next_token_accuracy": (0.005, "Table 2 reports no token accuracy: 0.5 points, our choice"),
}


def language_model_claim(metric: str, vocabulary: int = 2048) -> Claim:
    """The uniform predictor's loss (log of the vocabulary the recipe trains, 2,048) and accuracy are the floor the
    regime guard checks."""
    effect, source = EFFECTS[metric]
    chance = math.log(vocabulary) if metric == "validation_loss" else 1 / vocabulary
    return Claim(TABLE_2, "fem.txt §4, Table 2", "fem", "llama", metric, effect=effect, effect_source=source,
                 higher_is_better=METRICS_OF_CLAIMS[metric], chance=chance, primary=metric == PRIMARY_METRIC)


@dataclass
class Settings:
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    steps: int = 400
    evaluations: int = 8  # points of the validation curve


def _train(preset: str, seed: int, settings: Settings, output_dir: Path):
    steps = settings.steps
    recipe = load_recipe(RECIPE, [f"model.preset={preset}", f"training.seed={seed}", f"training.steps={steps}",
                                  f"training.eval_every={max(1, steps // settings.evaluations)}",
                                  f"training.save_every={steps}", f"output_dir={output_dir}"])
    return run_training(recipe, overwrite=True, progress=False)


def validation_curve(output_dir: Path) -> list[dict]:
    """Every evaluation of a run (its metrics file's rows with a validation loss): step, loss and accuracy."""
    rows = [json.loads(line) for line in (Path(output_dir) / METRICS).read_text().splitlines()]
    return [{key: row[key] for key in ("step", *METRICS_OF_CLAIMS)} for row in rows if "validation_loss" in row]


def run(settings: Settings, output_dir: str | Path, progress=print) -> dict:
    started = time.perf_counter()
    rows = []
    for seed in settings.seeds:
        for arm, preset in ARMS.items():
            progress(f"seed {seed}: training {arm} ({preset}) for {settings.steps} steps")
            result = _train(preset, seed, settings, Path(output_dir) / f"{arm}-s{seed}")
            rows.append({"arm": arm, "seed": seed, "losses": result.losses,
                         "curve": validation_curve(result.output_dir),
                         **{metric: result.final_metrics[metric] for metric in METRICS_OF_CLAIMS}})
    verdicts = [judged(language_model_claim(metric), *([row[metric] for row in rows if row["arm"] == arm]
                                                        for arm in ("fem", "llama"))) for metric in METRICS_OF_CLAIMS]
    return {"settings": asdict(settings), "rows": rows, "verdicts": verdicts,
            "seconds": time.perf_counter() - started}


def format_markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [f"Language modelling on the embedded Python documentation ({report['seconds']:.0f} s): recipe "
             f"`{RECIPE}`, {settings['steps']} steps per model, held-out documents, mean +- std over seeds "
             f"{settings['seeds']}.", "", "| arm | preset | validation loss | next-token accuracy (%) |",
             "|---|---|---|---|"]
    for arm, preset in ARMS.items():
        runs = [row for row in report["rows"] if row["arm"] == arm]
        loss, loss_std = mean_std([row["validation_loss"] for row in runs])
        accuracy, accuracy_std = mean_std([100 * row["validation_next_token_accuracy"] for row in runs])
        lines.append(f"| {arm} | {preset} | {loss:.4f} +- {loss_std:.4f} | {accuracy:.2f} +- {accuracy_std:.2f} |")
    steps = [point["step"] for point in report["rows"][0]["curve"]]
    lines += ["", "The validation curve (loss, mean over seeds):", "",
              "| arm | " + " | ".join(f"step {step}" for step in steps) + " |", "|---|" + "---|" * len(steps)]
    for arm in ARMS:
        curves = [row["curve"] for row in report["rows"] if row["arm"] == arm]
        means = [mean_std([curve[index]["validation_loss"] for curve in curves])[0] for index in range(len(steps))]
        lines.append(f"| {arm} | " + " | ".join(f"{mean:.4f}" for mean in means) + " |")
    lines += ledger_lines(report["verdicts"], "Verdicts (`energyzoo.reproduce.verdict`, seeds paired):")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """The training loss of every run."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5, 3.6))
    axis = figure.subplots()
    for index, arm in enumerate(ARMS):
        for row in report["rows"]:
            if row["arm"] == arm:
                axis.plot(row["losses"], color=f"C{index}", alpha=0.7,
                          label=arm if row["seed"] == report["settings"]["seeds"][0] else None)
    axis.set_xlabel("step")
    axis.set_ylabel("training loss")
    axis.set_title("fem.txt Table 2 at CPU scale: FEM-SM vs Llama")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
