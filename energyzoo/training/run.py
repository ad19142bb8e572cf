"""`energyzoo train RECIPE.yaml [overrides]`: train any zoo model with accelerate.

One process or many (``accelerate launch --num_processes N ...``: data parallel, gloo on CPU, NCCL on GPUs,
FSDP/DeepSpeed through the accelerate configs in `configs/`). AdamW with decoupled weight decay, linear
warmup + cosine decay (or the recipe's `lr_schedule`), gradient clipping, gradient accumulation, mixed precision
where the device has it. Online tasks (induction heads) draw a fresh global batch per step instead.

Data order is a pure function of (seed, step): the global batch of step s is the s-th slice of a stream of
seeded permutations of the training examples, and process p of P takes the p-th part of it. So a run
resumed from a checkpoint continues with exactly the examples it would have seen, and P processes see
the same global batches as one process (same global batch size, same loss curve up to float rounding).

Outputs in ``output_dir``: ``metrics.jsonl`` (step, loss, learning rate, evaluation rows), ``loss_curve.png``,
``checkpoints/step-NNNNNNN/`` every ``save_every`` steps (model, optimiser, scheduler, RNG states and the
step, via `Accelerator.save_state`), ``tokenizer/`` and the final ``model/`` folder (``save_pretrained``,
tokenizer and recipe included), which `energyzoo eval` and `energyzoo export` take.
"""

import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import yaml
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, get_scheduler

from ..presets import config_from_preset
from ..registry import ARCHITECTURES, TASKS, auto_map_for
from .data import tokenizer_training_texts, train_bpe_tokenizer
from .recipe import Recipe
from .tasks import TrainingData, TrainingTask, training_task

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"


def prepare_data(recipe: Recipe, output_dir: Path, is_main: bool, accelerator: Accelerator):
    """(data, tokenizer or None) of the recipe's task. A text task's tokenizer is trained once and kept in
    ``output_dir/tokenizer`` so a resumed run uses the same one."""
    task = training_task(recipe.task)
    tokenizer = None
    if task.tokenized and recipe.data.source not in task.token_sources:
        tokenizer_dir = output_dir / "tokenizer"
        if not tokenizer_dir.exists():
            if is_main:
                trained = (AutoTokenizer.from_pretrained(recipe.tokenizer.name) if recipe.tokenizer.name else
                           train_bpe_tokenizer(tokenizer_training_texts(recipe.data), recipe.tokenizer.train_vocab_size))
                trained.save_pretrained(tokenizer_dir)
            accelerator.wait_for_everyone()
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return task.load(recipe.data, tokenizer, recipe.training.seed), tokenizer


def build_model(recipe: Recipe, tokenizer):
    if recipe.model.preset is not None:
        config = config_from_preset(recipe.model.preset, **recipe.model.overrides)
    else:
        config = AutoConfig.for_model(**{**recipe.model.config, **recipe.model.overrides})
    if tokenizer is not None:
        for name, value in dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id).items():
            setattr(config, name, value)
    return TASKS[recipe.task].auto_class.from_config(config)


class BatchSchedule:
    """Indices of the global batch of every step: consecutive slices of a stream of seeded permutations."""

    def __init__(self, examples: int, batch_size: int, seed: int):
        if batch_size > examples:
            raise ValueError(f"training.batch_size {batch_size} exceeds the {examples} training examples")
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self._permutations: dict[int, torch.Tensor] = {}

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._permutations:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._permutations = {epoch: torch.randperm(self.examples, generator=generator)}
        return self._permutations[epoch]

    def global_batch(self, step: int) -> torch.Tensor:
        positions = torch.arange(step * self.batch_size, (step + 1) * self.batch_size)
        epochs = positions // self.examples
        return torch.cat([self._permutation(int(epoch))[positions[epochs == epoch] % self.examples]
                          for epoch in epochs.unique()])


