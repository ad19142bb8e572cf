"""energyzoo: energy-based neural architectures as Hugging Face transformers models.

Importing the package registers every architecture with AutoConfig / AutoModel / AutoModelFor<Task>. The public
names (each registered architecture's classes, and the shared names below) load on first use. The one exception is
the `energyzoo` command: it registers after parsing its arguments, so that `energyzoo --help` and argument errors
answer without importing torch.
"""

import importlib
import logging
import sys
from pathlib import Path

__version__ = "0.1.0"


def _not_torchaos_import_notices(record: logging.LogRecord) -> bool:
    """False for what torchao (the [quantization] extra) logs when it is imported on a CPU build of torch: a line per
    CUDA kernel library such a build cannot load, and torch's notice that torchao registers enums in a deprecated way.
    transformers imports torchao with every model, so each energyzoo command (a one-line error included) would
    otherwise begin with four lines no user can act on."""
    import torch

    message = record.getMessage()
    return not ((record.name == "torchao" and torch.version.cuda is None and message.startswith("Failed to load "))
                or "Calling register_constant() on Enum subclasses is deprecated" in message)


for _logger in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_logger).addFilter(_not_torchaos_import_notices)

# What energyzoo exports beside the architectures' own classes, which come from the registry (`_architecture_names`):
# a new architecture adds nothing here
_SHARED = {
    "export": ["export_folder", "export_model"],
    "convert.hyperset_original": ["load_hyperset_original"],
    "modeling.configuration_tel": ["TELSettings"],
    "modeling.errors": ["UserError", "UserTypeError"],
    "modeling.outputs": ["EnergyTrace"],
    "modeling.tel_layer": ["ThermodynamicEquilibriumLayer", "ThermodynamicRefinement"],
    "presets": ["config_from_preset", "model_from_preset", "preset_card", "preset_names"],
}
_MODULE_OF = {name: module for module, names in _SHARED.items() for name in names}


def _architecture_names() -> dict[str, type]:
    """Every registered architecture's config, base model, heads and the pretrained base class their module defines
    (the registry imports torch and every model: read on first use)."""
    from .registry import ARCHITECTURES

    names = {}
    for entry in ARCHITECTURES.values():
        base = entry.base_model.__mro__[1]
        bases = [base] if base.__module__ == entry.base_model.__module__ else []
        for cls in (entry.config_class, entry.base_model, *entry.heads.values(), *bases):
            names[cls.__name__] = cls
    return names


def __getattr__(name: str):
    if name == "__all__":
        value = sorted([*_MODULE_OF, *_architecture_names()])
    elif name in _MODULE_OF:
        value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    elif not name.startswith("__") and name in (architectures := _architecture_names()):
        value = architectures[name]
    else:
        raise AttributeError(f"module 'energyzoo' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__getattr__("__all__")])


def _run_as_the_command() -> bool:
    """Whether this process is the `energyzoo` console script (whose `__main__` is the script named energyzoo)."""
    main = sys.modules.get("__main__")
    return Path(getattr(main, "__file__", None) or "").stem in ("energyzoo", "energyzoo-script")


if not _run_as_the_command():
    from .registry import register_all

    register_all()
