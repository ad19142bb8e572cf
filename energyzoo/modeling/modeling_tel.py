"""TEL-GPT2, TEL-ViT and TEL-ResNet: the transformers GPT-2, ViT and ResNet models with Thermodynamic
Equilibrium Layers at the insertion points of tel.txt G.4 (TEL-head / TEL-full / chosen blocks).

Each class subclasses the transformers model and, after building it, puts a `ThermodynamicRefinement` into
the activation slot that follows the linear map TEL anchors to:

- GPT-2: ``h[i].mlp.act`` after ``h[i].mlp.c_fc`` (the FFN's first linear map + activation);
- ViT: ``layers[i].mlp.activation_fn`` after ``mlp.fc1``;
- ResNet: the ``activation`` of a residual unit's first conv layer, after its convolution + normalisation
  (the anchor Wx is BN(conv(x)), an affine map at inference).

No weight is renamed, so these classes load vanilla checkpoints: the TEL parameters are initialised (one log
line says so) and with an empty `tel_placement` the model computes the vanilla one exactly. At inference the
temperature is frozen (TEL Algorithm 1 line 14), so TEL acts on each position alone and TEL-GPT2's KV cache,
padding and generation behave as GPT-2's (TEL-GPT2 also takes the positions of a left-padded batch from its
attention mask when no position ids are given, as `generate()` does).

Every forward takes ``refinement_steps=K`` (K of every TEL layer for that call; None: ``tel_steps``) and
``output_energies=True``, which returns an `EnergyTrace` with one entry per TEL layer (in block order) of
per-step diagnostics (tel.txt §3.4, App. H.7): ``temperature`` T_i, ``step_size`` eta_i, ``residual`` ||g_G||,
``enthalpy_entropy_ratio`` rho_i = ||g_H|| / ||T g_S||, ``gradient_alignment`` kappa_i = cos(g_H, T g_S),
``energy`` G and ``free_energy_change`` Delta G (activations whose entropy has a closed form), and
``iterations`` K_eff.
"""

import inspect

import torch
from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel, GPT2Model, GPT2PreTrainedModel
from transformers.models.resnet.modeling_resnet import (
    ResNetForImageClassification,
    ResNetModel,
    ResNetPreTrainedModel,
)
from transformers.models.vit.modeling_vit import ViTForImageClassification, ViTModel, ViTPreTrainedModel
from transformers.utils import logging

from .configuration_tel import TELGPT2Config, TELResNetConfig, TELViTConfig
from .outputs import records_energies
from .refinement import takes_refinement_steps
from .tel_layer import FP32_PARAMETERS, ThermodynamicRefinement

logger = logging.get_logger(__name__)

if torch.distributed.is_available():  # the styles TELGPT2Config's tensor-parallel plan names
    from .tel_tensor_parallel import register_tensor_parallel_styles

    register_tensor_parallel_styles()


def positions_from_attention_mask(arguments: dict) -> None:
    """Position ids of a left-padded batch from its 2-D attention mask (as `generate()` computes them), when
    the caller gave none: GPT-2 alone would count the pads, so a padded sequence would read shifted positions.
    The mask covers cached and new tokens, so this also holds for cached steps."""
    mask = arguments.get("attention_mask")
    if arguments.get("position_ids") is not None or mask is None or mask.dim() != 2:
        return
    tokens = arguments.get("input_ids")
    length = (tokens if tokens is not None else arguments["inputs_embeds"]).shape[1]
    arguments["position_ids"] = (mask.long().cumsum(-1) - 1).clamp_min(0)[:, -length:]


def forward_with_energies(vanilla_forward, prepare=None):
    """The vanilla model's forward plus the zoo's keywords: ``output_energies`` (default False; the output then
    carries the `EnergyTrace` its TEL layers record, `outputs.records_energies`) and ``refinement_steps`` (K of
    every TEL layer for this call, `refinement.takes_refinement_steps`). The signature is the vanilla one plus
    those keywords, so `generate()` and `Trainer` see the arguments they expect. `prepare(arguments)` may edit
    the bound arguments first."""
    signature = inspect.signature(vanilla_forward)

    def prepared(self, *args, **kwargs):
        if prepare is not None:
            bound = signature.bind(self, *args, **kwargs)
            prepare(bound.arguments)
            args, kwargs = bound.args[1:], bound.kwargs
        return vanilla_forward(self, *args, **kwargs)

    forward = records_energies(takes_refinement_steps(prepared))
    parameters = list(signature.parameters.values())
    keywords = [
        inspect.Parameter("output_energies", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=bool),
        inspect.Parameter("refinement_steps", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=int | None),
    ]
    position = next((i for i, p in enumerate(parameters) if p.kind is inspect.Parameter.VAR_KEYWORD), len(parameters))
    forward.__signature__ = signature.replace(parameters=[*parameters[:position], *keywords, *parameters[position:]])
    forward.__doc__ = vanilla_forward.__doc__
    return forward