@torch.no_grad()
def evaluate(model, data: TrainingData, task: TrainingTask, accelerator: Accelerator, batch_size: int = 32) -> dict:
    """Validation loss and the task's metrics (the data's own, where it has them), each process on its share, summed
    over processes."""
    model.eval()
    totals: dict[str, torch.Tensor] = {}

    def add(name: str, numerator, denominator) -> None:
        pair = torch.stack([torch.as_tensor(numerator), torch.as_tensor(denominator)]).float().to(accelerator.device)
        totals[name] = totals.get(name, torch.zeros(2, device=accelerator.device)) + pair

    share = range(accelerator.process_index, len(data.validation_inputs), accelerator.num_processes)
    indices = torch.tensor(list(share), dtype=torch.long)
    for start in range(0, len(indices), batch_size):
        chunk = indices[start : start + batch_size]
        labels = data.validation_labels[chunk].to(accelerator.device)
        inputs = data.validation_inputs[chunk].to(accelerator.device)
        outputs = model(**task.model_inputs(inputs, labels), **task.model_options)
        add("loss", outputs.loss * len(chunk), len(chunk))
        for name, (numerator, denominator) in (data.metrics or task.metrics)(outputs, labels).items():
            add(name, numerator, denominator)
    model.train()
    names = sorted(totals)  # the same order on every process
    reduced = accelerator.reduce(torch.stack([totals[name] for name in names]), reduction="sum")
    return {f"validation_{name}": float(pair[0] / pair[1]) for name, pair in zip(names, reduced)}


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = sorted((output_dir / CHECKPOINTS).glob("step-*"))
    return checkpoints[-1] if checkpoints else None


def _append_metrics(path: Path, row: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def _truncate_metrics(path: Path, last_step: int) -> None:
    """Drop rows a killed run logged after its last checkpoint (they are recomputed on resume)."""
    if path.exists():
        rows = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= last_step]
        path.write_text("".join(row + "\n" for row in rows))


def plot_loss_curve(metrics_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    figure, axis = plt.subplots(figsize=(7, 4))
    train = [row for row in rows if "loss" in row]
    axis.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    evaluated = [row for row in rows if "validation_loss" in row]
    if evaluated:
        axis.plot([r["step"] for r in evaluated], [r["validation_loss"] for r in evaluated], "o-", label="validation loss")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.legend()
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)


@dataclass
class TrainingResult:
    output_dir: Path
    model_dir: Path | None  # None when the run stopped early (``stop_after``)
    last_step: int
    losses: list[float]
    final_metrics: dict


def scalar_outputs(outputs) -> dict[str, torch.Tensor]:
    """The 0-d tensors a model returns besides its loss (a loss's parts, e.g. EER's task loss and regularisers)."""
    return {name: value.detach() for name, value in outputs.items()
            if name != "loss" and isinstance(value, torch.Tensor) and value.dim() == 0}


def run_training(recipe: Recipe, resume: bool = False, stop_after: int | None = None, progress: bool = True,
                 evaluation_hook: Callable | None = None) -> TrainingResult:
    """Train `recipe`; with `resume`, continue from the latest checkpoint in its output folder. `stop_after`
    ends this session after that many steps without a final save (as if the job were killed).
    `evaluation_hook(model, step) -> dict` adds its metrics to every evaluation row, and to a row of step 0 before
    training (e.g. a reproduction's own evaluation sets); it runs on every process, with the model in eval mode."""
    threads = torch.get_num_threads()
    if recipe.training.num_threads is not None:
        torch.set_num_threads(recipe.training.num_threads)
    try:
        return _train(recipe, resume, stop_after, progress, evaluation_hook)
    finally:
        torch.set_num_threads(threads)


