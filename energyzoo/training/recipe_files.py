"""The recipes shipped in `energyzoo/recipes/` and the accelerate configs in `energyzoo/recipes/accelerate/`, found
without importing torch or transformers (so that `energyzoo recipes` answers at once)."""

from importlib import resources
from pathlib import Path

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
