"""Hub-ready folders: `energyzoo export MODEL_DIR OUT_DIR [--push REPO_ID]`.

The folder loads with `trust_remote_code=True` on a machine without energyzoo: safetensors weights, a
config whose `auto_map` names every Auto class the architecture supports, the modeling files (copied by
transformers through `register_for_auto_class`), the tokenizer, the generation config, and a model card
rendered from this folder's per-paper template (the registry's `card_template`: `fem.md`, `tel.md`,
`hyperset.md`, `eqt.md`, `eer.md`) with the evaluation results that `energyzoo eval` left in ``MODEL_DIR/eval`` as
`model-index` metadata, and the speed rows of the model's preset as `energyzoo bench --all` measured them
(`energyzoo.measured`, also the documents' speed tables). The card declares a ``pipeline_tag`` only where that
transformers pipeline runs on the folder (it holds the tokenizer or image processor the pipeline reads).
Nothing touches the network unless ``push_to`` names a repository.

The output folder is new, empty or an earlier export (replaced as a whole, unless its files were edited since: the
export's ``manifest.json`` records what it wrote), never the model folder or a folder holding other files; it is
written beside its final place and renamed into it when complete.
"""

import json
import logging
import shutil
from dataclasses import asdict
from importlib import resources
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError, HTTPError, LocalTokenNotFoundError, OfflineModeIsEnabled
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

from ..bench.table import format_table
from ..data.hub_access import PACKAGED_BUILDERS
from ..data.images import image_processor_for
from ..eval.harness import scores
from ..files import MANIFEST, edited_files, is_export, write_folder_whole, write_manifest
from ..measured import measured_speed
from ..modeling.errors import UserError
from ..modeling.transformers_compat import TESTED_TRANSFORMERS
from ..registry import ARCHITECTURES, TASKS, architecture, auto_map_for
from ..reproduce.ledger_tables import family_ledger
from ..training.checkpoints import RECIPE
from ..training.engines import Engine
from ..training.recipe import Recipe, read_recipe
from ..training.tasks import training_task
from .public import is_local_path, public_evaluations, public_recipe

logger = logging.getLogger(__name__)

SKIPPED_CONFIG_KEYS = {"auto_map", "architectures", "transformers_version", "id2label", "label2id", "dtype"}
# The file each preprocessor saves, which a pipeline reads from the folder.
PREPROCESSOR_FILES = {"tokenizer": "tokenizer_config.json", "image_processor": "preprocessor_config.json"}
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions")  # a language model's context, under transformers' names


def export_model(model, output_dir: str | Path, tokenizer=None) -> Path:
    """Save ``model`` (and ``tokenizer``) so that every Auto class its architecture supports can load the
    folder as remote code: safetensors weights, config.json with a full `auto_map`, the generation config
    and the modeling files (copied by transformers through `register_for_auto_class`)."""
    output_dir = Path(output_dir)
    model.config.auto_map = auto_map_for(model.config.model_type)
    model.save_pretrained(output_dir)
    if tokenizer is not None:
        # a model that generates takes batches padded on the left (`generate` continues each row's last token)
        padding_side = "left" if model.can_generate() else tokenizer.padding_side
        save_standard_tokenizer(tokenizer, model.config, output_dir, padding_side)
    return output_dir


def save_standard_tokenizer(tokenizer, config, output_dir: Path, padding_side: str = "right") -> None:
    """Save ``tokenizer`` as transformers' standard fast tokenizer (``"tokenizer_class": "PreTrainedTokenizerFast"``,
    the name every supported release loads without remote code), with ``model_max_length`` the model's context (so
    ``truncation=True`` truncates there) and none of the fields `from_pretrained` records about where it was loaded
    from (``is_local``, ``local_files_only``)."""
    context = next((getattr(config, name) for name in CONTEXT_FIELDS if getattr(config, name, None)), None)
    standard = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, **tokenizer.special_tokens_map,
                                       padding_side=padding_side, **({"model_max_length": context} if context else {}))
    standard.save_pretrained(output_dir)
    path = output_dir / "tokenizer_config.json"
    settings = json.loads(path.read_text())
    path.write_text(json.dumps({**settings, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2) + "\n")


def load_for_export(model_dir: Path):
    """(model, tokenizer or None, task) of a zoo model folder; the task is the one of the saved head. Read as the
    local folder it is (``local_files_only``): a folder removed while it is read, a checkpoint that a running
    training's rotation deleted, is said so in one line, not looked up on the Hub as a repository of that name."""
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        if config.model_type not in ARCHITECTURES:
            raise UserError(f"{model_dir} holds a {config.model_type!r} model; energyzoo exports "
                            f"{sorted(ARCHITECTURES)}")
        task, head = architecture(config.model_type).head(config.architectures)
        model = head.from_pretrained(model_dir, local_files_only=True)
        has_tokenizer = (model_dir / "tokenizer_config.json").exists()
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True) if has_tokenizer else None
    except OSError:
        if model_dir.is_dir():
            raise
        raise UserError(f"{model_dir} was removed while it was read (a running `energyzoo train` keeps its newest "
                        "training.save_total_limit checkpoints): export a newer checkpoint, or the final "
                        "model") from None
    return model, tokenizer, task


