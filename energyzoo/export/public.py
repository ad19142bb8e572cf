"""What an exported folder may say about the machine it was made on: nothing.

A pushed folder is public, so the run's own files are copied through these filters: the recipe with its local paths
reduced to their names (``./<name>``, which also keeps a local folder from being read as a Hub id) and the output
folder to its name; lm-eval's result JSON with its scores, task versions, package versions and the settings the card
states (dtype, batch size, device, limit, shots), but not its environment dump (OS, compiler, CPU and its
vulnerabilities), absolute paths, dates or git state.
"""

import json
from dataclasses import replace
from pathlib import Path

from ..training.recipe import Recipe, can_only_be_local

# lm-eval result keys kept as they are
KEPT_EVALUATION = ("results", "groups", "group_subtasks", "versions", "n-shot", "higher_is_better", "n-samples",
                   "transformers_version", "lm_eval_version")
KEPT_RUN_SETTINGS = ("model_dtype", "batch_size", "device", "limit")  # of lm-eval's "config"
KEPT_TASK_FIELDS = ("task", "dataset_name", "test_split", "num_fewshot", "output_type")


def is_local_path(name: str | None) -> bool:
    """Whether ``name`` names something on this machine rather than a Hub repository (``user/name``)."""
    return bool(name) and (can_only_be_local(name) or Path(name).expanduser().exists())


def _named(path: str | None) -> str | None:
    """A local path as ``./<its name>``; a Hub id (or None) as it is."""
    return f"./{Path(path).expanduser().name}" if is_local_path(path) else path


def public_recipe(recipe: Recipe) -> Recipe:
    """``recipe`` with its local paths (data files, a local warm start, tokenizer or `datasets` folder) reduced to their
    names and the output folder to its name."""
    return replace(
        recipe, output_dir=Path(recipe.output_dir).name,
        data=replace(recipe.data, paths=[_named(path) for path in recipe.data.paths], name=_named(recipe.data.name)),
        model=replace(recipe.model, init_from=_named(recipe.model.init_from)),
        tokenizer=replace(recipe.tokenizer, name=_named(recipe.tokenizer.name)))


def _public_task(config: dict) -> dict:
    task = {key: config[key] for key in KEPT_TASK_FIELDS if key in config}
    if config.get("dataset_path") and not is_local_path(config["dataset_path"]):
        task["dataset_path"] = config["dataset_path"]  # a Hub dataset, or a `datasets` builder name (json, csv, ...)
    version = config.get("metadata", {}).get("version")
    return {**task, "metadata": {"version": version}} if version is not None else task


def public_evaluation(evaluation: dict) -> dict:
    """lm-eval's result JSON reduced to what a published card may state (`KEPT_EVALUATION`, the run settings
    `KEPT_RUN_SETTINGS` and each task's `KEPT_TASK_FIELDS`, its dataset when that is no local path)."""
    public = {key: evaluation[key] for key in KEPT_EVALUATION if key in evaluation}
    public["config"] = {key: evaluation.get("config", {}).get(key) for key in KEPT_RUN_SETTINGS}
    public["configs"] = {name: _public_task(config) for name, config in evaluation.get("configs", {}).items()}
    return public


def public_evaluations(eval_dir: Path) -> dict[Path, dict]:
    """Every lm-eval result JSON of ``eval_dir`` (``energyzoo eval``'s output), each made public."""
    return {path: public_evaluation(json.loads(path.read_text())) for path in sorted(eval_dir.glob("*.json"))}
