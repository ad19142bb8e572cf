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
from contextlib import contextmanager, nullcontext

import torch
from transformers import GenerationMixin
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel, GPT2Model, GPT2PreTrainedModel
from transformers.models.resnet.modeling_resnet import (
    ResNetForImageClassification,
    ResNetModel,
    ResNetPreTrainedModel,
)
from transformers.models.vit.modeling_vit import ViTForImageClassification, ViTModel, ViTPreTrainedModel
from transformers.utils import logging

from .configuration_tel import TELGPT2Config, TELResNetConfig, TELViTConfig
from .inputs import (
    CausalLMLossMixin,
    cached_tokens,
    check_classifier_labels,
    check_labels,
    check_pixel_values,
    check_token_inputs,
    refuse_input,
    values_checked,
)
from .outputs import records_energies
from .positions import positions_from_mask
from .refinement import takes_refinement_steps
from .tel_layer import FP32_PARAMETERS, ThermodynamicRefinement
from .transformers_compat import CACHE_FIELD, takes_cache

logger = logging.get_logger(__name__)

if torch.distributed.is_available():  # the styles TELGPT2Config's tensor-parallel plan names
    from .tel_tensor_parallel import register_tensor_parallel_styles

    register_tensor_parallel_styles()


def gpt2_inputs(arguments: dict) -> None:
    """The zoo's checks of GPT-2's inputs (`inputs.check_token_inputs`, the LM head's labels), then the position ids
    of a left-padded batch from its 2-D attention mask (as `generate()` computes them), when the caller gave none:
    GPT-2 alone would count the pads, so a padded sequence would read shifted positions. The mask covers cached and
    new tokens, so this also holds for cached steps."""
    model, mask = arguments["self"], arguments.get("attention_mask")
    owner, config = type(model).__name__, model.config
    cache = arguments.get(CACHE_FIELD)
    check_token_inputs(owner, arguments.get("input_ids"), arguments.get("inputs_embeds"), mask,
                       model.get_input_embeddings().num_embeddings, config.n_embd, cache)
    tokens = arguments.get("input_ids")
    name, tokens = ("input_ids", tokens) if tokens is not None else ("inputs_embeds", arguments["inputs_embeds"])
    if values_checked():
        total = tokens.shape[1] + cached_tokens(cache)
        refuse_input(owner, total <= config.n_positions, name, f"at most n_positions={config.n_positions} tokens, the "
                     "cached ones included (GPT-2's learned positions)", f"{total} tokens")
    check_labels(owner, arguments.get("labels"), config.vocab_size, tokens.shape[:2])
    if arguments.get("position_ids") is not None or mask is None or mask.dim() != 2:
        return
    arguments["position_ids"] = positions_from_mask(mask, tokens.shape[1])


def vit_inputs(arguments: dict) -> None:
    """The zoo's checks of ViT's inputs: images of the configured channels and size (any size of at least a patch
    with ``interpolate_pos_encoding``), class labels."""
    model = arguments["self"]
    owner, config, pixel_values = type(model).__name__, model.config, arguments.get("pixel_values")
    size = None if arguments.get("interpolate_pos_encoding") else config.image_size
    check_pixel_values(owner, pixel_values, config.num_channels, size, smallest=config.patch_size)
    check_classifier_labels(owner, arguments.get("labels"), config, len(pixel_values))


