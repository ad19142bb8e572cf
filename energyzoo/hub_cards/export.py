"""Hub-ready folders: `energyzoo export MODEL_DIR OUT_DIR [--push REPO_ID]`.

The folder loads with `trust_remote_code=True` on a machine without energyzoo: safetensors weights, a
config whose `auto_map` names every Auto class the architecture supports, the modeling files (copied by
transformers through `register_for_auto_class`), the tokenizer, the generation config, and a model card
rendered from this folder's per-paper templates (`fem.md`, `tel.md`) with the evaluation results that
`energyzoo eval` left in ``MODEL_DIR/eval`` as `model-index` metadata. Nothing touches the network unless
``push_to`` names a repository.
"""

import json
import shutil
from importlib import resources
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from transformers import AutoConfig, AutoTokenizer

from ..registry import ARCHITECTURES, TASKS, architecture, auto_map_for
from ..training.tasks import training_task

SKIPPED_CONFIG_KEYS = {"auto_map", "architectures", "transformers_version", "id2label", "label2id", "dtype"}


def export_model(model, output_dir: str | Path, tokenizer=None) -> Path:
    """Save ``model`` (and ``tokenizer``) so that every Auto class its architecture supports can load the
    folder as remote code: safetensors weights, config.json with a full `auto_map`, the generation config
    and the modeling files (copied by transformers through `register_for_auto_class`)."""
    output_dir = Path(output_dir)
    model.config.auto_map = auto_map_for(model.config.model_type)
    model.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    return output_dir


def load_for_export(model_dir: Path):
    """(model, tokenizer or None, task) of a zoo model folder; the task is the one of the saved head."""
    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in ARCHITECTURES:
        raise ValueError(f"{model_dir} holds a {config.model_type!r} model; energyzoo exports {sorted(ARCHITECTURES)}")
    task, head = architecture(config.model_type).head(config.architectures)
    model = head.from_pretrained(model_dir)
    has_tokenizer = (model_dir / "tokenizer_config.json").exists()
    return model, AutoTokenizer.from_pretrained(model_dir) if has_tokenizer else None, task


def eval_results(model_dir: Path, pipeline_tag: str) -> list[EvalResult]:
    """The validation metrics of an `energyzoo train` run (``training_metrics.json``; the loss excepted) and every
    numeric metric of the lm-eval result files in ``model_dir/eval``, as `EvalResult`s."""
    results = []
    metrics_path, recipe_path = model_dir / "training_metrics.json", model_dir / "recipe.yaml"
    if metrics_path.exists() and recipe_path.exists():
        source = yaml.safe_load(recipe_path.read_text())["data"]["source"]
        for key, value in json.loads(metrics_path.read_text()).items():
            if key.startswith("validation_") and key != "validation_loss":
                results.append(EvalResult(task_type=pipeline_tag, dataset_type=source, dataset_name=source,
                                          dataset_split="validation", metric_type=key.removeprefix("validation_"),
                                          metric_value=value))
    for path in sorted((model_dir / "eval").glob("*.json")):
        for task, metrics in json.loads(path.read_text()).get("results", {}).items():
            for key, value in metrics.items():
                if "," in key and "_stderr" not in key and isinstance(value, (int, float)):
                    results.append(EvalResult(task_type=pipeline_tag, dataset_type=task, dataset_name=task,
                                              metric_type=key.split(",")[0], metric_value=float(value),
                                              task_name=f"{path.stem} suite"))
    return results


def _config_table(config) -> str:
    rows = ["| field | value |", "|---|---|"]
    for key, value in sorted(config.to_diff_dict().items()):
        if key not in SKIPPED_CONFIG_KEYS and isinstance(value, (int, float, str, bool, list)):
            rows.append(f"| `{key}` | `{value}` |")
    return "\n".join(rows)


def _training_data(model_dir: Path, task: str) -> str:
    recipe_path = model_dir / "recipe.yaml"
    if not recipe_path.exists():
        return "No training recipe in the folder: the weights were initialised or trained outside `energyzoo train`."
    recipe = yaml.safe_load(recipe_path.read_text())
    data, training = recipe["data"], recipe["training"]
    source = training_task(task).sources[data["source"]].format(**data)
    return (f"Trained with `energyzoo train` on {source}: {training['steps']} steps of {training['batch_size']} "
            f"examples, AdamW lr {training['learning_rate']}, weight decay {training['weight_decay']}, seed "
            f"{training['seed']}. The full recipe is `recipe.yaml` in this repository.")


def _eval_table(model_dir: Path) -> str:
    tables = [f"Suite `{path.stem}` (lm-evaluation-harness, `energyzoo eval`):\n\n{path.read_text().strip()}"
              for path in sorted((model_dir / "eval").glob("*.md"))]
    return "\n\n".join(tables) if tables else "No evaluation results in the folder (run `energyzoo eval` before exporting)."


def render_card(model, model_dir: Path, task: str, repo_id: str | None = None) -> ModelCard:
    """The model card from the architecture's template (registry: template name and its own facts)."""
    config = model.config
    model_type = config.model_type
    entry = architecture(model_type)
    folder = Path(model_dir).resolve()
    # `energyzoo train` writes runs/<name>/model: name the card after the run
    name = repo_id.split("/")[-1] if repo_id else (folder.parent.name if folder.name == "model" else folder.name)
    results = eval_results(model_dir, TASKS[task].pipeline_tag)
    card_data = ModelCardData(library_name="transformers", pipeline_tag=TASKS[task].pipeline_tag, license="apache-2.0",
                              tags=["energyzoo", model_type, "custom_code"], model_name=name,
                              eval_results=results or None)
    variables = dict(
        model_name=name, model_type=model_type, architecture=type(model).__name__,
        auto_class=TASKS[task].auto_class.__name__, task_description=TASKS[task].description,
        repo_id=repo_id or "path/to/this/folder", parameters=f"{sum(p.numel() for p in model.parameters()):,}",
        config_table=_config_table(config), training_data=_training_data(model_dir, task), eval_table=_eval_table(model_dir),
        **entry.card_facts(config),
    )
    template = resources.files("energyzoo") / "hub_cards" / entry.card_template
    return ModelCard.from_template(card_data, template_str=template.read_text(), **variables)


def export_folder(model_dir: str | Path, output_dir: str | Path, push_to: str | None = None, api: HfApi | None = None,
                  private: bool = False) -> Path:
    """Write the Hub-ready folder of a trained zoo model; with ``push_to``, upload it (card included)."""
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    model, tokenizer, task = load_for_export(model_dir)
    export_model(model, output_dir, tokenizer)
    render_card(model, model_dir, task, push_to).save(output_dir / "README.md")
    for extra in ("recipe.yaml", "training_metrics.json"):
        if (model_dir / extra).exists():
            shutil.copy(model_dir / extra, output_dir / extra)
    if (model_dir / "eval").exists():
        shutil.copytree(model_dir / "eval", output_dir / "eval", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("local_tasks"))
    if push_to is not None:
        api = api or HfApi()
        api.create_repo(push_to, repo_type="model", exist_ok=True, private=private)
        api.upload_folder(folder_path=str(output_dir), repo_id=push_to, repo_type="model",
                          commit_message=f"Upload {type(model).__name__} exported by energyzoo")
    return output_dir
