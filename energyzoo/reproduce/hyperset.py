"""`energyzoo reproduce hyperset`: hyperset.txt's claims at CPU scale, against the paper's own Transformer baseline
(§5: one pre-norm RMSNorm layer without biases, MLP ratio 4, iterated as many times; `layer_type="transformer"`,
at Hyper-SET's parameter count), over seeds, on data that is always there.

1. Sudoku and test-time scaling (§5.1, Fig. 3b): `hyperset-sudoku-4x4` (generated unique-solution 4x4 puzzles) for
   Hyper-SET, its Transformer baseline, and Hyper-SET at a tenth of the learning rate (does the slower run's
   dynamics settle?); each evaluated from its best-validation checkpoint (board accuracy), as the public code
   does, at R, 1.5R and 2R iterations with the same weights, with the update size per iteration (and Hyper-SET's
   E_ATTN, E_FF) up to 2R.
2. Image classification (§5.2, Table 1; the primary claim): `hyperset-digits` for Hyper-SET and its Transformer
   baseline on the embedded 8x8 digits, best-validation checkpoint. Each arm gets its own learning rate, as fem-lm's
   do: every point of ``classification_learning_rates`` is trained with the first ``grid_seeds`` seeds, and the one
   with the highest mean best-validation accuracy is the arm's (the paper tunes neither arm on our data); the other
   seeds run at it. Each seed draws its own test fifth of the digits (`energyzoo.data.digits.digits_test_set`), so the
   spread over seeds the interval reads carries the test set's sampling noise as well as training's.
3. MaskGIT (§5.3, Table 3): the `hyperset-maskgit-digits` recipe on k-means patch codes of the digits; held-out
   digits with 40% of their codes masked (Bernoulli, D.4) are completed by iterative decoding and scored by PSNR
   and SSIM against the original images, beside the tokenizer's own reconstruction (the ceiling) and a fill with
   the most frequent code (a floor). One seed: the paper compares MaskGIT with no baseline of ours here.

Verdicts (seeds paired): Hyper-SET beats the Transformer in distribution on Sudoku by half §5.1's gap (54.70 % vs
49.30 %; the Transformer must sit within 20 points of 49.3 %: a task as hard as the paper's); its gain from R to 2R
beats the Transformer's by a point (Fig. 3b; the levels at R must leave a point of room above 0 and below 1); it is
within one point of the Transformer on the digits ("competitive": `CLASSIFICATION` gives the margin's rationale).
The Sudoku regime is 4-5 givens per 4x4 board; test puzzles come from held-out solution grids
(`energyzoo.data.sudoku`), and each model is the best-validation checkpoint of ``sudoku_steps`` (Hyper-SET starts as
the identity and needs about 2,000 steps to leave it).

Parameter counts include Hyper-SET's step-size network, whose t-path is zero at initialisation and receives no
gradient under the default `step_zero_init="all"` (it stays exactly zero: `HyperSETConfig`'s docstring), as the
paper's counts include it. Differences from the paper, by necessity of a CPU run: 4x4 instead of 9x9 Sudoku, 8x8
digits instead of CIFAR/ImageNet, tiny models and minutes of training; ``--paper-scale`` trains 9x9 Sudoku with
hyperset.txt's 17-34 givens (asked of the generator, which stops where uniqueness allows, about 22 on 9x9: the
report prints the givens reached; the paper's Palm et al. set loads through `data.source=hf-sudoku`). Selection and
scoring are apart: Sudoku's validation puzzles come from solution grids of their own (`energyzoo.data.sudoku`), and
the digits verdict is scored on the seed's held-out test digits, not on the validation accuracy that picked the
checkpoint and the learning rate. The runs are spread over ``workers`` processes, and each finished run is kept in
``output_dir/parts`` (`Parts`): a run stopped at a session's end resumes where it stopped.
"""

import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
from transformers import (
    AutoModelForImageClassification,
    AutoModelForMaskedImageModeling,
    AutoModelForTokenClassification,
)

