"""`energyzoo reproduce eer-block-screen`: the choices eer.txt leaves unstated, screened on the induction task.

§5.1 gives the block only as "attention then MLP" and §6 the width; the normalisation, the embedding scale, the
readout and the training schedule are unstated, and `energyzoo reproduce eer-induction` does not reach the paper's
numbers with the reading chosen so far (`EERConfig`'s defaults). Each arm changes one choice (an `EERConfig` field
or the recipe's length curriculum) and trains EER with the paper's loss by the `eer-induction` recipe at T = 4 loops
(which learns as T = 25 does at this scale, several times cheaper), seeds paired; every arm is judged against the
default reading on accuracy at L = 64 (the training lengths) and reported at L = 1000 (the paper's extrapolation).
One arm is an initialisation near App. C's epoch-0 kinetic energy (K = 93.8, which PyTorch's own initialisation
does not reach: `EERConfig.initializer_range`).
"""

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..modeling.errors import UserError
from ..training.recipe import load_recipe
from ..training.run import run_training
from .eer_induction import chance, length_evaluator
from .verdict import Claim, judged, ledger_lines, mean_std

DEFAULT = "default"
ARMS = {  # arm: recipe overrides ({steps}: the run's steps)
    DEFAULT: (),
    "post-norm": ("model.overrides.norm_placement=post",),
    "no-attention-norm": ("model.overrides.attention_norm=false",),
    "embedding-std-0.1": ("model.overrides.embedding_init_std=0.1",),
    "readout-without-x": ("model.overrides.readout_with_inputs=false",),
    "length-curriculum": ("data.length_curriculum_steps={half}",),
    # App. C's epoch-0 row has K = 93.8: N(0, 0.26) weights give K of 50-105 on a first batch (PyTorch's: 32-42)
    "app-c-epoch-0-init": ("model.overrides.initializer_range=0.26",),
}
SCREEN_EFFECT = 0.02  # two points of accuracy: the paper states none for choices it does not state
LENGTHS = (64, 1000)


def block_claim(arm: str, loops: int, sequences: int = 128) -> Claim:
    return Claim(f"{arm} trains the induction task better than the default reading (T = {loops})",
                 "eer.txt §5.1-6 (unstated choices)", arm, DEFAULT, "accuracy at L = 64", effect=SCREEN_EFFECT,
                 effect_source="two points, our choice (the paper states none)", chance=chance(64, sequences),
                 ceiling=1.0, regime_source="chance from the held-out data (App. C's epoch-0 predictor), the ceiling 1")


@dataclass
class Settings:
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    loops: int = 4
    steps: int = 1000
    eval_sequences: int = 128

    def __post_init__(self):
        unknown = [arm for arm in self.arms if arm not in ARMS]
        if unknown or DEFAULT not in self.arms:
            raise UserError(f"eer-block-screen arms must include {DEFAULT!r} and be among {list(ARMS)}, got "
                             f"{self.arms}")


def run(settings: Settings, output_dir: str | Path, progress=print) -> dict:
    started = time.perf_counter()
    output_dir = Path(output_dir)
    rows = []
    for arm in settings.arms:
        for seed in settings.seeds:
            progress(f"{arm}, seed {seed}: {settings.steps} steps at T = {settings.loops}")
            overrides = [override.format(half=settings.steps // 2) for override in ARMS[arm]]
            recipe = load_recipe("eer-induction", [
                f"model.overrides.num_loops={settings.loops}", *overrides, f"training.seed={seed}",
                f"training.steps={settings.steps}", f"training.eval_every={settings.steps}",
                f"training.save_every={settings.steps}", f"output_dir={output_dir / f'{arm}-s{seed}'}"])
            result = run_training(recipe, overwrite=True, progress=False,
                                  evaluation_hook=length_evaluator(list(LENGTHS), settings.eval_sequences))
            rows.append({"arm": arm, "seed": seed,
                         **{f"L{length}": result.final_metrics[f"L{length}_accuracy"] for length in LENGTHS}})

    def accuracies(arm: str) -> list[float]:
        return [row["L64"] for row in rows if row["arm"] == arm]

    verdicts = [judged(block_claim(arm, settings.loops, settings.eval_sequences), accuracies(arm), accuracies(DEFAULT))
                for arm in settings.arms if arm != DEFAULT]
    return {"settings": asdict(settings), "rows": rows, "verdicts": verdicts,
            "seconds": time.perf_counter() - started}


def replayed_part(report: dict) -> list[dict]:
    """The replayed part (`Experiment.replay`: seed 0, every arm) of ``report``."""
    return [row for row in report["rows"] if row["seed"] == 0]


def format_markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [f"EER block choices at T = {settings['loops']} ({report['seconds']:.0f} s), {settings['steps']} steps "
             f"of the `eer-induction` recipe per arm and seed {settings['seeds']}; accuracy (%) over all positions, "
             f"{settings['eval_sequences']} held-out sequences per length, mean +- std over seeds.", "",
             "| arm | changes | " + " | ".join(f"L = {length}" for length in LENGTHS) + " |", "|---|---|---|---|"]
    for arm in settings["arms"]:
        cells = []
        for length in LENGTHS:
            mean, std = mean_std([row[f"L{length}"] for row in report["rows"] if row["arm"] == arm])
            cells.append(f"{100 * mean:.1f} +- {100 * std:.1f}")
        lines.append(f"| {arm} | {', '.join(ARMS[arm]) or '(EERConfig defaults)'} | " + " | ".join(cells) + " |")
    lines += ledger_lines(report["verdicts"], "Verdicts (`energyzoo.reproduce.verdict`, L = 64, seeds paired):")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Accuracy at L = 64 and 1000 per arm, one point per seed."""
    from matplotlib.figure import Figure

    arms = report["settings"]["arms"]
    figure = Figure(figsize=(9, 3.6))
    axes = figure.subplots(1, len(LENGTHS))
    for axis, length in zip(axes, LENGTHS):
        for index, arm in enumerate(arms):
            values = [100 * row[f"L{length}"] for row in report["rows"] if row["arm"] == arm]
            axis.plot([index] * len(values), values, "o", alpha=0.7)
        axis.set_xticks(range(len(arms)), arms, rotation=30, ha="right", fontsize=7)
        axis.set_title(f"accuracy at L = {length} (%)")
    figure.suptitle("EER: the unstated block choices (T = 4)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
