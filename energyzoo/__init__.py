"""energyzoo: energy-based neural architectures as Hugging Face transformers models.

Importing the package registers every architecture with AutoConfig / AutoModel / AutoModelFor<Task>. The public
names below load on first use. The one exception is the `energyzoo` command: it registers after parsing its
arguments, so that `energyzoo --help` and argument errors answer without importing torch.
"""

import importlib
import sys
from pathlib import Path

__version__ = "0.1.0"

_PUBLIC = {
    "modeling.errors": ["UserError", "UserTypeError"],
    "modeling.configuration_eer": ["EERConfig"],
    "modeling.configuration_eqt": ["EqTLlamaConfig"],
    "modeling.configuration_fem": ["FEMConfig"],
    "modeling.configuration_hyperset": ["HyperSETConfig"],
    "modeling.configuration_tel": ["TELGPT2Config", "TELResNetConfig", "TELViTConfig"],
    "modeling.modeling_eer": ["EERForCausalLM", "EERModel", "EERPreTrainedModel"],
    "modeling.modeling_eqt": ["EqTLlamaForCausalLM", "EqTLlamaModel"],
    "modeling.modeling_fem": ["FEMForCausalLM", "FEMForSequenceClassification", "FEMModel", "FEMPreTrainedModel"],
    "modeling.modeling_hyperset": ["HyperSETForImageClassification", "HyperSETForMaskedImageModeling",
                                   "HyperSETForTokenClassification", "HyperSETModel"],
    "modeling.modeling_tel": ["TELGPT2LMHeadModel", "TELGPT2Model", "TELResNetForImageClassification", "TELResNetModel",
                              "TELViTForImageClassification", "TELViTModel"],
    "modeling.outputs": ["EnergyTrace"],
    "modeling.tel_layer": ["TELSettings", "ThermodynamicEquilibriumLayer", "ThermodynamicRefinement"],
    "presets": ["config_from_preset", "model_from_preset", "preset_card", "preset_names"],
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'energyzoo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


def _run_as_the_command() -> bool:
    """Whether this process is the `energyzoo` console script (whose `__main__` is the script named energyzoo)."""
    main = sys.modules.get("__main__")
    return Path(getattr(main, "__file__", None) or "").stem in ("energyzoo", "energyzoo-script")


if not _run_as_the_command():
    from .registry import register_all

    register_all()