from ..data.digits import digits_test_set, shuffled_digit_images
from ..data.image_tokenizer import DIGIT_PATCH_CODES, digit_patch_tokenizer, reconstruction_metrics
from ..data.sudoku import sudoku_examples
from ..modeling.errors import UserError
from ..training.recipe import load_recipe
from ..training.run import run_training
from ..training.tasks import training_task
from .parts import Parts
from .processes import runs_mapped
from .verdict import MAX_SEEDS, Claim, judged, ledger_lines, mean_std

SCALES = (1.0, 1.5, 2.0)
# arm: (recipe overrides, whether it is Hyper-SET); the low-lr arm's rate is `Settings.low_learning_rate`
SUDOKU_ARMS = {"hyperset": ("model.preset=hyperset-sudoku-4x4-tiny",),
               "transformer": ("model.preset=hyperset-sudoku-4x4-transformer",),
               "hyperset_low_lr": ("model.preset=hyperset-sudoku-4x4-tiny",)}
# 9x9 (the paper's board, `--paper-scale`): Table 8's Hyper-SET, and the Transformer at its parameter count (d 648:
# 5.11M against 5.20M)
SUDOKU_ARMS_9X9 = {"hyperset": ("model.preset=hyperset-sudoku",),
                   "transformer": ("model.preset=hyperset-sudoku", "model.overrides.layer_type=transformer",
                                   "model.overrides.step_size_mode=fixed", "model.overrides.hidden_size=648",
                                   "model.overrides.intermediate_size=2592"),
                   "hyperset_low_lr": ("model.preset=hyperset-sudoku",)}
BOARDS = {4: ("hyperset-sudoku-4x4", 2, SUDOKU_ARMS), 9: ("hyperset-sudoku-9x9", 3, SUDOKU_ARMS_9X9)}  # side: recipe,
# box, arms
DIGITS_ARMS = {"hyperset": "hyperset-digits-tiny", "transformer": "hyperset-digits-transformer"}
IN_DISTRIBUTION = Claim("It also outperforms Transformer for in-distribution evaluation (54.70% vs. 49.30%)",
                        "hyperset.txt §5.1", "hyperset", "transformer", "Sudoku board accuracy at R", effect=0.027,
                        effect_source="half §5.1's 5.4-point gap", paper_effect=0.054, paper_baseline=0.493,
                        paper_band=0.2, regime_source="§5.1's Transformer at 49.30 %; the 20-point band is our "
                                                      "choice: a 4x4 board is not the paper's 9x9 hard set")
EXTRAPOLATION = Claim("our model scales more effectively than Transformer, with larger accuracy gains (R to 2R)",
                      "hyperset.txt §5.1, Fig. 3b", "hyperset", "transformer",
                      "Sudoku board accuracy gain from R to 2R", effect=0.01,
                      effect_source="Fig. 3b prints no numbers: one point, our choice", chance=0.0, ceiling=1.0,
                      regime_source="each level at R above 0 by the larger gain, below 1 by the effect")
CLASSIFICATION = Claim("competitive with the Transformer of the same parameter count (90.11 vs 89.90 on CIFAR-10)",
                       "hyperset.txt Table 1", "hyperset", "transformer", "digits test accuracy", kind="not_worse",
                       effect=0.01, effect_source="the abstract calls its image classification 'competitive or "
                                                  "superior'; §5.2 says it 'performs comparably' where Table 2 has it "
                                                  "1.19-2.21 points behind at d 512 (CIFAR-10*, CIFAR-100*, IN-1K), "
                                                  "and 'lags behind' at Table 1's 4.18 (IN-1K): a 1-point deficit, "
                                                  "under the least it calls comparable, is our margin",
                       paper_effect=0.0021, chance=0.1, ceiling=1.0, primary=True,
                       regime_source="chance 0.1 (ten digits); both arms within the margin of 1 say nothing")


