"""`energyzoo reproduce hyperset`: hyperset.txt's claims at CPU scale, on data that is always there.

1. Sudoku and test-time scaling (§5.1, Fig. 3b): the `hyperset-sudoku-4x4` recipe (generated unique-solution 4x4
   puzzles), then board and cell accuracy on held-out puzzles at R, 1.5R and 2R iterations with the same weights.
2. Image classification against a standard transformer (§5.2, Table 1): the `hyperset-digits` recipe and a vanilla
   ViT of matched parameter count (`vit-digits-matched`) trained by the same recipe on the embedded 8x8 digits.
3. Energy over iterations (Fig. 5): E_ATTN and E_FF of the trained Sudoku model on held-out puzzles, per
   iteration up to 2R (the trace of `output_energies=True`), as a PNG.
4. MaskGIT (§5.3, Table 3): the `hyperset-maskgit-digits` recipe on k-means patch codes of the digits; held-out
   digits with 40% of their codes masked (Bernoulli, D.4) are completed by iterative decoding and scored by PSNR
   and SSIM against the original images, beside the tokenizer's own reconstruction (the ceiling) and a fill with
   the most frequent code (a floor).

Differences from the paper, by necessity of a CPU run: 4x4 instead of 9x9 Sudoku, 8x8 digits instead of
CIFAR/ImageNet, tiny models and minutes of training; the numbers test the direction of the claims, not their size.
"""

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForImageClassification,
    AutoModelForMaskedImageModeling,
    AutoModelForTokenClassification,
)

from ..training.data import shuffled_digit_images
from ..training.image_tokenizer import DIGIT_PATCH_CODES, digit_patch_tokenizer, reconstruction_metrics
from ..training.recipe import load_recipe
from ..training.run import run_training
from ..training.sudoku import sudoku_examples
from ..training.tasks import training_task

SCALES = (1.0, 1.5, 2.0)


@dataclass
class HypersetSettings:
    sudoku_steps: int = 2000
    classification_steps: int = 2000
    maskgit_steps: int = 1500
    decoding_steps: int = 4
    masked_fraction: float = 0.4
    evaluation_puzzles: int = 500
    seed: int = 42


