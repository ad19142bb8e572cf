"""energyzoo: energy-based neural architectures as Hugging Face transformers models.

Importing the package registers every architecture with AutoConfig / AutoModel / AutoModelFor<Task>.
"""

from .modeling.configuration_fem import FEMConfig
from .modeling.modeling_fem import FEMForCausalLM, FEMModel, FEMPreTrainedModel
from .modeling.outputs import EnergyTrace
from .presets import config_from_preset, model_from_preset, preset_card, preset_names
from .registry import register_all

register_all()

__version__ = "0.1.0"
__all__ = [
    "EnergyTrace",
    "FEMConfig",
    "FEMForCausalLM",
    "FEMModel",
    "FEMPreTrainedModel",
    "config_from_preset",
    "model_from_preset",
    "preset_card",
    "preset_names",
]
