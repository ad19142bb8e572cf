"""`energyzoo reproduce eqt-parity`: eqt.txt's one experiment (§5, Table 2) at CPU scale.

Cumulative parity (eq. 44): per-token accuracy of a base Llama and an EqT-LLaMA of the same size (the ERM's reverse,
masked and confidence energies and the proximal term; no memory, §5.1.2), trained by the same recipe
(`eqt-parity-cpu`, K = 2 in training) on the same sequences, one model per length (per-length loss curves, Fig. 1c),
several seeds.
EqT is evaluated at K = 0 (its decoder alone), 8 and 32 with the same weights, on held-out sequences no run trained
on. Differences from the paper, by necessity of a CPU run: a 0.2M-parameter model instead of 6.3M, 600 steps of
batch 64 instead of 3,200 of 256, lengths up to 64.
"""

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ..training.data import cumulative_parity_split
from ..training.recipe import load_recipe
from ..training.run import run_training
from .verdict import Claim, judged, ledger_lines

RECIPE = "eqt-parity-cpu"
MODELS = {"llama": "llama-parity-small", "eqt": "eqt-parity-small"}
CLAIM = "EqT maintains higher accuracy than Standard in the challenging regime (+3.28% on average, +8.07% at L = 192)"


def parity_claim(length: int, refinement_steps: int) -> Claim:
    """eqt.txt Table 2 / Fig. 1a at one length: EqT at K refinement steps against the Llama of the same size. A
    Llama within 0.1 of chance (0.5) or of 1 leaves no room to separate them (the informative regime is 70-90 %)."""
    return Claim(f"{CLAIM}: L = {length}, K = {refinement_steps}", "eqt.txt Table 2, Fig. 1a", "eqt", "llama",
                 "per-token accuracy", chance=0.5, ceiling=1.0, band=0.1)


@dataclass
class ParitySettings:
    lengths: list[int] = field(default_factory=lambda: [16, 32, 64])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 600
    eqt_steps: list[int] = field(default_factory=lambda: [0, 8, 32])
    test_sequences: int = 2048


def per_token_accuracy(model, ids: torch.Tensor, labels: torch.Tensor, refinement_steps: int | None = None) -> float:
    """Table 2's metric: the fraction of positions whose parity the logits predict, over all positions."""
    options = {} if refinement_steps is None else {"refinement_steps": refinement_steps}
    hits = 0
    with torch.no_grad():
        for start in range(0, len(ids), 256):
            logits = model(input_ids=ids[start:start + 256], use_cache=False, **options).logits
            hits += (logits[:, :-1].argmax(-1) == labels[start:start + 256, 1:]).sum().item()
    return hits / labels[:, 1:].numel()


def _train(preset: str, length: int, seed: int, steps: int, output_dir: Path):
    warmup = min(load_recipe(RECIPE).training.warmup_steps, steps // 10)
    recipe = load_recipe(RECIPE, [f"model.preset={preset}", f"data.block_size={length}", f"training.seed={seed}",
                                  f"training.steps={steps}", f"training.warmup_steps={warmup}",
                                  f"training.eval_every={steps}",
                                  f"training.save_every={steps}", f"output_dir={output_dir}"])
    return AutoModelForCausalLM.from_pretrained(run_training(recipe, overwrite=True, progress=False).model_dir).eval()


def run_parity(settings: ParitySettings, output_dir: str | Path, progress=print) -> dict:
    started = time.perf_counter()
    output_dir = Path(output_dir)
    rows = []
    for length in settings.lengths:
        test_ids, test_labels, _, _ = cumulative_parity_split(settings.test_sequences + 1, length, 1 / 4096, seed=10**6)
        for seed in settings.seeds:
            progress(f"L = {length}, seed {seed}: training {MODELS['llama']} and {MODELS['eqt']}")
            row = {"length": length, "seed": seed}
            llama = _train(MODELS["llama"], length, seed, settings.steps, output_dir / f"llama-L{length}-s{seed}")
            row["llama"] = per_token_accuracy(llama, test_ids, test_labels)
            eqt = _train(MODELS["eqt"], length, seed, settings.steps, output_dir / f"eqt-L{length}-s{seed}")
            for steps in settings.eqt_steps:
                row[f"eqt_K{steps}"] = per_token_accuracy(eqt, test_ids, test_labels, refinement_steps=steps)
            rows.append(row)
    return {"settings": asdict(settings), "rows": rows, "summary": summarise(rows, settings),
            "verdicts": verdicts(rows, settings), "seconds": time.perf_counter() - started}


def verdicts(rows: list[dict], settings: ParitySettings) -> list[dict]:
    """Per length: EqT at the largest K against Llama, seeds paired."""
    steps = settings.eqt_steps[-1]
    records = []
    for length in settings.lengths:
        runs = [row for row in rows if row["length"] == length]
        records.append(judged(parity_claim(length, steps), [row[f"eqt_K{steps}"] for row in runs],
                              [row["llama"] for row in runs], length=length))
    return records


def summarise(rows: list[dict], settings: ParitySettings) -> list[dict]:
    """Mean and standard deviation over seeds per length and model, and EqT(K = max) - Llama."""
    columns = ["llama", *(f"eqt_K{steps}" for steps in settings.eqt_steps)]
    summary = []
    for length in settings.lengths:
        runs = [row for row in rows if row["length"] == length]
        entry = {"length": length}
        for column in columns:
            values = [row[column] for row in runs]
            entry[column] = {"mean": statistics.fmean(values),
                             "std": statistics.stdev(values) if len(values) > 1 else 0.0}
        entry["delta"] = entry[columns[-1]]["mean"] - entry["llama"]["mean"]
        summary.append(entry)
    return summary


def format_markdown(report: dict) -> str:
    settings = report["settings"]
    columns = ["llama", *(f"eqt_K{steps}" for steps in settings["eqt_steps"])]
    names = ["Llama", *(f"EqT K = {steps}" for steps in settings["eqt_steps"])]
    lines = [f"Cumulative parity at CPU scale ({report['seconds']:.0f} s): per-token accuracy (%) on "
             f"{settings['test_sequences']} held-out sequences, mean +- std over seeds {settings['seeds']}, "
             f"{settings['steps']} training steps per model (EqT trained at K = 2).", "",
             "| L | " + " | ".join(names) + " | delta (EqT K = max - Llama) |",
             "|---|" + "---|" * (len(names) + 1)]
    for entry in report["summary"]:
        cells = [f"{100 * entry[c]['mean']:.2f} +- {100 * entry[c]['std']:.2f}" for c in columns]
        lines.append(f"| {entry['length']} | " + " | ".join(cells) + f" | {100 * entry['delta']:+.2f} |")
    lines += ledger_lines(report["verdicts"], "Verdicts (`energyzoo.reproduce.verdict`, seeds paired):")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Per-token accuracy against L per model, mean and std over seeds."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5, 3.8))
    axis = figure.subplots()
    lengths = [entry["length"] for entry in report["summary"]]
    for column in report["summary"][0]:
        if column in ("length", "delta"):
            continue
        means = [100 * entry[column]["mean"] for entry in report["summary"]]
        errors = [100 * entry[column]["std"] for entry in report["summary"]]
        axis.errorbar(lengths, means, yerr=errors, marker="o", capsize=3, label=column.replace("_", " "))
    axis.set_xlabel("sequence length L")
    axis.set_ylabel("per-token accuracy (%)")
    axis.set_title("cumulative parity (eqt.txt Table 2, CPU scale)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
