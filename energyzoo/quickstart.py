"""`energyzoo quickstart`: the short path through `train`, `eval` and `export`.

Trains a tiny FEM-LM on the embedded Python documentation with the shipped `fem-lm-tiny` recipe, evaluates
it on the offline `local` lm-eval suite, exports a Hub-ready folder (card included), plots the exported model's
energy trace on the prompt (``energies.png``) and says how to push it. Offline throughout; a few minutes on
2 CPU cores. It orchestrates `training`, `eval` and `export`, so it lives above them.

A folder that holds an earlier quickstart is refused unless ``overwrite``; replacing one keeps the earlier run aside
until the new one has trained (`training.checkpoints.claim_output_dir`) and its export until the new export is whole.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .eval.harness import evaluate_folder, scores
from .export import export_folder
from .modeling.errors import UserError
from .training.recipe import load_recipe
from .training.run import run_training


@dataclass
class QuickstartReport:
    model_dir: Path  # the trained model in the run folder
    export_dir: Path
    train_loss: float  # mean of the last 20 steps
    validation_loss: float
    vocab_size: int
    local_results: dict  # {"energyzoo_pydoc_mc": {"acc": ...}, "energyzoo_pydoc_ppl": {...}}
    sample: str
    energy_plot: Path  # the exported model's EnergyTrace on the prompt, per layer
    seconds: float

    @property
    def validation_perplexity(self) -> float:
        return math.exp(self.validation_loss)

    @property
    def uniform_loss(self) -> float:
        """The loss of predicting every token with probability 1 / vocab (an untrained model's level)."""
        return math.log(self.vocab_size)


RUN, EXPORT, ENERGY_PLOT = "train", "export", "energies.png"  # what a quickstart folder holds


def check_quickstart_folder(output_dir: Path, overwrite: bool) -> None:
    """Refuse a folder that holds anything but an earlier quickstart, and an earlier quickstart without
    ``overwrite``."""
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"--output-dir {output_dir} is a file, not a folder")
    present = sorted(path.name for path in output_dir.iterdir() if not path.name.startswith(".")
                     ) if output_dir.is_dir() else []
    if not present:
        return
    if set(present) - {RUN, EXPORT, ENERGY_PLOT}:
        raise UserError(f"{output_dir} holds files that are not a quickstart's ({', '.join(present[:5])}): choose "
                        "another --output-dir")
    if not overwrite:
        raise UserError(f"{output_dir} holds an earlier quickstart (its model in {output_dir / EXPORT}): pass "
                        "--overwrite to replace it (kept until the new one is whole), or choose another --output-dir")


def run_quickstart(output_dir: str | Path = "runs/quickstart", steps: int = 500, batch_size: int = 16,
                   prompt: str = "The assert statement", progress: bool = True, overwrite: bool = False
                   ) -> QuickstartReport:
    started = time.perf_counter()
    output_dir = Path(output_dir)
    check_quickstart_folder(output_dir, overwrite)
    recipe = load_recipe("fem-lm-tiny", [f"training.steps={steps}", f"training.batch_size={batch_size}",
                                         f"training.save_every={steps}", f"training.eval_every={steps}",
                                         f"training.warmup_steps={min(30, steps // 10)}",
                                         f"output_dir={output_dir / RUN}"])
    trained = run_training(recipe, overwrite=overwrite, progress=progress)
    results = evaluate_folder(trained.model_dir)["local"]
    local = {}
    for score in scores(results):
        local.setdefault(score.task, {})[score.metric] = score.value
    export_dir = export_folder(trained.model_dir, output_dir / EXPORT, overwrite=overwrite, name=output_dir.name)
    model = AutoModelForCausalLM.from_pretrained(export_dir)
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        trace = model(**inputs, output_energies=True).energies
    energy_plot = output_dir / ENERGY_PLOT
    trace.plot(energy_plot)
    generated = model.generate(**inputs, max_new_tokens=40, do_sample=False,
                               repetition_penalty=1.2, pad_token_id=tokenizer.pad_token_id)
    tail = trained.losses[-20:]
    sample = tokenizer.decode(generated[0], skip_special_tokens=True)
    return QuickstartReport(trained.model_dir, export_dir, sum(tail) / len(tail),
                            trained.final_metrics["validation_loss"], len(tokenizer), local, sample, energy_plot,
                            time.perf_counter() - started)
