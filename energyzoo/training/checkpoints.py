"""Run folders and their checkpoints: what `energyzoo train` writes, so that no kill loses a run and no two runs mix.

- A folder belongs to one run. `claim_run_folder` refuses a folder that holds another run's files unless the run is
  resumed (``--resume``, with the same settings wherever they change the run) or started over (``--overwrite``,
  which removes the old run's files and nothing else).
- Everything the run writes is complete or absent (`files.write_folder_whole`, `files.write_text_whole`). A checkpoint
  is such a folder, so a kill during a save leaves a ``.partial`` folder, which `latest_checkpoint` skips (saying so)
  and removes.
- A checkpoint records what it holds when it is written (`write_manifest`: each file's size and SHA-256), so that a
  file damaged afterwards (an interrupted copy of the run folder, a truncated ``optimizer.bin``) is found before
  resuming: `latest_checkpoint` takes the newest intact checkpoint and says which it skipped and why.
- A save that fails (a full disk, the file-size limit, Ctrl-C: `files.write_fault`) leaves the folder as it was before
  that save, resumable from its newest complete checkpoint.
- One process writes a run folder (`files.FolderLock`, held for the whole run); ``--overwrite`` sets the old run's
  files aside in ``.replaced-run/`` and removes them only once the new run ends well, so that an interrupted start
  over loses nothing (`claim_output_dir`).
- `rotate_checkpoints` keeps the newest ``training.save_total_limit`` checkpoints.
- The run's other files: ``metrics.jsonl`` (`append_metrics`, cut back to a resumed checkpoint by `truncate_metrics`),
  ``loss_curve.png`` (`plot_loss_curve`), a stream's position per process (`stream_state_file`), and model folders
  (`save_model_folder` writes one; `files.model_folder` finds the one `energyzoo eval` and `export` take).
"""

import json
import logging
import re
import shutil
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import yaml
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from ..files import (
    CHECKPOINTS,
    MODEL,
    PARTIAL,
    FolderLock,
    check_tokenizer_folder,
    manifest_damage,
    partial_path,
    publish,
    read_json,
    write_manifest,
    write_text_whole,
)
from ..modeling.errors import UserError, did_you_mean
from ..registry import ARCHITECTURES, auto_map_for
from .engines import check_resumable, engine_of, gathered_state_dict
from .recipe import Recipe, flat_settings, read_recipe

logger = logging.getLogger(__name__)

BEST_MODEL = "best-model"  # the model at the best evaluation of `training.keep_best`'s metric
TOKENIZER = "tokenizer"
RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
STATE_FILE = "trainer_state.json"
TRACKERS = "trackers"  # accelerate's trackers (tensorboard, ...) log under output_dir/trackers/
LOSS_CURVE = "loss_curve.png"
RUN_FILES = (RECIPE, METRICS, LOSS_CURVE, TOKENIZER, CHECKPOINTS, MODEL, BEST_MODEL, TRACKERS)
REPLACED = ".replaced-run"  # the files of the run an --overwrite replaces, until the new run ends well
CHECKPOINT_NAME = re.compile(r"step-(\d{7})")
# Recipe settings a resumed run may change: when and where it logs, evaluates and saves, and how each process
# computes its share of the global batch (the data, the optimiser and the steps stay those of the run).
RESUMABLE_CHANGES = {"output_dir", "training.log_every", "training.eval_every", "training.save_every",
                     "training.save_total_limit", "training.num_threads", "training.report_to",
                     "training.activation_checkpointing", "training.gradient_accumulation"}


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return output_dir / CHECKPOINTS / f"step-{step:07d}"


def run_files(output_dir: Path) -> list[str]:
    """The files and folders of a run (`RUN_FILES`) that ``output_dir`` holds."""
    return [name for name in RUN_FILES if (output_dir / name).exists()]


def changed_settings(saved: dict, recipe: dict) -> list[str]:
    """``name (saved -> new)`` for every setting of ``recipe`` that differs from the ``saved`` run's and changes what
    the run computes (all but `RESUMABLE_CHANGES`)."""
    saved, recipe = flat_settings(saved), flat_settings(recipe)
    return [f"{name} ({saved.get(name)!r} -> {recipe.get(name)!r})" for name in sorted(saved.keys() | recipe.keys())
            if name not in RESUMABLE_CHANGES and saved.get(name) != recipe.get(name)]


