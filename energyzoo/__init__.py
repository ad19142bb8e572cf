"""energyzoo: energy-based neural architectures as Hugging Face transformers models.

Importing the package registers every architecture with AutoConfig / AutoModel / AutoModelFor<Task>.
"""

from .modeling.configuration_eer import EERConfig
from .modeling.configuration_eqt import EqTLlamaConfig
from .modeling.configuration_fem import FEMConfig
from .modeling.modeling_eer import EERForCausalLM, EERModel, EERPreTrainedModel
from .modeling.modeling_eqt import EqTLlamaForCausalLM, EqTLlamaModel
from .modeling.modeling_fem import FEMForCausalLM, FEMForSequenceClassification, FEMModel, FEMPreTrainedModel
from .modeling.configuration_hyperset import HyperSETConfig
from .modeling.modeling_hyperset import (
    HyperSETForImageClassification,
    HyperSETForMaskedImageModeling,
    HyperSETForTokenClassification,
    HyperSETModel,
)
from .modeling.configuration_tel import TELGPT2Config, TELResNetConfig, TELViTConfig
from .modeling.modeling_tel import (
    TELGPT2LMHeadModel,
    TELGPT2Model,
    TELResNetForImageClassification,
    TELResNetModel,
    TELViTForImageClassification,
    TELViTModel,
)
from .modeling.outputs import EnergyTrace
from .modeling.tel_layer import ThermodynamicRefinement, TELSettings, ThermodynamicEquilibriumLayer
from .presets import config_from_preset, model_from_preset, preset_card, preset_names
from .registry import register_all

register_all()

__version__ = "0.1.0"
__all__ = [
    "EERConfig",
    "EERForCausalLM",
    "EERModel",
    "EERPreTrainedModel",
    "EnergyTrace",
    "EqTLlamaConfig",
    "EqTLlamaForCausalLM",
    "EqTLlamaModel",
    "FEMConfig",
    "FEMForCausalLM",
    "FEMForSequenceClassification",
    "FEMModel",
    "FEMPreTrainedModel",
    "HyperSETConfig",
    "HyperSETForImageClassification",
    "HyperSETForMaskedImageModeling",
    "HyperSETForTokenClassification",
    "HyperSETModel",
    "ThermodynamicRefinement",
    "TELGPT2Config",
    "TELGPT2LMHeadModel",
    "TELGPT2Model",
    "TELResNetConfig",
    "TELResNetForImageClassification",
    "TELResNetModel",
    "TELSettings",
    "TELViTConfig",
    "TELViTForImageClassification",
    "TELViTModel",
    "ThermodynamicEquilibriumLayer",
    "config_from_preset",
    "model_from_preset",
    "preset_card",
    "preset_names",
]