@dataclass
class Settings:
    seeds: list[int] = field(default_factory=lambda: list(range(8)))  # Sudoku's
    sudoku_arms: list[str] = field(default_factory=lambda: ["hyperset", "transformer"])
    sudoku_steps: int = 2000  # Hyper-SET's recipe needs about 2,000 to leave the identity
    sudoku_givens: list[int] = field(default_factory=lambda: [4, 5])  # clues per 4x4 board: the fewest that stay unique
    sudoku_side: int = 4  # 4 (CPU) or 9 (the paper's board)
    low_learning_rate: float = 3e-4  # a tenth of hyperset-sudoku-4x4's
    # the primary's power plan: the 8-seed run of 43a7256 (one fixed test set) spread its paired differences so that
    # 17 seeds give power 0.8 at the paper's +0.0021; a test set drawn per seed adds its sampling noise, so 20, what
    # the budget holds (about 80 minutes in two processes); the row reports the power reached and the seeds the plan
    # asks at this run's spread
    classification_seeds: list[int] = field(default_factory=lambda: list(range(20)))
    classification_learning_rates: list[float] = field(default_factory=lambda: [1e-3, 3e-3, 1e-2])  # each arm's grid
    grid_seeds: int = 2  # the first classification seeds, which train every point of the grid
    classification_steps: int = 2000
    maskgit_steps: int = 1500
    decoding_steps: int = 4
    masked_fraction: float = 0.4
    evaluation_puzzles: int = 500
    evaluation_seed: int = 42
    workers: int = 2  # processes the runs are spread over

    def __post_init__(self):
        if self.sudoku_side not in BOARDS:
            raise UserError(f"hyperset sudoku_side must be one of {list(BOARDS)}, got {self.sudoku_side}")
        unknown = [arm for arm in self.sudoku_arms if arm not in SUDOKU_ARMS]
        if unknown or not {"hyperset", "transformer"} <= set(self.sudoku_arms):
            raise UserError(f"hyperset sudoku_arms must include hyperset and transformer and be among "
                             f"{list(SUDOKU_ARMS)}, got {self.sudoku_arms}")
        if not 1 <= self.grid_seeds <= len(self.classification_seeds) or not self.classification_learning_rates:
            raise UserError(f"hyperset grid_seeds must be between 1 and the number of classification_seeds "
                             f"({len(self.classification_seeds)}) and classification_learning_rates non-empty, got "
                             f"{self.grid_seeds} and {self.classification_learning_rates}")
        if self.workers < 1:
            raise UserError(f"hyperset workers must be >= 1, got {self.workers}")