def claim_run_folder(output_dir: Path, recipe: dict, resume: bool, overwrite: bool) -> bool:
    """Check that ``output_dir`` may hold this run; returns whether the old run's files are to be removed
    (``overwrite``). Raises `ValueError` for a folder holding another run (or this run, changed, under ``resume``)."""
    if resume and overwrite:
        raise UserError("--resume continues the run in output_dir and --overwrite starts it over: pass one of them")
    found = run_files(output_dir)
    if resume and not found:
        runs = [folder.name for folder in output_dir.parent.glob("*") if (folder / RECIPE).is_file()]
        raise UserError(f"--resume: {output_dir} holds no run to continue (no {RECIPE})"
                        f"{did_you_mean(output_dir.name, runs)}")
    if not found or overwrite:
        return bool(found)
    if not resume:
        raise UserError(f"{output_dir} holds a run already ({', '.join(found)}): pass --resume to continue it or "
                         "--overwrite to start it over (removing its files), or choose another output_dir")
    if not (output_dir / RECIPE).exists():
        raise UserError(f"--resume: {output_dir} holds run files ({', '.join(found)}) but no {RECIPE}; start it "
                         "over with --overwrite")
    changes = changed_settings(read_recipe(output_dir / RECIPE).to_dict(), recipe)
    if changes:
        raise UserError(f"--resume: this recipe changes {'; '.join(changes)} from the run in {output_dir}, which "
                         "would mix two runs: resume with the run's settings, or start a new run (--overwrite or "
                         "another output_dir)")
    finished = output_dir / MODEL / "training_metrics.json"
    if finished.is_file() and read_json(finished).get("steps") == recipe["training"]["steps"]:
        raise UserError(f"--resume: the run in {output_dir} finished (step {recipe['training']['steps']}; its model is "
                        f"{output_dir / MODEL}): there is nothing to continue")
    if (output_dir / TOKENIZER).is_dir():  # read again by the resumed run: checked before anything is written
        check_tokenizer_folder(output_dir / TOKENIZER, "the run's tokenizer, which the resumed run reads")
    metrics_rows(output_dir / METRICS)
    return False


def remove_run_files(output_dir: Path) -> None:
    """Remove the run files of ``output_dir`` (`RUN_FILES` and their partial writes), leaving anything else."""
    for name in RUN_FILES:
        for path in (output_dir / name, partial_path(output_dir / name)):
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()


def damage(folder: Path) -> str | None:
    """Why the checkpoint ``folder`` cannot be resumed from (a step file that does not parse, a file missing, of
    another size or content than its manifest records), or None if it is intact. A checkpoint written before
    manifests were kept is checked by its step file only."""
    try:
        read_json(folder / STATE_FILE)["step"]
    except (UserError, KeyError) as error:
        return f"{STATE_FILE} is unreadable ({error})"
    return manifest_damage(folder)


def checkpoint_step(folder: Path) -> int:
    return json.loads((folder / STATE_FILE).read_text())["step"]


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """The complete checkpoints of a run, oldest first."""
    folder = output_dir / CHECKPOINTS
    found = [path for path in folder.glob("step-*") if CHECKPOINT_NAME.fullmatch(path.name)] if folder.is_dir() else []
    return sorted(path for path in found if (path / STATE_FILE).is_file())


def latest_checkpoint(output_dir: Path, main: bool = True) -> Path | None:
    """The newest complete and intact checkpoint of the run in ``output_dir`` (None if there is none): a damaged one
    (`damage`) is skipped for the one before it. The ``main`` process says which folders it skipped and why, and
    removes the interrupted saves among them (a damaged checkpoint is kept, for the user to look at, until a save of
    its step replaces it)."""
    folder = output_dir / CHECKPOINTS
    complete = complete_checkpoints(output_dir)
    for path in sorted(folder.iterdir()) if folder.is_dir() and main else []:
        if path.name.endswith(PARTIAL):
            logger.warning(f"--resume: skipping {path}, a save that was interrupted (removed)")
            shutil.rmtree(path, ignore_errors=True)
        elif path not in complete and CHECKPOINT_NAME.fullmatch(path.name):
            logger.warning(f"--resume: skipping {path}: incomplete (no {STATE_FILE})")
    for path in reversed(complete):
        reason = damage(path)
        if reason is None:
            return path
        if main:
            logger.warning(f"--resume: skipping {path}: {reason}; resuming from the checkpoint before it")
    return None


