"""Configurations of TEL-GPT2, TEL-ViT and TEL-ResNet: the transformers GPT-2, ViT and ResNet configs plus
the TEL fields of `TELSettings` (tel.txt App. D, G.2) and `tel_placement`.

`tel_placement` says which blocks get a TEL layer (tel.txt G.4): "head" (the first block; TEL-head, the
paper's default), "full" (every block; TEL-full), or a list of block indices ([] gives the vanilla model).
Blocks are GPT-2/ViT transformer layers (TEL replaces the FFN's first linear map + activation) and ResNet
residual units counted across stages (TEL replaces the unit's first conv + norm + activation).
"""

from transformers import GPT2Config, ResNetConfig, ViTConfig

from .checks import check_derived_fields, check_transformers_fields, require, require_divisible, strict_config
from .tel_layer import TELSettings

PLACEMENTS = ("head", "full")
RESNET_LAYER_TYPES = ("basic", "bottleneck")


class TELPlacementMixin:
    """`tel_placement` resolution and validation; a config defines `tel_block_count`."""

    tel_placement: str | list[int]

    def __post_init__(self, **kwargs):
        kwargs.pop("model_type", None)  # a vanilla checkpoint's "gpt2" / "vit" / "resnet" must not stick
        check_transformers_fields(self)
        self.check_backbone_fields()
        self.check_tel_config()
        super().__post_init__(**kwargs)
        check_derived_fields(self)

    def check_backbone_fields(self) -> None:
        """What the transformers backbone needs of its fields beyond `checks.check_transformers_fields` (its own
        config checks neither)."""
        raise NotImplementedError

    @property
    def tel_block_count(self) -> int:
        raise NotImplementedError

    def tel_blocks(self) -> list[int]:
        """Indices of the blocks that get a TEL layer."""
        if self.tel_placement == "head":
            return [0]
        if self.tel_placement == "full":
            return list(range(self.tel_block_count))
        return sorted(self.tel_placement)

    def check_tel_config(self) -> None:
        """The TEL fields and the placement, once, from ``__post_init__`` (so a bad value raises the plain
        `ValueError` of `checks.require`; a ``validate_*`` name would make it a ``@strict`` class validator, whose
        errors huggingface_hub rewraps, and run it again at every save)."""
        self.check_tel_settings()
        placement = self.tel_placement
        count = self.tel_block_count
        valid = placement in PLACEMENTS if isinstance(placement, str) else (
            len(set(placement)) == len(placement) and all(0 <= index < count for index in placement))
        allowed = f"'head', 'full' or a list of distinct block indices in [0, {count})"
        require(type(self).__name__, valid, "tel_placement", allowed, placement)


@strict_config
class TELGPT2Config(TELPlacementMixin, GPT2Config, TELSettings):
    r"""GPT-2 with TEL layers in place of the FFN's c_fc + activation (tel.txt G.4.3), `model_type` "tel-gpt2".
    Every GPT-2 field keeps its meaning and default; the TEL fields are documented in `TELSettings`, with one
    default changed for a causal LM: ``tel_entropy_pooling="token"``."""

    model_type = "tel-gpt2"
    # `tel_tensor_parallel`: attention heads split (GPT-2's Conv1D styles), the FFN and its TEL layer whole
    base_model_tp_plan = {
        "wte": "embedding_rowwise",
        "h.*.attn.c_attn": "tel_gpt2_packed_qkv_colwise",
        "h.*.attn.c_proj": "tel_gpt2_conv1d_rowwise",
        "h.*.attn": "tel_gpt2_local_heads",
    }
    tel_placement: str | list[int] = "head"
    # A causal LM: entropy statistics per position, so no later token or other sequence changes an earlier
    # output in training (D.4's batch pooling would let the future in). Vision models keep "batch".
    tel_entropy_pooling: str = "token"

    @property
    def tel_block_count(self) -> int:
        return self.n_layer

    def check_backbone_fields(self) -> None:
        """GPT-2 splits n_embd over its heads."""
        require_divisible(type(self).__name__, self, "n_embd", "n_head")


@strict_config
class TELViTConfig(TELPlacementMixin, ViTConfig, TELSettings):
    r"""ViT with TEL layers in place of the MLP's fc1 + activation (tel.txt G.4.3), `model_type` "tel-vit"."""

    model_type = "tel-vit"
    tel_placement: str | list[int] = "head"

    @property
    def tel_block_count(self) -> int:
        return self.num_hidden_layers

    def check_backbone_fields(self) -> None:
        """ViT splits hidden_size over its heads and the image into whole patches."""
        owner = type(self).__name__
        require_divisible(owner, self, "hidden_size", "num_attention_heads")
        sizes = [self.image_size] * 2 if isinstance(self.image_size, int) else list(self.image_size)
        patches = [self.patch_size] * 2 if isinstance(self.patch_size, int) else list(self.patch_size)
        whole = len(sizes) == len(patches) == 2 and all(size % patch == 0 for size, patch in zip(sizes, patches))
        require(owner, whole, "patch_size", f"a divisor of image_size ({self.image_size}) on each side",
                self.patch_size)


@strict_config
class TELResNetConfig(TELPlacementMixin, ResNetConfig, TELSettings):
    r"""ResNet whose residual units' first conv + norm + activation become TEL layers (the anchor Wx is the
    conv followed by its norm), `model_type` "tel-resnet"."""

    model_type = "tel-resnet"
    tel_placement: str | list[int] = "head"

    @property
    def tel_block_count(self) -> int:
        return sum(self.depths)

    def check_backbone_fields(self) -> None:
        """ResNet's stages: one depth and one width each, and a known residual unit."""
        owner = type(self).__name__
        for field in ("depths", "hidden_sizes"):
            value = getattr(self, field)
            positive = value is not None and len(value) > 0 and all(isinstance(n, int) and n > 0 for n in value)
            require(owner, positive, field, "a non-empty list of positive integers (one per stage)", value)
        require(owner, len(self.depths) == len(self.hidden_sizes), "depths",
                f"one entry per stage of hidden_sizes ({len(self.hidden_sizes)} stages)", self.depths)
        require(owner, self.layer_type in RESNET_LAYER_TYPES, "layer_type", f"one of {list(RESNET_LAYER_TYPES)}",
                self.layer_type)
