"""The recipes shipped in `energyzoo/configs/`, found without importing torch or transformers (so that
`energyzoo recipes` answers at once)."""

from importlib import resources
from pathlib import Path


def shipped_recipe_path(name: str) -> Path:
    """A recipe shipped in `energyzoo/configs/` by name (``fem-lm-tiny`` or ``fem-lm-tiny.yaml``)."""
    file = name if name.endswith(".yaml") else f"{name}.yaml"
    return Path(str(resources.files("energyzoo") / "configs" / file))


def shipped_recipes() -> dict[str, tuple[str, Path]]:
    """name -> (its header comment, the leading ``#`` lines joined, path) of every recipe in `energyzoo/configs/`."""
    recipes = {}
    for path in sorted(shipped_recipe_path("fem-lm-tiny").parent.glob("*.yaml")):
        if not path.stem.startswith("accelerate-"):
            lines = path.read_text().splitlines()
            header = lines[: next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))]
            recipes[path.stem] = (" ".join(line.lstrip("# ").strip() for line in header), path)
    return recipes