def _train(recipe: Recipe, resume: bool, stop_after: int | None, progress: bool,
           evaluation_hook: Callable | None) -> TrainingResult:
    settings = recipe.training
    output_dir = Path(recipe.output_dir)
    # A previous run in this process leaves accelerate's singleton state behind (its mixed precision among
    # it); the distributed state itself is kept.
    AcceleratorState._reset_state()
    accelerator = Accelerator(mixed_precision=settings.mixed_precision, cpu=not torch.cuda.is_available())
    if settings.batch_size % (accelerator.num_processes * settings.gradient_accumulation):
        raise ValueError(f"training.batch_size {settings.batch_size} must divide into {accelerator.num_processes} "
                         f"processes x {settings.gradient_accumulation} accumulation steps")
    is_main = accelerator.is_main_process
    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    set_seed(settings.seed)
    task = training_task(recipe.task)
    data, tokenizer = prepare_data(recipe, output_dir, is_main, accelerator)
    model = build_model(recipe, tokenizer)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=settings.learning_rate, betas=settings.adam_betas)
    scheduler = get_scheduler(settings.lr_schedule, optimizer, settings.warmup_steps, settings.steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Not prepared: accelerate would step it once per process, but every step here is one global batch.
    accelerator.register_for_checkpointing(scheduler)

    metrics_path = output_dir / "metrics.jsonl"
    start_step = 0
    checkpoint = latest_checkpoint(output_dir) if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {output_dir / CHECKPOINTS}")
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        start_step = json.loads((checkpoint / STATE_FILE).read_text())["step"]
        if is_main:
            _truncate_metrics(metrics_path, start_step)
    elif is_main and metrics_path.exists():
        metrics_path.unlink()

    schedule = None if data.train_batches else BatchSchedule(len(data.train_inputs), settings.batch_size, settings.seed)
    per_process = settings.batch_size // accelerator.num_processes
    micro = per_process // settings.gradient_accumulation
    end_step = settings.steps if stop_after is None else min(settings.steps, start_step + stop_after)
    losses, final_metrics = [], {}
    started = time.perf_counter()
    model.train()
    bar = tqdm(range(start_step, end_step), initial=start_step, total=settings.steps, desc="training",
               disable=not (progress and is_main))
    if evaluation_hook is not None and start_step == 0:
        model.eval()
        initial = evaluation_hook(accelerator.unwrap_model(model), 0)
        model.train()
        if is_main:
            _append_metrics(metrics_path, {"step": 0, **initial})
    for step in bar:
        share = slice(accelerator.process_index * per_process, (accelerator.process_index + 1) * per_process)
        if schedule is None:
            all_inputs, all_labels = data.train_batches(step, settings.batch_size)
            step_inputs, step_labels = all_inputs[share], all_labels[share]
        else:
            indices = schedule.global_batch(step)[share]
            step_inputs, step_labels = data.train_inputs[indices], data.train_labels[indices]
        step_loss = torch.zeros((), device=accelerator.device)
        parts: dict[str, torch.Tensor] = {}
        for index in range(settings.gradient_accumulation):
            chunk = slice(index * micro, (index + 1) * micro)
            inputs = step_inputs[chunk].to(accelerator.device)
            labels = step_labels[chunk].to(accelerator.device)
            last = index == settings.gradient_accumulation - 1
            with nullcontext() if last else accelerator.no_sync(model):
                outputs = model(**task.model_inputs(inputs, labels), **task.model_options)
                loss = outputs.loss / settings.gradient_accumulation
                accelerator.backward(loss)
            step_loss += loss.detach()
            for name, value in scalar_outputs(outputs).items():
                parts[name] = parts.get(name, 0) + value / settings.gradient_accumulation
        accelerator.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        global_loss = float(accelerator.reduce(step_loss, reduction="mean"))
        losses.append(global_loss)
        done = step + 1
        bar.set_postfix(loss=f"{global_loss:.4f}")
        if done % settings.log_every == 0 or done == settings.steps:
            reduced = {name: float(accelerator.reduce(value, reduction="mean")) for name, value in sorted(parts.items())}
            if is_main:
                _append_metrics(metrics_path, {"step": done, "loss": global_loss, **reduced,
                                               "learning_rate": scheduler.get_last_lr()[0],
                                               "seconds": time.perf_counter() - started})
        if done % settings.eval_every == 0 or done == settings.steps:
            final_metrics = evaluate(model, data, task, accelerator)
            if evaluation_hook is not None:
                model.eval()
                final_metrics.update(evaluation_hook(accelerator.unwrap_model(model), done))
                model.train()
            if is_main:
                _append_metrics(metrics_path, {"step": done, **final_metrics})
        if done % settings.save_every == 0 and done < settings.steps:
            path = output_dir / CHECKPOINTS / f"step-{done:07d}"
            accelerator.save_state(str(path))
            if is_main:
                (path / STATE_FILE).write_text(json.dumps({"step": done}))
            accelerator.wait_for_everyone()
    bar.close()
    last_step = end_step
    if last_step < settings.steps:
        return TrainingResult(output_dir, None, last_step, losses, final_metrics)

    model_dir = output_dir / "model"
    if is_main:
        unwrapped = accelerator.unwrap_model(model)
        if unwrapped.config.model_type in ARCHITECTURES:  # vanilla baselines (a ViT, a Llama) need no remote code
            unwrapped.config.auto_map = auto_map_for(unwrapped.config.model_type)
        unwrapped.save_pretrained(model_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(model_dir)
        (model_dir / "recipe.yaml").write_text((output_dir / "recipe.yaml").read_text())
        (model_dir / "training_metrics.json").write_text(json.dumps(
            {"steps": settings.steps, "processes": accelerator.num_processes, **final_metrics}))
        plot_loss_curve(metrics_path, output_dir / "loss_curve.png")
    accelerator.wait_for_everyone()
    return TrainingResult(output_dir, model_dir, last_step, losses, final_metrics)