def hub_repository_id(name: str | None) -> str | None:
    """``name`` if it names a Hub repository, not a local path."""
    return None if not name or is_local_path(name) else name


def hub_dataset_id(name: str | None) -> str | None:
    """``name`` if it names a Hub dataset (not a `datasets` builder of local files, nor a local path)."""
    return None if name in PACKAGED_BUILDERS else hub_repository_id(name)


def _recipe(model_dir: Path) -> Recipe | None:
    """The recipe an `energyzoo train` run saved beside its model, read as a typed `Recipe` with its local paths
    reduced to their names (`public_recipe`: the card and the exported copy say nothing of this machine); None
    without one."""
    path = model_dir / RECIPE
    return public_recipe(read_recipe(path)) if path.exists() else None


def eval_results(model_dir: Path, recipe: Recipe | None, pipeline_tag: str) -> list[EvalResult]:
    """The card's model-index: results on Hub datasets, named by their Hub ids - the validation metrics of an
    `energyzoo train` run on a Hub source (``training_metrics.json``; the loss excepted) and every numeric metric of
    the lm-eval result files in ``model_dir/eval`` whose task reads a Hub dataset (lm-eval's ``dataset_path``, with
    its ``dataset_name`` as the config). Results on local or generated data stay in the card's tables."""
    results = []
    metrics_path = model_dir / "training_metrics.json"
    streamed = recipe and recipe.data.source.startswith("hf")
    source = hub_dataset_id(recipe.data.name) if streamed else None
    if source and metrics_path.exists():
        for key, value in json.loads(metrics_path.read_text()).items():
            if key.startswith("validation_") and key != "validation_loss":
                results.append(EvalResult(task_type=pipeline_tag, dataset_type=source, dataset_name=source,
                                          dataset_config=recipe.data.subset, dataset_split="validation",
                                          metric_type=key.removeprefix("validation_"), metric_value=value))
    for evaluation in public_evaluations(model_dir / "eval").values():
        for score in scores(evaluation):
            task_config = evaluation.get("configs", {}).get(score.task, {})
            dataset = hub_dataset_id(task_config.get("dataset_path"))
            if dataset is not None:
                results.append(EvalResult(
                    task_type=pipeline_tag, dataset_type=dataset, dataset_name=score.task,
                    dataset_config=task_config.get("dataset_name"), dataset_split=task_config.get("test_split"),
                    metric_type=score.metric, metric_value=score.value,
                    task_name=f"{score.task} ({evaluation.get('n-shot', {}).get(score.task, 0)}-shot, lm-eval)"))
    return results


def card_datasets(model_dir: Path, recipe: Recipe | None) -> list[str]:
    """The Hub ids of the datasets the model was trained or evaluated on."""
    names = []
    if recipe and recipe.data.source.startswith("hf"):
        names.append(recipe.data.name)
    for evaluation in public_evaluations(model_dir / "eval").values():
        names.extend(task.get("dataset_path") for task in evaluation["configs"].values())
    return sorted({hub_dataset_id(name) for name in names} - {None})


def _config_table(config) -> str:
    rows = ["| field | value |", "|---|---|"]
    for key, value in sorted(config.to_diff_dict().items()):
        if key not in SKIPPED_CONFIG_KEYS and isinstance(value, (int, float, str, bool, list)):
            rows.append(f"| `{key}` | `{value}` |")
    return "\n".join(rows)


def _training_data(model_dir: Path, recipe: Recipe | None, task: str) -> str:
    if recipe is None:
        return "No training recipe in the folder: the weights were initialised or trained outside `energyzoo train`."
    training = recipe.training
    data = {**asdict(recipe.data), "paths": ", ".join(recipe.data.paths)}  # names: `public_recipe` keeps no folders
    source = training_task(task).sources[recipe.data.source].format(**data)
    metrics_path = model_dir / "training_metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    validation = ", ".join(f"{key.removeprefix('validation_')} {value:.4f}" for key, value in metrics.items()
                           if key.startswith("validation_"))
    engine = Engine(**metrics["engine"]) if "engine" in metrics else None
    sharing = f" ({engine.describe()})" if engine and engine.world_size > 1 else ""  # how many processes, and how
    return (f"Trained with `energyzoo train`{sharing} on {source}: {training.steps} steps of {training.batch_size} "
            f"examples, AdamW lr {training.learning_rate}, weight decay {training.weight_decay}, seed "
            f"{training.seed}. The full recipe is `{RECIPE}` in this repository."
            + (f" Held-out validation at the end: {validation}." if validation else ""))