def rotate_checkpoints(output_dir: Path, keep: int | None) -> None:
    """Remove all but the newest ``keep`` complete checkpoints (``None`` keeps all)."""
    if keep is not None:
        for path in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(path)


def append_metrics(path: Path, row: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def metrics_rows(path: Path) -> list[tuple[int, str]]:
    """(step, line) of each row of a run's ``metrics.jsonl`` (none where there is no file), but a last row that a
    kill cut short; a line before it that is no row of the log is refused, naming it (the rows around it are the
    run's history, which resuming would lose)."""
    if not path.exists():
        return []
    lines, rows = path.read_bytes().splitlines(), []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not (isinstance(row, dict) and isinstance(row.get("step"), int)):
            if number == len(lines):
                break
            raise UserError(f"{path} line {number} is no row of the run's log (damaged?): move the file aside to "
                            "resume without the log of the steps before")
        rows.append((row["step"], line.decode()))
    return rows


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop rows a killed run logged after its last checkpoint (they are recomputed on resume), and a last row that a
    kill cut short (`metrics_rows`)."""
    if path.exists():
        write_text_whole(path, "".join(line + "\n" for step, line in metrics_rows(path) if step <= last_step))


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
        axis.plot([r["step"] for r in evaluated], [r["validation_loss"] for r in evaluated], "o-",
                  label="validation loss")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.legend()
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)


def stream_state_file(rank: int) -> str:
    return f"stream_state_{rank}.json"


def save_model_folder(accelerator: Accelerator, model, model_dir: Path, tokenizer, output_dir: Path,
                      metrics: dict) -> None:
    """A folder `from_pretrained`, `energyzoo eval` and `energyzoo export` take, called on every process: the full
    state dict gathered by accelerate (FSDP and ZeRO-3 shards included; DeepSpeed's float32 master weights, which
    `engines.gathered_state_dict` puts in) saved by the main process, with the
    tokenizer, the recipe and ``training_metrics.json``."""
    state_dict = gathered_state_dict(accelerator, model)
    floats = {value.dtype for value in (state_dict or {}).values() if value.is_floating_point()}  # main process
    unwrapped = accelerator.unwrap_model(model)
    if unwrapped.config.model_type in ARCHITECTURES:  # vanilla baselines (a ViT, a Llama) need no remote code
        unwrapped.config.auto_map = auto_map_for(unwrapped.config.model_type)
    unwrapped.save_pretrained(model_dir, is_main_process=accelerator.is_main_process, state_dict=state_dict,
                              save_function=accelerator.save)
    if accelerator.is_main_process:
        if tokenizer is not None:
            tokenizer.save_pretrained(model_dir)
        if len(floats) == 1 and floats != {unwrapped.dtype}:  # DeepSpeed's float32 masters of a bf16 module
            # (save_pretrained names the module's dtype, which `from_pretrained(dtype="auto")` would load them in)
            unwrapped.config.dtype = str(floats.pop()).removeprefix("torch.")
            unwrapped.config.save_pretrained(model_dir)
        (model_dir / RECIPE).write_text((output_dir / RECIPE).read_text())
        (model_dir / "training_metrics.json").write_text(json.dumps(metrics))


def saved_whole(accelerator: Accelerator, path: Path, write: Callable[[Path], None]) -> None:
    """``write(folder)`` on every process into a partial folder, which the main process records (`write_manifest`)
    and publishes as ``path`` once every process is done: the folder is whole or absent whenever the run is killed,
    and a save that fails (a full disk, Ctrl-C) leaves no partial folder behind (`run_training` says so)."""
    written = partial_path(path)
    if accelerator.is_main_process:
        shutil.rmtree(written, ignore_errors=True)  # a save a kill interrupted
    accelerator.wait_for_everyone()
    try:
        write(written)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            write_manifest(written)
            publish(written, path)
    except BaseException:  # a full disk, a file-size limit, Ctrl-C: the folder stays as it was before this save
        if accelerator.is_main_process:
            shutil.rmtree(written, ignore_errors=True)
        raise


def claim_output_dir(accelerator: Accelerator, recipe: Recipe, resume: bool, overwrite: bool,
                     held: ExitStack) -> Path:
    """The run folder, locked by the main process for as long as ``held`` is open (`files.FolderLock`), checked by
    every process (`claim_run_folder`), with this run's recipe.yaml. Under ``overwrite`` the old run's files are set
    aside (`REPLACED`) and removed when ``held`` closes without an error; a run that fails or is stopped leaves them
    there, with its own files beside them."""
    output_dir = Path(recipe.output_dir)
    refused = [None]
    if accelerator.is_main_process:
        try:
            held.enter_context(FolderLock(output_dir))
        except UserError as error:
            refused = [str(error)]
    refused = broadcast_object_list(refused)  # every process answers the main one's refusal, none waits on it
    if refused[0] is not None:
        raise UserError(refused[0])
    remove = claim_run_folder(output_dir, recipe.to_dict(), resume, overwrite)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if remove:
            set_aside_run_files(output_dir)
        if (output_dir / REPLACED).is_dir():
            held.push(partial(_settle_replaced_run, output_dir))
        write_text_whole(output_dir / RECIPE, yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    accelerator.wait_for_everyone()
    return output_dir


def set_aside_run_files(output_dir: Path) -> None:
    """Move the run files of ``output_dir`` into ``output_dir/.replaced-run`` (where an interrupted replacement left
    one, the run it replaced stays there and the interrupted run's files are removed)."""
    replaced = output_dir / REPLACED
    if replaced.is_dir():
        logger.warning(f"{replaced} holds the run an earlier --overwrite replaced (the run that replaced it stopped "
                       "after its first step): kept until this run ends well")
        remove_run_files(output_dir)
        return
    replaced.mkdir()
    for name in run_files(output_dir):
        (output_dir / name).rename(replaced / name)
    remove_run_files(output_dir)  # partial writes the old run left


def release_unstarted_run(output_dir: Path) -> None:
    """Undo the claim of a run that failed before its first step (its data, tokenizer or model could not be read or
    built): its files removed and the run an ``--overwrite`` set aside put back, so that the folder is as it was and
    the corrected command is accepted as it stands."""
    remove_run_files(output_dir)
    replaced = output_dir / REPLACED
    if replaced.is_dir():
        for item in replaced.iterdir():
            item.rename(output_dir / item.name)
        replaced.rmdir()
        logger.warning(f"the run in {output_dir} that --overwrite was to replace is left as it was")


def _settle_replaced_run(output_dir: Path, error_type, error, traceback) -> None:
    """The replaced run's files removed once the run that replaced them ends well; kept (and said where) otherwise."""
    if not (output_dir / REPLACED).is_dir():  # put back (`release_unstarted_run`)
        return
    if error_type is None:
        shutil.rmtree(output_dir / REPLACED)
    else:
        logger.warning(f"the run --overwrite replaced is kept in {output_dir / REPLACED} until a run here ends well")


def resumed_step(accelerator: Accelerator, output_dir: Path, resume: bool) -> tuple[int, Path | None]:
    """(step, checkpoint) the run continues from: the newest complete checkpoint's state loaded under ``resume``
    (step 0 without one), metrics logged after it dropped."""
    is_main = accelerator.is_main_process
    checkpoint = latest_checkpoint(output_dir, main=is_main) if resume else None
    start_step = 0
    if checkpoint is not None:
        saved = json.loads((checkpoint / STATE_FILE).read_text())
        check_resumable(saved.get("engine"), engine_of(accelerator), str(checkpoint))
        accelerator.load_state(str(checkpoint))
        start_step = checkpoint_step(checkpoint)
    elif resume and is_main:
        logger.warning(f"--resume: no complete checkpoint in {output_dir / CHECKPOINTS}: starting at step 0")
    if is_main and start_step:
        truncate_metrics(output_dir / METRICS, start_step)
    elif is_main:
        (output_dir / METRICS).unlink(missing_ok=True)
    return start_step, checkpoint