def _train(recipe: str, output_dir: Path, steps: int, *overrides: str):
    """The shipped recipe run for ``steps`` steps (warm-up capped at a tenth of them), evaluated at the end."""
    warmup = min(load_recipe(recipe).training.warmup_steps, steps // 10)
    recipe = load_recipe(recipe, [f"training.steps={steps}", f"training.eval_every={steps}",
                                  f"training.save_every={steps}", f"training.warmup_steps={warmup}",
                                  f"output_dir={output_dir}", *overrides])
    return run_training(recipe, overwrite=True, progress=False)


def sudoku_scaling(model, settings: HypersetSettings) -> tuple[list[dict], object]:
    """Board and cell accuracy at each multiple of R on held-out puzzles (a seed no training run uses), and the
    energy trace at 2R."""
    inputs, labels = sudoku_examples(settings.evaluation_puzzles, (4, 8), box=2, seed=settings.seed + 1)
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


def maskgit_reconstruction(model, recipe, settings: HypersetSettings) -> list[dict]:
    """PSNR / SSIM of held-out digits whose masked codes were decoded (module docstring, item 4)."""
    data = recipe.data
    tokenizer = digit_patch_tokenizer(data.validation_fraction, recipe.training.seed)
    images = shuffled_digit_images(recipe.training.seed)
    held_out = images[int(len(images) * (1 - data.validation_fraction)):].numpy()
    codes = tokenizer.encode(held_out)
    generator = torch.Generator().manual_seed(settings.seed)
    masked = torch.rand(codes.shape, generator=generator) < settings.masked_fraction
    decoded = model.generate_codes(codes.masked_fill(masked, DIGIT_PATCH_CODES), steps=settings.decoding_steps,
                                   generator=generator)
    floor = codes.masked_fill(masked, int(codes.mode().values.mode().values))
    rows = []
    for name, filled in (("tokenizer reconstruction (ceiling)", codes), ("Hyper-SET MaskGIT", decoded),
                         ("most frequent code (floor)", floor)):
        rows.append({"method": name, **reconstruction_metrics(held_out, tokenizer.decode(filled, (8, 8)))})
    return rows


def run_hyperset(settings: HypersetSettings, output_dir: str | Path, progress=print) -> dict:
    started = time.perf_counter()
    output_dir = Path(output_dir)
    progress("training Hyper-SET on 4x4 Sudoku")
    sudoku = _train("hyperset-sudoku-4x4", output_dir / "sudoku", settings.sudoku_steps)
    model = AutoModelForTokenClassification.from_pretrained(sudoku.model_dir).eval()
    scaling, trace = sudoku_scaling(model, settings)
    classification = []
    for name, overrides in (("hyperset-digits-tiny", ()), ("vit-digits-matched", ("model.preset=vit-digits-matched",))):
        progress(f"training {name} on the digits")
        result = _train("hyperset-digits", output_dir / name, settings.classification_steps, *overrides)
        trained = AutoModelForImageClassification.from_pretrained(result.model_dir)
        parameters = sum(p.numel() for p in trained.parameters())
        classification.append({"model": name, "parameters": parameters,
                               "accuracy": result.final_metrics["validation_accuracy"]})
    progress("training Hyper-SET MaskGIT on digit patch codes")
    maskgit = _train("hyperset-maskgit-digits", output_dir / "maskgit", settings.maskgit_steps)
    mim = AutoModelForMaskedImageModeling.from_pretrained(maskgit.model_dir).eval()
    reconstruction = maskgit_reconstruction(mim, load_recipe(maskgit.model_dir / "recipe.yaml"), settings)
    energies = {name: trace.stack(name).mean(-1)[0].tolist() for name in ("attention_energy", "feedforward_energy")}
    return {"settings": asdict(settings), "sudoku": scaling, "trained_iterations": model.config.num_iterations,
            "classification": classification, "maskgit": reconstruction, "energies": energies, "trace": trace,
            "seconds": time.perf_counter() - started}


def format_markdown(report: dict) -> str:
    lines = [f"Hyper-SET at CPU scale ({report['seconds']:.0f} s).", "",
             f"Sudoku 4x4 (trained at R = {report['trained_iterations']}), held-out unique-solution puzzles:", "",
             "| iterations | x R | board accuracy | cell accuracy |", "|---|---|---|---|"]
    lines += [f"| {row['iterations']} | {row['scale']:.1f} | {row['board_accuracy']:.4f} | {row['cell_accuracy']:.4f} |"
              for row in report["sudoku"]]
    lines += ["", "Digits classification, same recipe:", "", "| model | parameters | accuracy |", "|---|---|---|"]
    lines += [f"| {row['model']} | {row['parameters']:,} | {row['accuracy']:.4f} |" for row in report["classification"]]
    settings = report["settings"]
    lines += ["", f"MaskGIT on held-out digits, {settings['masked_fraction']:.0%} of the 4x4 patch codes masked, "
              f"{settings['decoding_steps']} decoding steps:", "", "| method | PSNR | SSIM |", "|---|---|---|"]
    lines += [f"| {row['method']} | {row['psnr']:.2f} | {row['ssim']:.4f} |" for row in report["maskgit"]]
    energy = report["energies"]
    lines += ["", "Sudoku energies, mean over puzzles, first -> last iteration (up to 2R):",
              f"E_ATTN {energy['attention_energy'][0]:.2f} -> {energy['attention_energy'][-1]:.2f}, "
              f"E_FF {energy['feedforward_energy'][0]:.2f} -> {energy['feedforward_energy'][-1]:.2f}"]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """The Sudoku model's energies and residual over its iterations."""
    report["trace"].plot(path, names=("attention_energy", "feedforward_energy", "residual"))