def install_tel(blocks, slot, config) -> None:
    """Put an `ThermodynamicRefinement` into the activation slot of every block `config.tel_blocks()` names;
    `slot(block)` gives (module owning the activation, attribute name, anchor width, channel axis)."""
    for index in config.tel_blocks():
        owner, attribute, width, channel_dim = slot(blocks[index])
        setattr(owner, attribute, ThermodynamicRefinement(width, channel_dim, config))


def _gpt2_slot(block):
    return block.mlp, "act", block.mlp.c_fc.nf, -1


def _vit_slot(layer):
    return layer.mlp, "activation_fn", layer.mlp.fc1.out_features, -1


def _resnet_slot(unit):
    first = unit.layer[0]
    return first, "activation", first.convolution.out_channels, 1


def _resnet_units(resnet: ResNetModel) -> list:
    return [unit for stage in resnet.encoder.stages for unit in stage.layers]


class TELModelMixin:
    """What every TEL model adds to its transformers parent: loading a checkpoint without TEL parameters, and
    TEL's step sizes and log-temperature kept in fp32 when loading in half precision."""

    _keep_in_fp32_modules_strict = list(FP32_PARAMETERS)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`; from a checkpoint without TEL parameters (a vanilla GPT-2, ViT or
        ResNet) it maps the weights by their unchanged names, initialises the TEL layers and says so in one log
        line. (The TEL layers sit inside the vanilla sub-model transformers builds, whose `_init_weights` does
        not know them, so they are initialised here.)"""
        return_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        fresh = [key for key in info["missing_keys"] if ".tel_" in key]
        if fresh:
            initialised = []
            with torch.no_grad():
                for name, module in model.named_modules():
                    if isinstance(module, ThermodynamicRefinement) and any(key.startswith(f"{name}.") for key in fresh):
                        module.reset_parameters()
                        initialised.append(name)
            logger.warning(
                f"{cls.__name__}: the checkpoint has no parameters for {len(initialised)} of the TEL layers "
                f"(tel_placement={model.config.tel_placement!r}); initialised {', '.join(initialised)} "
                "(fine-tune before use)."
            )
        return (model, info) if return_info else model


class TELGPT2PreTrainedModel(TELModelMixin, GPT2PreTrainedModel):
    config_class = TELGPT2Config


class TELGPT2Model(TELGPT2PreTrainedModel, GPT2Model):
    """GPT-2 base model with TEL layers in the FFNs of `config.tel_blocks()`."""

    def __init__(self, config: TELGPT2Config):
        super().__init__(config)
        install_tel(self.h, _gpt2_slot, config)

    forward = forward_with_energies(GPT2Model.forward, prepare=positions_from_attention_mask)


class TELGPT2LMHeadModel(TELGPT2PreTrainedModel, GPT2LMHeadModel):
    """GPT-2 LM (tied head, KV cache, generate) with TEL layers in the FFNs of `config.tel_blocks()`."""

    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: TELGPT2Config):
        super().__init__(config)
        install_tel(self.transformer.h, _gpt2_slot, config)
        # The class name names no loss, and transformers would warn (breaking torch.compile graphs) per call.
        self.loss_type = "ForCausalLM"

    forward = forward_with_energies(GPT2LMHeadModel.forward, prepare=positions_from_attention_mask)


class TELViTPreTrainedModel(TELModelMixin, ViTPreTrainedModel):
    config_class = TELViTConfig


class TELViTModel(TELViTPreTrainedModel, ViTModel):
    """ViT encoder with TEL layers in the MLPs of `config.tel_blocks()`."""

    def __init__(self, config: TELViTConfig, add_pooling_layer: bool = True, use_mask_token: bool = False):
        super().__init__(config, add_pooling_layer=add_pooling_layer, use_mask_token=use_mask_token)
        install_tel(self.layers, _vit_slot, config)

    forward = forward_with_energies(ViTModel.forward)


class TELViTForImageClassification(TELViTPreTrainedModel, ViTForImageClassification):
    """ViT classifier with TEL layers in the MLPs of `config.tel_blocks()`."""

    def __init__(self, config: TELViTConfig):
        super().__init__(config)
        install_tel(self.vit.layers, _vit_slot, config)

    forward = forward_with_energies(ViTForImageClassification.forward)


class TELResNetPreTrainedModel(TELModelMixin, ResNetPreTrainedModel):
    config_class = TELResNetConfig


class TELResNetModel(TELResNetPreTrainedModel, ResNetModel):
    """ResNet backbone with TEL layers in the residual units of `config.tel_blocks()`."""

    def __init__(self, config: TELResNetConfig):
        super().__init__(config)
        install_tel(_resnet_units(self), _resnet_slot, config)

    forward = forward_with_energies(ResNetModel.forward)


class TELResNetForImageClassification(TELResNetPreTrainedModel, ResNetForImageClassification):
    """ResNet classifier with TEL layers in the residual units of `config.tel_blocks()`."""

    def __init__(self, config: TELResNetConfig):
        super().__init__(config)
        install_tel(_resnet_units(self.resnet), _resnet_slot, config)

    forward = forward_with_energies(ResNetForImageClassification.forward)