def _eval_table(model_dir: Path) -> str:
    tables, evaluations = [], public_evaluations(model_dir / "eval")
    for path in sorted((model_dir / "eval").glob("*.md")):
        settings = evaluations.get(path.with_suffix(".json"), {})
        config = settings.get("config", {})
        shots = ", ".join(f"{task} {shots}-shot" for task, shots in sorted(settings.get("n-shot", {}).items()))
        tables.append(f"Suite `{path.stem}` (lm-evaluation-harness {settings.get('lm_eval_version', '')}, "
                      f"`energyzoo eval`; {shots}; dtype {config.get('model_dtype')}, batch size "
                      f"{config.get('batch_size')}, device {config.get('device')}, limit {config.get('limit')}):"
                      f"\n\n{path.read_text().strip()}")
    if not tables:
        return "No evaluation results in the folder (run `energyzoo eval` before exporting)."
    return "\n\n".join(tables)


def _speed_table(recipe: Recipe | None, model_type: str) -> str:
    """The measured bench rows of the preset the model was trained from (its arms' labels start with the preset)."""
    preset = recipe.model.preset if recipe else None
    for result in measured_speed() if preset else []:
        rows = [row for row in result["rows"] if row["arm"].split(" ")[0] == preset]
        if rows:
            return (f"`energyzoo bench {model_type}`, this preset's rows:\n\n"
                    + format_table({"title": result["title"], "rows": rows, "notes": []}))
    if architecture(model_type).bench is None:
        return "Not benched yet: the architecture has no `energyzoo bench` entry."
    return (f"This model's preset{f' ({preset})' if preset else ''} was not timed: `energyzoo bench {model_type}` "
            f"times the architecture's bench presets against their baseline (energyzoo's docs/speed.md).")


def reference_differences(family: str) -> str:
    """The family's table of differences from its authors' public code (``<family>_reference_differences.md``
    here), or "" where there is none: one text for the model card and the family's docs page."""
    table = resources.files("energyzoo") / "export" / "templates" / f"{family}_reference_differences.md"
    return table.read_text().strip() if table.is_file() else ""


def runnable_pipeline(task: str, folder: Path) -> str | None:
    """The ``pipeline_tag`` of ``task`` if its transformers pipeline runs on ``folder``: the folder holds the
    tokenizer or image processor that pipeline reads (a model trained on token ids, such as a Sudoku or parity
    model, has no tokenizer). None otherwise, so the Hub offers no widget that would fail."""
    needs = TASKS[task].preprocessor
    return TASKS[task].pipeline_tag if needs and (Path(folder) / PREPROCESSOR_FILES[needs]).is_file() else None


def render_card(model, model_dir: Path, task: str, repo_id: str | None = None,
                exported: Path | None = None, name: str | None = None) -> ModelCard:
    """The model card from the architecture's template (registry: template name and its own facts), for the folder
    ``exported`` (default ``model_dir``) of the model in ``model_dir``."""
    return _card(model, model_dir, _recipe(model_dir), task, repo_id, exported, name)


