"""The zoo catalogue: named models in `energyzoo/models/*.json` (architecture config plus card facts).

    >>> from energyzoo import config_from_preset, model_from_preset
    >>> config = config_from_preset("fem-lm-340m")                # a FEMConfig
    >>> model = model_from_preset("fem-lm-tiny", vocab_size=512)  # an FEMForCausalLM, overrides applied
    >>> model = model_from_preset("tel-vit-tiny")                  # a TELViTForImageClassification
"""

import json
from functools import cache
from importlib import resources

from transformers import AutoConfig, PretrainedConfig

from .registry import TASKS


@cache
def _catalogue() -> dict[str, dict]:
    folder = resources.files("energyzoo") / "models"
    entries = {}
    for path in folder.iterdir():
        if path.name.endswith(".json"):
            entries[path.name[: -len(".json")]] = json.loads(path.read_text())
    return entries


def preset_names() -> list[str]:
    return sorted(_catalogue())


def preset_card(name: str) -> dict:
    """Card facts of a preset: paper, task, size, baseline it is compared with."""
    return dict(_entry(name).get("card", {}))


def _entry(name: str) -> dict:
    catalogue = _catalogue()
    if name not in catalogue:
        raise ValueError(f"Unknown preset {name!r}; known presets: {', '.join(sorted(catalogue))}")
    return catalogue[name]


def config_from_preset(name: str, **overrides) -> PretrainedConfig:
    """The config of a named preset, with field overrides."""
    fields = {**_entry(name)["config"], **overrides}
    return AutoConfig.for_model(**fields)


def model_from_preset(name: str, auto_class=None, **overrides):
    """A randomly initialised model of a named preset (use the `meta` device context to only count); the Auto
    class defaults to the one of the card's task (causal-lm, image-classification)."""
    auto_class = auto_class or TASKS[preset_card(name)["task"]].auto_class
    return auto_class.from_config(config_from_preset(name, **overrides))
