"""The zoo catalogue: named models in `energyzoo/presets/*.json` (architecture config plus card facts).

    >>> from energyzoo import config_from_preset, model_from_preset
    >>> config = config_from_preset("fem-lm-340m")                # a FEMConfig
    >>> model = model_from_preset("fem-lm-tiny", vocab_size=512)  # an FEMForCausalLM, overrides applied
    >>> model = model_from_preset("tel-vit-tiny")                  # a TELViTForImageClassification
"""

import dataclasses
import json
from functools import cache
from importlib import resources

from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig

from ..modeling.errors import UserError, did_you_mean
from ..registry import TASKS


@cache
def _catalogue() -> dict[str, dict]:
    folder = resources.files(__package__)
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
        raise UserError(f"unknown preset {name!r}{did_you_mean(name, catalogue)} (every preset: energyzoo bench "
                        "--help)")
    return catalogue[name]


# Keyword arguments transformers' configs take that are no attribute of theirs.
CONFIG_KEYWORDS = ("attn_implementation", "experts_implementation")


def config_fields(config_class: type) -> list[str]:
    """The names a config class takes: its fields, their aliases (``attribute_map``) and its public properties that
    can be set (``num_labels``). Not its other class attributes (ResNet's list of ``layer_types``, say), which an
    override would only overwrite."""
    settable = {name for klass in config_class.__mro__ for name, value in vars(klass).items()
                if isinstance(value, property) and value.fset is not None and not name.startswith("_")}
    fields = {field.name for field in dataclasses.fields(config_class)}
    return sorted(fields | set(config_class.attribute_map) | settable | set(CONFIG_KEYWORDS))


def config_with_overrides(fields: dict, overrides: dict) -> PretrainedConfig:
    """``AutoConfig.for_model(**fields)`` with ``overrides`` applied, each of them a name the config class takes
    (`config_fields`): transformers' configs keep any unknown keyword as an attribute, so a misspelt override would
    otherwise build the default model without a word."""
    model_type = fields.get("model_type")
    if model_type in CONFIG_MAPPING:
        config_class = CONFIG_MAPPING[model_type]
        names = config_fields(config_class)
        for key in overrides:
            if key not in names:
                raise UserError(f"{config_class.__name__} has no field {key!r}{did_you_mean(key, names)}")
    return AutoConfig.for_model(**{**fields, **overrides})


def preset_config_fields(name: str) -> dict:
    """The config fields of a named preset, as its JSON gives them."""
    return dict(_entry(name)["config"])


def config_from_preset(name: str, **overrides) -> PretrainedConfig:
    """The config of a named preset, with field overrides (names the config does not have are refused)."""
    return config_with_overrides(preset_config_fields(name), overrides)


def model_from_preset(name: str, auto_class=None, **overrides):
    """A randomly initialised model of a named preset (use the `meta` device context to only count); the Auto
    class defaults to the one of the card's task (causal-lm, image-classification)."""
    auto_class = auto_class or TASKS[preset_card(name)["task"]].auto_class
    return auto_class.from_config(config_from_preset(name, **overrides))
