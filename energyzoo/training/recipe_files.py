"""The recipes shipped in `energyzoo/recipes/` and the accelerate configs in `energyzoo/recipes/accelerate/`, found
without importing torch or transformers (so that `energyzoo recipes` answers at once)."""

import shutil
from importlib import resources
from pathlib import Path

import yaml

from ..modeling.errors import UserError, did_you_mean

RECIPES = Path(str(resources.files("energyzoo") / "recipes"))
ACCELERATE_CONFIGS = RECIPES / "accelerate"


def shipped_recipe_path(name: str) -> Path:
    """A recipe shipped in `energyzoo/recipes/` by name (``fem-lm-tiny`` or ``fem-lm-tiny.yaml``)."""
    return RECIPES / (name if name.endswith(".yaml") else f"{name}.yaml")


def shipped_recipes() -> dict[str, tuple[str, Path]]:
    """name -> (its header comment, the leading ``#`` lines joined, path) of every recipe in `energyzoo/recipes/`."""
    recipes = {}
    for path in sorted(RECIPES.glob("*.yaml")):
        lines = path.read_text().splitlines()
        header = lines[: next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))]
        recipes[path.stem] = (" ".join(line.lstrip("# ").strip() for line in header), path)
    return recipes


def recipe_file(path_or_name: str | Path) -> Path:
    """A recipe file, or a shipped recipe by name; else a `UserError` with the closest shipped name."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    path = shipped_recipe_path(str(path_or_name))
    if not path.is_file():
        raise UserError(f"no recipe file {str(path_or_name)!r} and no shipped recipe of that name"
                        f"{did_you_mean(path_or_name, shipped_recipes())} (every one: energyzoo recipes)")
    return path


def copy_recipe(name: str, folder: Path) -> list[Path]:
    """Copy the shipped recipe ``name`` and the example files its ``data.paths`` name into ``folder``, at the same
    relative places, so that the copy trains as it stands and its paths show where one's own files go; returns what
    was written. Nothing is overwritten."""
    source = recipe_file(name)
    if source.parent != RECIPES:
        raise UserError(f"--copy takes a shipped recipe's name (energyzoo recipes lists them), got {name!r}")
    paths = (yaml.safe_load(source.read_text()).get("data") or {}).get("paths") or []
    targets = [(source, folder / source.name)] + [(RECIPES / path, folder / path) for path in paths]
    if taken := [str(target) for _, target in targets if target.exists()]:
        raise UserError(f"--copy {name}: {', '.join(taken)} : there already; choose another folder with --to")
    for origin, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if origin.is_dir() else shutil.copyfile)(origin, target)
    return [target for _, target in targets]
