"""`energyzoo train RECIPE.yaml [overrides]`: train any zoo model with accelerate.

One process or many (``accelerate launch --num_processes N ...``: data parallel, gloo on CPU, NCCL on GPUs; DeepSpeed
ZeRO-2/3 and FSDP2 through the accelerate configs in `recipes/accelerate/`, on GPUs and CPUs alike, the engine named in
the run's log and checkpoints: `engines`). AdamW with decoupled weight decay, linear warmup + cosine decay (or the
recipe's `lr_schedule`), gradient clipping, gradient accumulation (`Accelerator.accumulate`), mixed precision where the
device has it, activation checkpointing on request.
Data order is a pure function of (seed, step) (`schedule`), served by a DataLoader that accelerate prepares and
shards: process p of P takes every p-th micro-batch, so a resumed run continues with exactly the examples it would
have seen and P processes train on the same global batches as one. Streamed `datasets` sources are read by each
process from its own share of the documents (`data.hub.PackedStream`) and resume from the per-process stream
positions saved in the checkpoint. Validation is `validation.evaluate`.

The run folder's files (recipe, metrics, checkpoints, the final and best models) are docs/training.md's "The run
folder"; every folder is written whole or not at all (`files.publish`), so a run killed at any moment resumes
from its newest complete checkpoint with the weights an uninterrupted run would have.
"""

import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import ProjectConfiguration, load_checkpoint_in_model, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoTokenizer, get_scheduler

from ..data.hub import tokenizer_training_texts
from ..data.hub_access import reaching_hub
from ..data.text import train_bpe_tokenizer
from ..files import check_tokenizer_folder, write_fault, write_folder_whole
from ..modeling.checks import require
from ..modeling.errors import UserError
from ..registry import TASKS
from .checkpoints import (
    BEST_MODEL,
    LOSS_CURVE,
    METRICS,
    MODEL,
    STATE_FILE,
    TOKENIZER,
    TRACKERS,
    append_metrics,
    checkpoint_path,
    checkpoint_step,
    claim_output_dir,
    latest_checkpoint,
    plot_loss_curve,
    release_unstarted_run,
    resumed_step,
    rotate_checkpoints,
    save_model_folder,
    saved_whole,
    stream_state_file,
)
from .engines import (
    Engine,
    build_accelerator,
    engine_of,
    hand_recipe_to_deepspeed,
    precision_available,
    true_shape,
)
from .recipe import Recipe, flat_settings
from .schedule import ScheduledExamples, fetched_batch
from .tasks import TrainingData, TrainingTask, training_task
from .validation import evaluate

logger = logging.getLogger(__name__)
TINY_MODEL_PARAMETERS = 10_000_000  # below this a CPU run takes one thread (`_threads_for`)


def prepare_data(recipe: Recipe, output_dir: Path, is_main: bool, accelerator: Accelerator):
    """(data, tokenizer or None) of the recipe's task. A text task's tokenizer (``tokenizer.name``'s, else the warm
    start's, else one trained here) is kept in ``output_dir/tokenizer`` so a resumed run uses the same one."""
    task = training_task(recipe.task)
    tokenizer = None
    if task.tokenized and recipe.data.source not in task.token_sources:
        tokenizer_dir = output_dir / TOKENIZER
        if not tokenizer_dir.exists():
            named = recipe.tokenizer.name or recipe.model.init_from
            field = "tokenizer.name" if recipe.tokenizer.name else "model.init_from"
            local = named is not None and Path(named).expanduser().is_dir()
            if local:  # on every process: none waits for one that stopped
                check_tokenizer_folder(Path(named).expanduser(), f"recipe {field}, whose tokenizer the run takes")
            if is_main:
                if local:
                    trained = AutoTokenizer.from_pretrained(named)
                elif named:
                    instead = ("give a local tokenizer folder (tokenizer.name=FOLDER), or leave tokenizer.name unset "
                               "to train one on the data here") if recipe.tokenizer.name else (
                        "give a local model folder (model.init_from=FOLDER)")
                    with reaching_hub(f"{field}={named!r}", instead) as offline:
                        trained = AutoTokenizer.from_pretrained(named, local_files_only=offline)
                else:
                    texts = tokenizer_training_texts(recipe.data)
                    trained = train_bpe_tokenizer(texts, recipe.tokenizer.train_vocab_size)
                write_folder_whole(tokenizer_dir, trained.save_pretrained)
            accelerator.wait_for_everyone()
        tokenizer = AutoTokenizer.from_pretrained(check_tokenizer_folder(tokenizer_dir, "the run's tokenizer"))
    return task.load(recipe.data, tokenizer, recipe.training.seed), tokenizer


