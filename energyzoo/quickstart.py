"""`energyzoo quickstart`: the short path through `train`, `eval` and `export`.

Trains a tiny FEM-LM on the embedded Python documentation with the shipped `fem-lm-tiny` recipe, evaluates
it on the offline `local` lm-eval suite, exports a Hub-ready folder (card included), plots the exported model's
energy trace on the prompt (``energies.png``) and says how to push it. Offline throughout; a few minutes on
2 CPU cores. It orchestrates `training`, `eval` and `hub_cards`, so it lives above them.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .eval.harness import evaluate_folder, scores
from .hub_cards import export_folder
from .training.recipe import load_recipe
from .training.run import run_training


@dataclass
class QuickstartReport:
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


def run_quickstart(output_dir: str | Path = "runs/quickstart", steps: int = 500, batch_size: int = 16,
                   prompt: str = "The assert statement", progress: bool = True) -> QuickstartReport:
    started = time.perf_counter()
    output_dir = Path(output_dir)
    recipe = load_recipe("fem-lm-tiny", [f"training.steps={steps}", f"training.batch_size={batch_size}",
                                         f"training.save_every={steps}", f"training.eval_every={steps}",
                                         f"training.warmup_steps={min(30, steps // 10)}",
                                         f"output_dir={output_dir / 'train'}"])
    trained = run_training(recipe, overwrite=True, progress=progress)  # its own folder, redone each call
    results = evaluate_folder(trained.model_dir)["local"]
    local = {}
    for score in scores(results):
        local.setdefault(score.task, {})[score.metric] = score.value
    export_dir = export_folder(trained.model_dir, output_dir / "export")
    model = AutoModelForCausalLM.from_pretrained(export_dir)
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        trace = model(**inputs, output_energies=True).energies
    energy_plot = output_dir / "energies.png"
    trace.plot(energy_plot)
    generated = model.generate(**inputs, max_new_tokens=40, do_sample=False,
                               repetition_penalty=1.2, pad_token_id=tokenizer.pad_token_id)
    tail = trained.losses[-20:]
    return QuickstartReport(export_dir, sum(tail) / len(tail), trained.final_metrics["validation_loss"],
                            len(tokenizer), local, tokenizer.decode(generated[0], skip_special_tokens=True),
                            energy_plot, time.perf_counter() - started)