def resnet_inputs(arguments: dict):
    """The zoo's checks of ResNet's inputs: images of the configured channels (any size; in training, enough pixels
    or images that the last stage's BatchNorm sees more than one value per channel), class labels. Returns the
    context the forward runs in: oneDNN off for bfloat16 images on the CPU with a side narrower than the network's
    total stride, where torch's oneDNN bfloat16 convolutions return wrong values (a 16 x 1 image came out NaN;
    pytorch/pytorch#163347): PyTorch's own convolutions then run instead."""
    model = arguments["self"]
    owner, config, pixel_values = type(model).__name__, model.config, arguments.get("pixel_values")
    check_pixel_values(owner, pixel_values, config.num_channels)
    pixel_values = arguments["pixel_values"] = pixel_values.to(model.dtype)  # any float images, as ViT takes them
    # the stem halves the image twice, every later stage (the first too, with downsample_in_first_stage) once
    stride = 2 ** (1 + len(config.depths) + int(config.downsample_in_first_stage))
    batch, _, height, width = pixel_values.shape
    values = batch * -(-height // stride) * -(-width // stride)
    refuse_input(owner, not model.training or values > 1, "pixel_values", "in training, 2+ images or images of "
                 f"more than {stride} pixels a side (BatchNorm's statistics need 2+ values per channel)",
                 f"shape {tuple(pixel_values.shape)}")
    check_classifier_labels(owner, arguments.get("labels"), config, batch)
    if pixel_values.device.type == "cpu" and pixel_values.dtype == torch.bfloat16 and min(height, width) < stride:
        return onednn_off()
    return None


@contextmanager
def onednn_off():
    """torch's own CPU kernels instead of oneDNN's for the block (`torch.backends.mkldnn.flags` would also set, and
    warn about, TF32 on Intel GPUs)."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


def forward_with_energies(vanilla_forward, prepare):
    """The vanilla model's forward plus the zoo's keywords: ``output_energies`` (default False; the output then
    carries the `EnergyTrace` its TEL layers record, `outputs.records_energies`) and ``refinement_steps`` (K of
    every TEL layer for this call, `refinement.takes_refinement_steps`). The signature is the vanilla one plus
    those keywords, so `generate()` and `Trainer` see the arguments they expect. `prepare(arguments)` checks (and
    may edit) the bound arguments, ``self`` among them, first, and may return a context for the vanilla forward."""
    signature = inspect.signature(vanilla_forward)

    def prepared(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        with prepare(bound.arguments) or nullcontext():
            return vanilla_forward(self, *bound.args[1:], **bound.kwargs)

    prepared.__signature__ = signature  # what `takes_cache` reads: the vanilla cache argument and keywords
    forward = records_energies(takes_refinement_steps(takes_cache(prepared)))
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

    forward = forward_with_energies(GPT2Model.forward, prepare=gpt2_inputs)


class TELGPT2LMHeadModel(CausalLMLossMixin, TELGPT2PreTrainedModel, GPT2LMHeadModel, GenerationMixin):
    """GPT-2 LM (tied head, KV cache, generate) with TEL layers in the FFNs of `config.tel_blocks()`."""

    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: TELGPT2Config):
        super().__init__(config)
        install_tel(self.transformer.h, _gpt2_slot, config)
        # The class name names no loss, and transformers would warn (breaking torch.compile graphs) per call.
        self.loss_type = "ForCausalLM"

    forward = forward_with_energies(GPT2LMHeadModel.forward, prepare=gpt2_inputs)


class TELViTPreTrainedModel(TELModelMixin, ViTPreTrainedModel):
    config_class = TELViTConfig


class TELViTModel(TELViTPreTrainedModel, ViTModel):
    """ViT encoder with TEL layers in the MLPs of `config.tel_blocks()`."""

    def __init__(self, config: TELViTConfig, add_pooling_layer: bool = True, use_mask_token: bool = False):
        super().__init__(config, add_pooling_layer=add_pooling_layer, use_mask_token=use_mask_token)
        install_tel(self.layers, _vit_slot, config)

    forward = forward_with_energies(ViTModel.forward, prepare=vit_inputs)


# A ViT classifier's folder (a vanilla or a TEL one) holds ViT's checkpoint names (vit.encoder.layer.N.attention.
# attention.query), which transformers renames onto ViTModel's modules for its own classes only: a class outside
# transformers gets the renaming where it registers it. (The classifier's `vit` is transformers' own ViTModel.)
register_checkpoint_conversion_mapping("TELViTModel", get_checkpoint_conversion_mapping("ViTModel"), overwrite=True)


class TELViTForImageClassification(TELViTPreTrainedModel, ViTForImageClassification):
    """ViT classifier with TEL layers in the MLPs of `config.tel_blocks()`."""

    def __init__(self, config: TELViTConfig):
        super().__init__(config)
        install_tel(self.vit.layers, _vit_slot, config)

    forward = forward_with_energies(ViTForImageClassification.forward, prepare=vit_inputs)


class TELResNetPreTrainedModel(TELModelMixin, ResNetPreTrainedModel):
    config_class = TELResNetConfig


class TELResNetModel(TELResNetPreTrainedModel, ResNetModel):
    """ResNet backbone with TEL layers in the residual units of `config.tel_blocks()`."""

    def __init__(self, config: TELResNetConfig):
        super().__init__(config)
        install_tel(_resnet_units(self), _resnet_slot, config)

    forward = forward_with_energies(ResNetModel.forward, prepare=resnet_inputs)


class TELResNetForImageClassification(TELResNetPreTrainedModel, ResNetForImageClassification):
    """ResNet classifier with TEL layers in the residual units of `config.tel_blocks()`."""

    def __init__(self, config: TELResNetConfig):
        super().__init__(config)
        install_tel(_resnet_units(self.resnet), _resnet_slot, config)

    forward = forward_with_energies(ResNetForImageClassification.forward, prepare=resnet_inputs)