def data_config_fields(recipe: Recipe, data: TrainingData) -> dict:
    """The config fields the data fixes that the model's config has (a ResNet has no ``image_size``), each checked
    against an override of the recipe's that would contradict it."""
    config = recipe.model.build_config()
    fields = {name: value for name, value in data.config_fields.items() if hasattr(config, name)}
    if "id2label" in fields:  # transformers keeps a num_labels given beside id2label over the map's length
        fields["num_labels"] = len(fields["id2label"])
    for name, value in fields.items():
        given = recipe.model.overrides.get(name, value)
        if name not in ("id2label", "label2id") and given != value:
            raise UserError(f"recipe model.overrides.{name}={given!r}, but the data has {name}={value!r}: drop the "
                            "override (the data sets it)")
    if fields:
        logger.info("from the data: " + ", ".join(
            f"{len(value)} classes ({', '.join(map(str, list(value.values())[:8]))})" if name == "id2label"
            else f"{name}={value}" for name, value in fields.items() if name not in ("label2id", "num_labels")))
    return fields


def build_model(recipe: Recipe, tokenizer, data: TrainingData):
    vocabulary = {} if tokenizer is None else dict(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    config = recipe.model.build_config(**vocabulary, **data_config_fields(recipe, data))
    auto_class = TASKS[recipe.task].auto_class
    init_from = recipe.model.init_from
    if init_from is None:
        return auto_class.from_config(config)
    if Path(init_from).expanduser().is_dir():  # a warm start: the checkpoint's weights where the names match
        return auto_class.from_pretrained(init_from, config=config)
    with reaching_hub(f"model.init_from={init_from!r}", "give a local model folder") as offline:
        return auto_class.from_pretrained(init_from, config=config, local_files_only=offline)


@dataclass
class TrainingResult:
    output_dir: Path
    model_dir: Path | None  # None when the run stopped early (``stop_after``)
    last_step: int
    losses: list[float]
    final_metrics: dict
    engine: Engine
    best_model_dir: Path | None = None  # with `training.keep_best`: the model at that metric's best evaluation


def scalar_outputs(outputs) -> dict[str, torch.Tensor]:
    """The 0-d tensors a model returns besides its loss (a loss's parts, e.g. EER's task loss and regularisers)."""
    return {name: value.detach() for name, value in outputs.items()
            if name != "loss" and isinstance(value, torch.Tensor) and value.dim() == 0}


def run_training(recipe: Recipe, resume: bool = False, overwrite: bool = False, stop_after: int | None = None,
                 progress: bool = True, evaluation_hook: Callable | None = None) -> TrainingResult:
    """Train `recipe` into its output folder, which must hold no other run: with `resume`, continue the run there
    from its newest complete checkpoint (step 0 if it has none); with `overwrite`, remove that run's files first.
    `stop_after` ends this session after that many steps with a checkpoint of the last one (which ``resume`` continues
    from), and no final model.
    `evaluation_hook(model, step) -> dict` adds its metrics to every evaluation row, and to a row of step 0 before
    training (e.g. a reproduction's own evaluation sets); it runs on every process, with the model in eval mode."""
    threads = torch.get_num_threads()
    if recipe.training.num_threads is not None:
        torch.set_num_threads(recipe.training.num_threads)
    reached = _Reached()
    try:
        return _train(recipe, resume, overwrite, stop_after, progress, evaluation_hook, reached)
    except KeyboardInterrupt:
        if not reached.claimed:
            raise
        raise RunStopped(f"stopped at step {reached.step} (Ctrl-C); --resume continues from step "
                         f"{_resumable_step(recipe)}") from None
    except Exception as error:
        if (fault := write_fault(error)) is None or not reached.claimed:
            raise
        raise UserError(f"cannot write {fault}; the run in {recipe.output_dir} can resume from step "
                        f"{_resumable_step(recipe)} (make room, then run again with --resume)") from error
    finally:
        torch.set_num_threads(threads)


class RunStopped(KeyboardInterrupt):
    """Ctrl-C during a run, with the step it reached and the step ``--resume`` continues from."""


@dataclass
class _Reached:
    """How far a run got: whether it holds its folder, and its last completed step."""

    claimed: bool = False
    step: int = 0


def _resumable_step(recipe: Recipe) -> int:
    newest = latest_checkpoint(Path(recipe.output_dir), main=False)
    return checkpoint_step(newest) if newest else 0


def _threads_for(model) -> None:
    """One CPU thread for a tiny model on a CPU: its operations are too small to split, and on a shared machine extra
    threads wait on each other (the quickstart took 28 minutes under load with torch's default, 2.5 with
    one). `training.num_threads` or ``OMP_NUM_THREADS`` choose otherwise; `run_training` restores the count after."""
    parameters = sum(parameter.numel() for parameter in model.parameters())
    if not torch.cuda.is_available() and parameters < TINY_MODEL_PARAMETERS:
        torch.set_num_threads(1)
        logger.info(f"{parameters:,} parameters: training on one CPU thread (training.num_threads or OMP_NUM_THREADS "
                    "to choose)")


def _accelerator(recipe: Recipe) -> Accelerator:
    settings = recipe.training
    # A previous run in this process leaves accelerate's singleton states behind (its mixed precision, its
    # last DataLoader); the distributed state itself is kept.
    AcceleratorState._reset_state()
    GradientState._reset_state()
    accelerator = build_accelerator(
        mixed_precision=settings.mixed_precision, gradient_accumulation_steps=settings.gradient_accumulation,
        # the scheduler counts global steps: it steps once per optimiser step, not once per process
        step_scheduler_with_optimizer=False,
        log_with=settings.trackers() or None,
        project_config=ProjectConfiguration(recipe.output_dir, str(Path(recipe.output_dir) / TRACKERS)))
    # accelerate falls back to fp32 where the device has no autocast of that precision (fp16 on a CPU), while
    # recipe.yaml would record the precision asked for. DeepSpeed runs its own precision, where its device has it.
    require("recipe training", settings.mixed_precision == "no" or precision_available(accelerator,
                                                                                      settings.mixed_precision),
            "mixed_precision", f"a precision the {accelerator.device.type} device trains in ('no', or 'bf16' on a CPU)",
            settings.mixed_precision)
    _keep_weights_in_model_folders(accelerator)
    return accelerator


def _keep_weights_in_model_folders(accelerator: Accelerator) -> None:
    """A checkpoint stores the weights once, in its ``model/`` folder (which `energyzoo eval` and `export` read):
    accelerate's `save_state` leaves its own copy out and `load_state` reads them from that folder, through the
    hooks accelerate has for this. Sharded states (FSDP, DeepSpeed) keep accelerate's sharded format, which resuming
    them needs, beside the gathered ``model/`` folder."""

    def leave_out(models, weights, output_dir) -> None:
        weights.clear()

    def read_model_folder(models, input_dir) -> None:
        for model in models:
            load_checkpoint_in_model(accelerator.unwrap_model(model), str(Path(input_dir) / MODEL), strict=True)
        models.clear()

    accelerator.register_save_state_pre_hook(leave_out)
    accelerator.register_load_state_pre_hook(read_model_folder)


def tracker_config(recipe: Recipe) -> dict:
    """The recipe flattened to ``section.key: scalar`` (trackers take scalars as hyperparameters)."""
    return {name: value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
            for name, value in flat_settings(recipe.to_dict()).items()}


def _micro_batch_size(recipe: Recipe, accelerator: Accelerator) -> int:
    """Examples per forward pass of one process: the global batch over processes and accumulation steps."""
    settings, processes = recipe.training, accelerator.num_processes
    if settings.batch_size % (processes * settings.gradient_accumulation):
        raise UserError(f"training.batch_size {settings.batch_size} must divide into {processes} "
                         f"processes x {settings.gradient_accumulation} accumulation steps")
    return settings.batch_size // (processes * settings.gradient_accumulation)


def _optimizer_and_schedule(model, recipe: Recipe):
    """AdamW with weight decay on the matrices only (by their true shape, also under ZeRO-3), and the recipe's
    learning-rate schedule."""
    settings = recipe.training
    trained = [parameter for parameter in model.parameters() if parameter.requires_grad]
    groups = [{"params": [p for p in trained if len(true_shape(p)) >= 2], "weight_decay": settings.weight_decay},
              {"params": [p for p in trained if len(true_shape(p)) < 2], "weight_decay": 0.0}]
    # an empty group would be dropped by DeepSpeed and leave the scheduler one group short
    optimizer = torch.optim.AdamW([group for group in groups if group["params"]], lr=settings.learning_rate,
                                  betas=tuple(settings.adam_betas))
    return optimizer, get_scheduler(settings.lr_schedule, optimizer, settings.warmup_steps, settings.steps)


@dataclass
class _Run:
    """One training session's state, from the prepared model to the last step: the phases of `_train` are its
    methods."""

    recipe: Recipe
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    data: TrainingData
    task: TrainingTask
    tokenizer: object
    output_dir: Path
    micro: int
    engine: Engine
    loader: DataLoader | None = None
    stream: object = None

    @classmethod
    def prepare(cls, recipe: Recipe, resume: bool, overwrite: bool, held: ExitStack) -> "_Run":
        """Claim the folder (for as long as ``held`` is open), read the data, build the model and hand it to
        accelerate."""
        settings = recipe.training
        accelerator = _accelerator(recipe)
        micro = _micro_batch_size(recipe, accelerator)
        hand_recipe_to_deepspeed(accelerator, settings.max_grad_norm, settings.gradient_accumulation, micro)
        output_dir = claim_output_dir(accelerator, recipe, resume, overwrite, held)
        try:
            data, tokenizer, model = cls._read_and_build(recipe, output_dir, accelerator)
        except BaseException:
            if not resume and accelerator.is_main_process:  # nothing trained: nothing left in the way of a rerun
                release_unstarted_run(output_dir)
            raise
        if settings.num_threads is None and "OMP_NUM_THREADS" not in os.environ:
            _threads_for(model)
        if settings.activation_checkpointing:
            require("recipe training", model.supports_gradient_checkpointing, "activation_checkpointing",
                    f"false for {type(model).__name__}, which has no checkpointed blocks", True)
            model.activation_checkpointing_enable({"use_reentrant": False})
        optimizer, scheduler = _optimizer_and_schedule(model, recipe)
        loader = None
        if data.train_stream is None:
            # accelerate gives process p every p-th micro-batch of this loader, so the micro-batches of one step
            # are the step's global batch in any number of processes
            loader = DataLoader(ScheduledExamples(data, settings.batch_size, settings.steps, settings.seed),
                                batch_size=micro, collate_fn=fetched_batch)
            model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
        else:
            model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        return cls(recipe, accelerator, model, optimizer, scheduler, data, training_task(recipe.task), tokenizer,
                   output_dir, micro, engine_of(accelerator), loader)

    @staticmethod
    def _read_and_build(recipe: Recipe, output_dir: Path, accelerator: Accelerator):
        """(data, tokenizer, model) of a claimed run folder."""
        set_seed(recipe.training.seed)
        data, tokenizer = prepare_data(recipe, output_dir, accelerator.is_main_process, accelerator)
        if len(data.validation_inputs) < accelerator.num_processes:
            raise UserError(f"{len(data.validation_inputs)} validation examples cannot be shared by "
                            f"{accelerator.num_processes} processes")
        return data, tokenizer, build_model(recipe, tokenizer, data)

    def batches(self, start_step: int, checkpoint: Path | None):
        """(inputs, labels) micro-batches from ``start_step`` on: the scheduled loader skipping what was trained,
        or the stream from its saved position."""
        if self.loader is not None:
            skipped = start_step * self.recipe.training.gradient_accumulation
            return iter(self.accelerator.skip_first_batches(self.loader, skipped) if start_step else self.loader)
        rank = self.accelerator.process_index
        state = json.loads((checkpoint / stream_state_file(rank)).read_text()) if checkpoint else None
        self.stream = self.data.train_stream(rank, self.accelerator.num_processes, state)
        return ((blocks, blocks) for blocks in iter(lambda: self.stream.next_blocks(self.micro), None))

    def log(self, row: dict) -> None:
        if self.accelerator.is_main_process:
            append_metrics(self.output_dir / METRICS, row)
        self.accelerator.log({key: value for key, value in row.items() if key != "step"}, step=row["step"])

    def optimizer_step(self, batches) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One step over the accumulated micro-batches; (this process's loss, the mean of its other scalar
        outputs)."""
        accelerator, model, accumulation = self.accelerator, self.model, self.recipe.training.gradient_accumulation
        step_loss = torch.zeros((), device=accelerator.device)
        parts: dict[str, torch.Tensor] = {}
        for _ in range(accumulation):
            inputs, labels = next(batches)
            with accelerator.accumulate(model):  # syncs, clips and steps on the last micro-batch only
                outputs = model(**self.task.model_inputs(inputs.to(accelerator.device), labels.to(accelerator.device)),
                                **self.task.model_options)
                accelerator.backward(outputs.loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), self.recipe.training.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            step_loss += outputs.loss.detach() / accumulation
            for name, value in scalar_outputs(outputs).items():
                parts[name] = parts.get(name, 0) + value / accumulation
        self.scheduler.step()
        return step_loss, parts

    def evaluate(self, step: int, evaluation_hook: Callable | None, held_out: bool = True) -> dict:
        """The validation metrics (``held_out``) and the hook's, computed in eval mode."""
        metrics = evaluate(self.model, self.data, self.task, self.accelerator) if held_out else {}
        if evaluation_hook is not None:
            self.model.eval()
            metrics.update(evaluation_hook(self.accelerator.unwrap_model(self.model), step))
        self.model.train()
        return metrics

    def trained(self, step: int, metrics: dict) -> dict:
        """A model folder's ``training_metrics.json``: its step, how it was trained, its last evaluation."""
        return {"steps": step, "processes": self.engine.world_size, "engine": self.engine.to_dict(), **metrics}

    def save_checkpoint(self, folder: Path, step: int, metrics: dict) -> None:
        self.accelerator.save_state(str(folder))  # optimiser, scheduler, RNG states; the weights go to model/
        save_model_folder(self.accelerator, self.model, folder / MODEL, self.tokenizer, self.output_dir,
                          self.trained(step, metrics))
        if self.stream is not None:
            (folder / stream_state_file(self.accelerator.process_index)).write_text(
                json.dumps(self.stream.state_dict()))
        if self.accelerator.is_main_process:
            (folder / STATE_FILE).write_text(json.dumps({"step": step, "engine": self.engine.to_dict()}))

    def keep_if_best(self, step: int, metrics: dict) -> None:
        """Save ``best-model/`` when ``metrics`` improve on the best evaluation so far of `training.keep_best` (read
        back from the saved folder, so a resumed run compares with the evaluations before the interruption)."""
        name = self.recipe.training.keep_best
        if name not in metrics:
            raise UserError(f"recipe training.keep_best: the evaluation has no metric {name!r}; it has "
                             f"{sorted(metrics)}")
        saved = self.output_dir / BEST_MODEL / "training_metrics.json"
        if saved.is_file():
            best = json.loads(saved.read_text())[name]
            lower = name.endswith("loss")
            if (metrics[name] >= best) if lower else (metrics[name] <= best):
                return
        saved_whole(self.accelerator, self.output_dir / BEST_MODEL, lambda folder: save_model_folder(
            self.accelerator, self.model, folder, self.tokenizer, self.output_dir, self.trained(step, metrics)))

    def save_model(self, metrics: dict) -> Path:
        """The final model folder and the loss curve."""
        model_dir = self.output_dir / MODEL
        metrics = self.trained(self.recipe.training.steps, metrics)
        saved_whole(self.accelerator, model_dir, lambda folder: save_model_folder(
            self.accelerator, self.model, folder, self.tokenizer, self.output_dir, metrics))
        if self.accelerator.is_main_process:
            if importlib.util.find_spec("matplotlib"):
                plot_loss_curve(self.output_dir / METRICS, self.output_dir / LOSS_CURVE)
            else:
                logger.info("no loss curve drawn: matplotlib comes with energyzoo's [plots] extra")
        self.accelerator.wait_for_everyone()
        return model_dir


def _train(recipe: Recipe, resume: bool, overwrite: bool, stop_after: int | None, progress: bool,
           evaluation_hook: Callable | None, reached: _Reached) -> TrainingResult:
    with ExitStack() as held:  # the run folder's lock, and the run an --overwrite replaces
        run = _Run.prepare(recipe, resume, overwrite, held)
        reached.claimed = True
        return _train_steps(run, resume, stop_after, progress, evaluation_hook, reached)


def _train_steps(run: "_Run", resume: bool, stop_after: int | None, progress: bool, evaluation_hook: Callable | None,
                 reached: _Reached) -> TrainingResult:
    recipe = run.recipe
    settings = recipe.training
    accelerator, output_dir = run.accelerator, run.output_dir
    start_step, checkpoint = resumed_step(accelerator, output_dir, resume)
    reached.step = start_step
    batches = run.batches(start_step, checkpoint)
    accelerator.init_trackers(output_dir.name, config=tracker_config(recipe))
    end_step = settings.steps if stop_after is None else min(settings.steps, start_step + stop_after)
    losses, final_metrics = [], {}
    started = time.perf_counter()
    run.model.train()
    bar = tqdm(range(start_step, end_step), initial=start_step, total=settings.steps,
               desc=f"training ({run.engine.describe()})",
               disable=not (progress and accelerator.is_main_process))
    if evaluation_hook is not None and start_step == 0:
        run.log({"step": 0, **run.evaluate(0, evaluation_hook, held_out=False)})
    for step in bar:
        step_loss, parts = run.optimizer_step(batches)
        global_loss = float(accelerator.reduce(step_loss, reduction="mean"))
        losses.append(global_loss)
        done = reached.step = step + 1
        bar.set_postfix(loss=f"{global_loss:.4f}")
        if done % settings.log_every == 0 or done == settings.steps:
            reduced = {name: float(accelerator.reduce(value, reduction="mean"))
                       for name, value in sorted(parts.items())}
            run.log({"step": done, "loss": global_loss, **reduced, "learning_rate": run.scheduler.get_last_lr()[0],
                     "seconds": time.perf_counter() - started})
        if done % settings.eval_every == 0 or done == settings.steps:
            final_metrics = run.evaluate(done, evaluation_hook)
            run.log({"step": done, **final_metrics})
            if settings.keep_best is not None:
                run.keep_if_best(done, final_metrics)
        if (done % settings.save_every == 0 or done == end_step) and done < settings.steps:  # --stop-after saves too
            saved_whole(accelerator, checkpoint_path(output_dir, done),
                         partial(run.save_checkpoint, step=done, metrics=final_metrics))
            if accelerator.is_main_process:
                rotate_checkpoints(output_dir, settings.save_total_limit)
    bar.close()
    for tracker in accelerator.trackers:  # not `end_training`, which also ends the distributed state
        tracker.finish()
    if end_step < settings.steps:
        return TrainingResult(output_dir, None, end_step, losses, final_metrics, run.engine)
    best = output_dir / BEST_MODEL if settings.keep_best is not None else None
    return TrainingResult(output_dir, run.save_model(final_metrics), end_step, losses, final_metrics, run.engine, best)