def _card(model, model_dir: Path, recipe: Recipe | None, task: str, repo_id: str | None,
          exported: Path | None, name: str | None = None) -> ModelCard:
    """`render_card` with the folder's recipe read (once, by the caller)."""
    config = model.config
    model_type = config.model_type
    entry = architecture(model_type)
    folder = Path(model_dir).resolve()
    # `energyzoo train` writes runs/<name>/model: name the card after the run
    if name is None:
        name = repo_id.split("/")[-1] if repo_id else (folder.parent.name if folder.name == "model" else folder.name)
    pipeline_tag = runnable_pipeline(task, exported or model_dir)
    results = eval_results(model_dir, recipe, TASKS[task].pipeline_tag)
    language = recipe.data.language if recipe else None
    base_model = hub_repository_id(recipe.model.init_from) if recipe else None
    card_data = ModelCardData(library_name="transformers", pipeline_tag=pipeline_tag, license="apache-2.0",
                              tags=["energyzoo", model_type, "custom_code"], model_name=name, base_model=base_model,
                              datasets=card_datasets(model_dir, recipe) or None, language=language,
                              eval_results=results or None)
    variables = dict(
        model_name=name, model_type=model_type, architecture=type(model).__name__,
        auto_class=TASKS[task].auto_class.__name__, task_description=TASKS[task].description,
        repo_id=repo_id or "path/to/this/folder", parameters=f"{sum(p.numel() for p in model.parameters()):,}",
        config_table=_config_table(config), training_data=_training_data(model_dir, recipe, task),
        eval_table=_eval_table(model_dir), speed_table=_speed_table(recipe, model_type),
        reproduction_table=family_ledger(entry.family),
        reference_differences=reference_differences(entry.family),
        transformers_range=TESTED_TRANSFORMERS,
        **entry.card_facts(config),
    )
    template = resources.files("energyzoo") / "export" / "templates" / entry.card_template
    return ModelCard.from_template(card_data, template_str=template.read_text(), **variables)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def check_export_folder(model_dir: Path, output_dir: Path, overwrite: bool = False) -> bool:
    """Whether the export replaces an earlier one in ``output_dir``. Refused: an output folder that is, holds or lies
    in the model folder; one that holds files other than an earlier energyzoo export (which the export would replace,
    and push to the Hub with the model); and, unless ``overwrite``, an earlier export whose files were edited since
    it was written (its manifest says which), or that records no manifest to tell."""
    source, target = model_dir.resolve(), output_dir.resolve()
    if target == source or source in target.parents or target in source.parents:
        raise UserError(f"export writes a folder of its own: {output_dir} is, lies in or holds the model folder "
                         f"{model_dir}; choose another output folder")
    present = sorted(path.name for path in target.iterdir()) if target.is_dir() else [target.name] * target.exists()
    if not present:
        return False
    if not is_export(target):
        raise UserError(f"{output_dir} holds files that are not an energyzoo export ({_shown(present)}); export into "
                         "a new or empty folder")
    edited = edited_files(target)
    if edited and not overwrite:
        raise UserError(f"{output_dir} is an earlier export whose files were edited since it was written "
                        f"({_shown(edited)}): export elsewhere, or pass --overwrite to replace it with the edits")
    if edited is None and not overwrite:
        raise UserError(f"{output_dir} is an earlier export that records no {MANIFEST}, so edits to it cannot be "
                        "told: pass --overwrite to replace it")
    return True


def export_folder(model_dir: str | Path, output_dir: str | Path, push_to: str | None = None, api: HfApi | None = None,
                  private: bool = False, overwrite: bool = False, name: str | None = None) -> Path:
    """Write the Hub-ready folder of a trained zoo model, with the manifest of what it wrote (so that a later export
    into it can tell hand edits, `check_export_folder`); with ``push_to``, upload it (card included). The card is
    titled ``name`` (default: the repository's name, else the run's or the model folder's)."""
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    if check_export_folder(model_dir, output_dir, overwrite):
        logger.warning(f"replacing the earlier export in {output_dir}")
    model, tokenizer, task = load_for_export(model_dir)
    recipe = _recipe(model_dir)  # read once: the card, the image processor and the exported copy

    def write(folder: Path) -> None:
        export_model(model, folder, tokenizer)
        saved_processor = model_dir / PREPROCESSOR_FILES["image_processor"]
        if saved_processor.is_file():  # the model folder's own (a conversion's: the authors' test transform)
            shutil.copy(saved_processor, folder / saved_processor.name)
        elif task == "image-classification":
            image_processor_for(recipe.data if recipe else None, model.config).save_pretrained(folder)
        _card(model, model_dir, recipe, task, push_to, folder, name).save(folder / "README.md")
        if recipe is not None:
            (folder / RECIPE).write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        if (model_dir / "training_metrics.json").exists():
            shutil.copy(model_dir / "training_metrics.json", folder / "training_metrics.json")
        if (model_dir / "eval").exists():
            (folder / "eval").mkdir()
            for path, evaluation in public_evaluations(model_dir / "eval").items():
                (folder / "eval" / path.name).write_text(json.dumps(evaluation, indent=2))
            for table in sorted((model_dir / "eval").glob("*.md")):
                shutil.copy(table, folder / "eval" / table.name)
        write_manifest(folder)

    write_folder_whole(output_dir, write)
    if push_to is not None:
        message = f"Upload {type(model).__name__} exported by energyzoo"
        push_folder(output_dir, push_to, api or HfApi(), private, message)
    return output_dir


# What a push meets on the user's side: no network or offline mode, no or a wrong token, a repository id the Hub
# refuses (huggingface_hub's HTTPError is its HTTP client's base error, connection failures included).
PUSH_FAILURES = (HTTPError, OfflineModeIsEnabled, LocalTokenNotFoundError, HFValidationError)


def push_folder(folder: Path, repo_id: str, api: HfApi, private: bool, message: str) -> None:
    """Upload the complete ``folder`` to the Hub model repository ``repo_id`` (created if missing). A failure the
    user can fix is a one-line `UserError` saying why, and that the folder is complete and can be pushed again."""
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True, private=private)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=message)
    except PUSH_FAILURES as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"--push {repo_id} failed ({type(error).__name__}: {reason}); {folder} is complete: push it "
                        f"again with `hf upload {repo_id} {folder}` once the network and your token "
                        "(`hf auth login`) are in place") from error