def _train(recipe: str, output_dir: Path, steps: int, *overrides: str, keep_best: str | None = None):
    """The shipped recipe run for ``steps`` steps (warm-up capped at a tenth of them); with ``keep_best``, evaluated
    10 times and the best-validation model kept (`training.keep_best`)."""
    warmup = min(load_recipe(recipe).training.warmup_steps, steps // 10)
    evaluations = [f"training.eval_every={max(1, steps // 10)}", f"training.keep_best={keep_best}"] if keep_best \
        else [f"training.eval_every={steps}"]
    recipe = load_recipe(recipe, [f"training.steps={steps}", *evaluations, f"training.save_every={steps}",
                                  f"training.warmup_steps={warmup}", f"output_dir={output_dir}", *overrides])
    return run_training(recipe, overwrite=True, progress=False)


def sudoku_test_set(settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out test puzzles (grids of the test part, a seed no training run uses)."""
    return sudoku_examples(settings.evaluation_puzzles, tuple(settings.sudoku_givens),
                           box=BOARDS[settings.sudoku_side][1], seed=settings.evaluation_seed + 1, part="test")


def givens_reached(inputs: torch.Tensor, requested: list[int]) -> dict:
    """The givens the generator reached per test puzzle (it stops above a target where no cell can go without a
    second solution: on 9x9 boards, targets under about 22)."""
    counts = sorted((inputs != 0).sum(dim=1).tolist())
    return {"requested": list(requested), "min": counts[0], "median": counts[len(counts) // 2], "max": counts[-1]}


def sudoku_scaling(model, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[list[dict], object]:
    """Board and cell accuracy at each multiple of R on the test puzzles, and the trace at 2R."""
    metrics = training_task("token-classification").metrics
    trained = model.config.num_iterations
    rows = []
    with torch.no_grad():
        for scale in SCALES:
            iterations = round(scale * trained)
            outputs = model(input_ids=inputs, refinement_steps=iterations)
            scored = {name: float(hit) / float(count) for name, (hit, count) in metrics(outputs, labels).items()}
            rows.append({"iterations": iterations, "scale": scale, **scored})
        trace = model(input_ids=inputs, refinement_steps=round(SCALES[-1] * trained), output_energies=True).energies
    return rows, trace


def maskgit_reconstruction(model, recipe, settings: Settings) -> list[dict]:
    """PSNR / SSIM of held-out digits whose masked codes were decoded (module docstring, item 3)."""
    data = recipe.data
    tokenizer = digit_patch_tokenizer(data.validation_fraction, recipe.training.seed)
    images = shuffled_digit_images(recipe.training.seed)
    held_out = images[int(len(images) * (1 - data.validation_fraction)):].numpy()
    codes = tokenizer.encode(held_out)
    generator = torch.Generator().manual_seed(settings.evaluation_seed)
    masked = torch.rand(codes.shape, generator=generator) < settings.masked_fraction
    decoded = model.generate_codes(codes.masked_fill(masked, DIGIT_PATCH_CODES), steps=settings.decoding_steps,
                                   generator=generator)
    floor = codes.masked_fill(masked, int(codes.mode().values.mode().values))
    rows = []
    for name, filled in (("tokenizer reconstruction (ceiling)", codes), ("Hyper-SET MaskGIT", decoded),
                         ("most frequent code (floor)", floor)):
        rows.append({"method": name, **reconstruction_metrics(held_out, tokenizer.decode(filled, (8, 8)))})
    return rows


def test_accuracy(model, seed: int) -> float:
    """The accuracy on seed ``seed``'s held-out test digits (`digits_test_set`: no training or validation run of that
    seed sees them), the best-validation checkpoint's score: the selection metric would flatter it."""
    images, labels = digits_test_set(seed)
    with torch.no_grad():
        predicted = model(pixel_values=images).logits.argmax(-1)
    return (predicted == labels).sum().item() / len(labels)


@dataclass(frozen=True)
class Job:
    """One training run of the experiment: a Sudoku arm, a digits arm at a learning rate, or the MaskGIT model."""

    task: str  # "sudoku" | "digits" | "maskgit"
    arm: str = "hyperset"
    seed: int = 0
    learning_rate: float | None = None

    @property
    def name(self) -> str:
        rate = "" if self.learning_rate is None else f"-lr{self.learning_rate:g}"
        return f"{self.task}-{self.arm}-s{self.seed}{rate}"


def _sudoku_run(settings: Settings, output_dir: Path, job: Job) -> dict:
    """The best checkpoint's accuracies at R, 1.5R, 2R on the test puzzles, its parameter count, and for the first
    seed its traces' mean curves up to 2R."""
    recipe, _, arms = BOARDS[settings.sudoku_side]
    rate = (f"training.learning_rate={settings.low_learning_rate}",) if job.arm == "hyperset_low_lr" else ()
    result = _train(recipe, output_dir / f"sudoku-{job.arm}-s{job.seed}", settings.sudoku_steps, *arms[job.arm],
                    *rate, f"data.givens=[{','.join(map(str, settings.sudoku_givens))}]", f"training.seed={job.seed}",
                    keep_best="validation_board_accuracy")
    model = AutoModelForTokenClassification.from_pretrained(result.best_model_dir).eval()
    scaling, trace = sudoku_scaling(model, *sudoku_test_set(settings))
    curves = {name: trace.stack(name).mean(-1)[0].tolist() for name in
              ("residual", "attention_energy", "feedforward_energy") if name in trace.names()}
    return {"arm": job.arm, "seed": job.seed, "parameters": sum(p.numel() for p in model.parameters()),
            "scaling": scaling, **({"curves": curves} if job.seed == settings.seeds[0] else {})}


def _digits_run(settings: Settings, output_dir: Path, job: Job) -> dict:
    """The best-validation checkpoint of one arm at one learning rate: its test and validation accuracy."""
    result = _train("hyperset-digits", output_dir / f"digits-{job.arm}-lr{job.learning_rate:g}-s{job.seed}",
                    settings.classification_steps, f"model.preset={DIGITS_ARMS[job.arm]}",
                    f"training.learning_rate={job.learning_rate}", f"training.seed={job.seed}",
                    keep_best="validation_accuracy")
    trained = AutoModelForImageClassification.from_pretrained(result.best_model_dir).eval()
    best = json.loads((result.best_model_dir / "training_metrics.json").read_text())
    return {"arm": job.arm, "seed": job.seed, "learning_rate": job.learning_rate,
            "parameters": sum(p.numel() for p in trained.parameters()), "accuracy": test_accuracy(trained, job.seed),
            "validation_accuracy": best["validation_accuracy"], "best_step": best["steps"]}


def _maskgit_run(settings: Settings, output_dir: Path, job: Job) -> list[dict]:
    maskgit = _train("hyperset-maskgit-digits", output_dir / "maskgit", settings.maskgit_steps)
    mim = AutoModelForMaskedImageModeling.from_pretrained(maskgit.model_dir).eval()
    return maskgit_reconstruction(mim, load_recipe(maskgit.model_dir / "recipe.yaml"), settings)


def _run_job(settings: Settings, output_dir: Path, job: Job):
    return {"sudoku": _sudoku_run, "digits": _digits_run, "maskgit": _maskgit_run}[job.task](settings, output_dir, job)


def _finished(jobs: list[Job], settings: Settings, output_dir: Path, parts: Parts, progress) -> dict[Job, object]:
    """Each run's result: read back from ``parts`` where a run of these settings on this code finished it, else
    trained in ``settings.workers`` processes (`runs_mapped`) and kept there as it finishes."""
    results = {job: parts.read(job.name) for job in jobs}
    todo = [job for job in jobs if results[job] is None]
    if len(todo) < len(jobs):
        progress(f"hyperset: {len(jobs) - len(todo)} of {len(jobs)} runs read back from {parts.folder}")
    with runs_mapped(settings.workers) as mapped:
        for job, result in zip(todo, mapped(partial(_run_job, settings, output_dir), todo)):
            progress(f"hyperset: {job.name} trained")
            parts.write(job.name, result)
            results[job] = result
    return results


def _chosen_rates(grid: list[dict]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per arm, the mean best-validation accuracy at each learning rate of the grid, and the rate with the highest."""
    means = {arm: {rate: statistics.fmean(row["validation_accuracy"] for row in grid
                                          if row["arm"] == arm and row["learning_rate"] == rate)
                   for rate in dict.fromkeys(row["learning_rate"] for row in grid)} for arm in DIGITS_ARMS}
    return means, {arm: max(rates, key=rates.get) for arm, rates in means.items()}


def _sudoku_verdicts(rows: list[dict]) -> list[dict]:
    def board(arm: str, scale_index: int) -> list[float]:
        return [row["scaling"][scale_index]["board_accuracy"] for row in rows if row["arm"] == arm]

    def gain(arm: str) -> list[float]:
        return [late - early for early, late in zip(board(arm, 0), board(arm, -1))]

    return [judged(IN_DISTRIBUTION, board("hyperset", 0), board("transformer", 0), task="sudoku"),
            judged(EXTRAPOLATION, gain("hyperset"), gain("transformer"), task="sudoku",
                   levels={"hyperset at R": board("hyperset", 0), "transformer at R": board("transformer", 0)})]


def run(settings: Settings, output_dir: str | Path, progress=print) -> dict:
    """Every run of the experiment in ``settings.workers`` processes, each kept in ``output_dir/parts`` as it
    finishes; the digits grid first (with the Sudoku and MaskGIT runs), then the other classification seeds at each
    arm's chosen learning rate."""
    output_dir = Path(output_dir)
    parts = Parts("hyperset", asdict(replace(settings, workers=1)), output_dir)  # workers change no number
    sudoku_runs = [Job("sudoku", arm, seed) for arm in settings.sudoku_arms for seed in settings.seeds]
    grid_runs = [Job("digits", arm, seed, rate) for arm in DIGITS_ARMS
                 for rate in settings.classification_learning_rates
                 for seed in settings.classification_seeds[:settings.grid_seeds]]
    first = _finished([*grid_runs, *sudoku_runs, Job("maskgit")], settings, output_dir, parts, progress)
    grid = [first[job] for job in grid_runs]
    grid_means, chosen = _chosen_rates(grid)
    rest = [Job("digits", arm, seed, chosen[arm]) for arm in DIGITS_ARMS
            for seed in settings.classification_seeds[settings.grid_seeds:]]
    classification = [row for row in grid if row["learning_rate"] == chosen[row["arm"]]]
    classification += _finished(rest, settings, output_dir, parts, progress).values()
    sudoku = [first[job] for job in sudoku_runs]
    accuracy = {arm: [row["accuracy"] for row in sorted(classification, key=lambda row: row["seed"])
                      if row["arm"] == arm] for arm in DIGITS_ARMS}
    verdicts = [*_sudoku_verdicts(sudoku), judged(CLASSIFICATION, accuracy["hyperset"], accuracy["transformer"],
                                                  task="digits")]
    inputs, _ = sudoku_test_set(settings)
    return {"settings": asdict(settings),
            "sudoku": [{key: row[key] for key in ("arm", "seed", "scaling")} for row in sudoku],
            "sudoku_parameters": {row["arm"]: row["parameters"] for row in sudoku},
            "test_givens": givens_reached(inputs, settings.sudoku_givens),
            "trained_iterations": sudoku[0]["scaling"][0]["iterations"],
            "learning_rate_grid": {arm: {f"{rate:g}": value for rate, value in means.items()}
                                   for arm, means in grid_means.items()},
            "learning_rates": chosen, "classification_grid": grid, "classification": classification,
            "maskgit": first[Job("maskgit")],
            "curves": {row["arm"]: row["curves"] for row in sudoku if "curves" in row},
            "verdicts": verdicts, "seconds": parts.seconds()}


def replayed_part(report: dict) -> dict:
    """The replayed part (`Experiment.replay`: seed 0 of every Sudoku arm, every grid point of classification seed 0,
    and MaskGIT) of ``report``."""
    return {"sudoku": [row for row in report["sudoku"] if row["seed"] == 0],
            "classification_grid": [row for row in report["classification_grid"] if row["seed"] == 0],
            "maskgit": report["maskgit"]}


def _mean_std_cell(values: list[float]) -> str:
    mean, std = mean_std(values)
    return f"{mean:.4f} +- {std:.4f}"


def format_markdown(report: dict) -> str:
    settings = report["settings"]
    scales = [f"{scale:g}R" for scale in SCALES]
    lines = [f"Hyper-SET at CPU scale ({report['seconds']:.0f} s), seeds {settings['seeds']}, best-validation "
             f"checkpoints.", "",
             f"Sudoku {settings['sudoku_side']}x{settings['sudoku_side']} (trained at R = "
             f"{report['trained_iterations']}, {settings['sudoku_steps']} steps, {settings['sudoku_givens']} givens "
             f"asked, {report['test_givens']['min']}-{report['test_givens']['max']} reached (median "
             f"{report['test_givens']['median']})), board accuracy on puzzles of held-out solution grids, mean +- std "
             "over seeds:", "",
             "| arm | parameters | " + " | ".join(scales) + " | cell accuracy at R |", "|---|---|" + "---|" * 4]
    for arm, count in report["sudoku_parameters"].items():
        runs = [row["scaling"] for row in report["sudoku"] if row["arm"] == arm]
        cells = [_mean_std_cell([run[index]["board_accuracy"] for run in runs]) for index in range(len(SCALES))]
        lines.append(f"| {arm} | {count:,} | " + " | ".join(cells) + " | "
                     + _mean_std_cell([run[0]["cell_accuracy"] for run in runs]) + " |")
    lines += ["", f"Update size ||x_(t+1) - x_t|| per iteration up to 2R, seed {settings['seeds'][0]} (does it "
              f"settle?):", ""]
    for arm, curves in report["curves"].items():
        residual = curves["residual"]
        energies = "" if "attention_energy" not in curves else (
            f"; E_ATTN {curves['attention_energy'][0]:.2f} -> {curves['attention_energy'][-1]:.2f}, E_FF "
            f"{curves['feedforward_energy'][0]:.2f} -> {curves['feedforward_energy'][-1]:.2f}")
        lines.append(f"- {arm}: " + ", ".join(f"{value:.2f}" for value in residual) + energies)
    lines += ["", f"Digits classification ({settings['classification_steps']} steps), the primary: each arm at its "
              f"learning rate of {settings['classification_learning_rates']} (highest mean best-validation accuracy "
              f"over classification seeds {settings['classification_seeds'][:settings['grid_seeds']]}); the "
              f"best-validation checkpoint on the seed's own held-out test fifth, mean +- std over seeds "
              f"{settings['classification_seeds']}:", "",
              "| arm | parameters | learning rate | validation accuracy per rate of the grid | test accuracy | "
              "validation accuracy (selection) | best step |", "|---|---|---|---|---|---|---|"]
    for arm in DIGITS_ARMS:
        runs = [row for row in report["classification"] if row["arm"] == arm]
        grid = ", ".join(f"{rate}: {value:.4f}" for rate, value in report["learning_rate_grid"][arm].items())
        lines.append(f"| {arm} | {runs[0]['parameters']:,} | {report['learning_rates'][arm]:g} | {grid} | "
                     f"{_mean_std_cell([row['accuracy'] for row in runs])} | "
                     f"{_mean_std_cell([row['validation_accuracy'] for row in runs])} | "
                     + ", ".join(str(row["best_step"]) for row in runs) + " |")
    primary = report["verdicts"][-1]
    if primary["seeds_for_power"] is not None:
        planned = primary["seeds_for_power"]
        planned = f"more than {MAX_SEEDS}" if planned > MAX_SEEDS else str(planned)
        lines += ["", f"Power plan (`Settings.classification_seeds`): {primary['seeds']} seeds; at this run's spread "
                      f"the power at the paper's {primary['claim']['paper_effect']:+g} is {primary['power']:.2f}, and "
                      f"{planned} seeds would give 0.8."]
    lines += ["", f"MaskGIT on held-out digits, {settings['masked_fraction']:.0%} of the 4x4 patch codes masked, "
              f"{settings['decoding_steps']} decoding steps:", "", "| method | PSNR | SSIM |", "|---|---|---|"]
    lines += [f"| {row['method']} | {row['psnr']:.2f} | {row['ssim']:.4f} |" for row in report["maskgit"]]
    lines += ledger_lines(report["verdicts"], "Verdicts (`energyzoo.reproduce.verdict`, seeds paired):")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """The update size per iteration of each Sudoku arm (seed 0), and Hyper-SET's energies, up to 2R."""
    from matplotlib.figure import Figure

    names = ("residual", "attention_energy", "feedforward_energy")
    figure = Figure(figsize=(12, 3.4))
    axes = figure.subplots(1, len(names))
    for axis, name in zip(axes, names):
        for arm, curves in report["curves"].items():
            if name in curves:
                axis.plot(range(1, len(curves[name]) + 1), curves[name], marker="o", markersize=3, label=arm)
        axis.axvline(report["trained_iterations"], color="grey", linestyle=":", linewidth=1)
        axis.set_xlabel("iteration")
        axis.set_title(name)
        axis.legend(fontsize=7)
    figure.suptitle("Hyper-SET Sudoku: iterations past R (dotted) at test time")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
