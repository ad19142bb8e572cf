"""Registration of every zoo architecture with the transformers Auto classes and for remote code.

`ARCHITECTURES` is the single table of what the zoo contains: per `model_type`, the config class and the
model class for each Auto class it supports. Importing energyzoo registers all of them.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
)

from .modeling.configuration_fem import FEMConfig
from .modeling.configuration_tel import TELGPT2Config, TELResNetConfig, TELViTConfig
from .modeling.modeling_fem import FEMForCausalLM, FEMForSequenceClassification, FEMModel
from .modeling.modeling_tel import (
    TELGPT2LMHeadModel,
    TELGPT2Model,
    TELResNetForImageClassification,
    TELResNetModel,
    TELViTForImageClassification,
    TELViTModel,
)

ARCHITECTURES = {
    "fem": (FEMConfig, {AutoModel: FEMModel, AutoModelForCausalLM: FEMForCausalLM,
                        AutoModelForSequenceClassification: FEMForSequenceClassification}),
    "tel-gpt2": (TELGPT2Config, {AutoModel: TELGPT2Model, AutoModelForCausalLM: TELGPT2LMHeadModel}),
    "tel-vit": (TELViTConfig, {AutoModel: TELViTModel, AutoModelForImageClassification: TELViTForImageClassification}),
    "tel-resnet": (TELResNetConfig, {AutoModel: TELResNetModel,
                                     AutoModelForImageClassification: TELResNetForImageClassification}),
}


def register_all() -> None:
    for config_class, auto_models in ARCHITECTURES.values():
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class()
        for auto_class, model_class in auto_models.items():
            auto_class.register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_class.__name__)


def auto_map_for(model_type: str) -> dict[str, str]:
    """`config.auto_map` naming every Auto class the architecture supports (save_pretrained alone records
    only the saved class)."""
    config_class, auto_models = ARCHITECTURES[model_type]
    auto_map = {"AutoConfig": f"{config_class.__module__.rsplit('.', 1)[-1]}.{config_class.__name__}"}
    for auto_class, model_class in auto_models.items():
        auto_map[auto_class.__name__] = f"{model_class.__module__.rsplit('.', 1)[-1]}.{model_class.__name__}"
    return auto_map
