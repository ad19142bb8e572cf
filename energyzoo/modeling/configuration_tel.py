"""Configurations of TEL-GPT2, TEL-ViT and TEL-ResNet: the transformers GPT-2, ViT and ResNet configs plus
the TEL fields of `TELSettings` (tel.txt App. D, G.2) and `tel_placement`.

`tel_placement` says which blocks get a TEL layer (tel.txt G.4): "head" (the first block; TEL-head, the
paper's default), "full" (every block; TEL-full), or a list of block indices ([] gives the vanilla model).
Blocks are GPT-2/ViT transformer layers (TEL replaces the FFN's first linear map + activation) and ResNet
residual units counted across stages (TEL replaces the unit's first conv + norm + activation).
"""

import math
from dataclasses import dataclass

from transformers import GPT2Config, ResNetConfig, ViTConfig

from .checks import check_derived_fields, check_transformers_fields, require, require_divisible, strict_config

# Lipschitz constants L_phi = sup |phi'| (Assumption A1), computed numerically for silu and exact gelu.
ACTIVATION_LIPSCHITZ = {"silu": 1.0998393, "gelu": 1.1289042, "relu": 1.0, "tanh": 1.0, "prelu": 1.0}
ENTROPY_ESTIMATORS = ("gaussian", "robust_gaussian", "laplace", "student_t", "mlp")
ENTROPY_POOLINGS = ("batch", "token")
EXIT_RULES = ("gradient", "energy")
STEP_SIZE_CEILING = 1.0  # eta_max of TEL eq. 31
PLACEMENTS = ("head", "full")
RESNET_LAYER_TYPES = ("basic", "bottleneck")


@dataclass
class TELSettings:
    r"""Hyper-parameters of a TEL layer; defaults are tel.txt's (App. D, G.2). TEL configs inherit these fields.

    tel_steps: K, refinement steps (G.2: 5).
    tel_activation: phi, the entropy force: "silu" (D.2 default), "gelu", "relu", "tanh" or "prelu" (slope
        learned, kept in [0, 1] so that L_phi = 1).
    tel_temperature: "global" (one tau per layer, default) or "channel" (one per output channel).
    tel_temperature_min: T_min (G.2: 0.05).
    tel_temperature_max: T_max; None means 1 / L_phi, the largest value with T_max L_phi <= 1 (eq. 32).
    tel_initial_temperature: T at initialisation, within [T_min, T_max].
    tel_step_size_min: lower clip of eta_i (eq. 31: 1e-4); the upper clip is min(1, 2 / (1 + T_max L_phi))
        (eq. 13), so every step is non-expansive (Prop. 2.1).
    tel_initial_step_size: eta_i at initialisation (eta_i = exp(learned), eq. 30).
    tel_estimator: entropy estimate s_hat (D.4, eq. 35): "gaussian" 1/2 log(var + eps) (default),
        "robust_gaussian" (sigma = 1.4826 MAD), "laplace" (1 + log 2b), "student_t" (closed form at
        `tel_student_t_dof`), or "mlp" (a tiny MLP on per-channel mean, log-variance and kurtosis).
    tel_estimator_hidden: hidden width of the MLP estimator (E: 16-64).
    tel_entropy_pooling: what the entropy statistics pool over: "batch" (D.4: batch and sequence/spatial axes,
        per channel) or "token" (the channels of each position alone: causal, batch-independent).
    tel_student_t_dof: degrees of freedom of the Student-t estimator (> 2).
    tel_entropy_ema_half_life: half-life in steps of the EMA of s_hat (G.2: 5); None disables it.
    tel_entropy_clip: S_max, |s_hat| <= S_max (Prop. C.6).
    tel_dual_step: alpha of eq. 9 (G.2 grid {5e-3, 1e-2, 2e-2}; default 1e-2).
    tel_entropy_scale, tel_entropy_shift: beta_1, beta_0 of g_beta(z) = beta_1 z + beta_0 (eq. 36: 1, 0).
    tel_adapt_at_inference: keep the dual update in eval mode (Algorithm 1 note iii); off by default.
    tel_early_exit: stop refining a position at inference once the exit rule held `tel_exit_patience` steps.
    tel_exit_rule: "gradient" (||g_G|| <= tol, default) or "energy" (|Delta G| <= tol; needs a closed-form
        S, i.e. not silu).
    tel_exit_tolerance: eps_grad / eps_G.
    tel_exit_patience: m (App. E: 1 or 2).
    """

    tel_steps: int = 5
    tel_activation: str = "silu"
    tel_temperature: str = "global"
    tel_temperature_min: float = 0.05
    tel_temperature_max: float | None = None
    tel_initial_temperature: float = 0.5
    tel_step_size_min: float = 1e-4
    tel_initial_step_size: float = 0.5
    tel_estimator: str = "gaussian"
    tel_estimator_hidden: int = 16
    tel_entropy_pooling: str = "batch"
    tel_student_t_dof: float = 5.0
    tel_entropy_ema_half_life: float | None = 5.0
    tel_entropy_clip: float = 10.0
    tel_dual_step: float = 1e-2
    tel_entropy_scale: float = 1.0
    tel_entropy_shift: float = 0.0
    tel_adapt_at_inference: bool = False
    tel_early_exit: bool = False
    tel_exit_rule: str = "gradient"
    tel_exit_tolerance: float = 1e-3
    tel_exit_patience: int = 2

    def __post_init__(self):
        self.check_tel_settings()

    @property
    def tel_lipschitz(self) -> float:
        return ACTIVATION_LIPSCHITZ[self.tel_activation]

    @property
    def tel_resolved_temperature_max(self) -> float:
        return self.tel_temperature_max if self.tel_temperature_max is not None else 1.0 / self.tel_lipschitz

    @property
    def tel_step_size_max(self) -> float:
        """min(1, 2 / (1 + T_max L_phi)): the design rule of TEL eq. 13."""
        return min(STEP_SIZE_CEILING, 2.0 / (1.0 + self.tel_resolved_temperature_max * self.tel_lipschitz))

    def check_tel_settings(self) -> None:
        """Every TEL field against its allowed range. (Not named ``validate_*``: TEL configs are ``@strict``
        dataclasses, whose ``validate_*`` methods all run as class validators; their one validator calls this.)"""
        owner = type(self).__name__

        def check(condition: bool, field: str, allowed: str) -> None:
            require(owner, condition, field, allowed, getattr(self, field))

        check(self.tel_steps >= 1, "tel_steps", ">= 1")
        check(self.tel_activation in ACTIVATION_LIPSCHITZ, "tel_activation", f"one of {sorted(ACTIVATION_LIPSCHITZ)}")
        check(self.tel_temperature in ("global", "channel"), "tel_temperature", "'global' or 'channel'")
        check(0 < self.tel_temperature_min < math.inf, "tel_temperature_min", "a finite number > 0")
        bound = 1.0 / self.tel_lipschitz
        check(self.tel_temperature_max is None
              or self.tel_temperature_min < self.tel_temperature_max <= bound + 1e-12,
              "tel_temperature_max", f"None or in (tel_temperature_min, 1/L_phi of tel_activation = {bound:.4g}] "
              "(eq. 32)")
        t_max = f"T_max = {self.tel_resolved_temperature_max:.4g} (tel_temperature_max, or 1/L_phi of tel_activation)"
        check(self.tel_temperature_min <= self.tel_initial_temperature <= self.tel_resolved_temperature_max,
              "tel_initial_temperature", f"in [tel_temperature_min, {t_max}]")
        eta_max = f"eta_max = {self.tel_step_size_max:.4g} (min(1, 2 / (1 + T_max L_phi)), eq. 13; {t_max})"
        check(0 < self.tel_step_size_min < self.tel_step_size_max, "tel_step_size_min", f"in (0, {eta_max})")
        check(self.tel_step_size_min <= self.tel_initial_step_size <= self.tel_step_size_max,
              "tel_initial_step_size", f"in [tel_step_size_min, {eta_max}]")
        check(self.tel_estimator in ENTROPY_ESTIMATORS, "tel_estimator", f"one of {list(ENTROPY_ESTIMATORS)}")
        check(self.tel_estimator_hidden >= 1, "tel_estimator_hidden", ">= 1")
        check(self.tel_entropy_pooling in ENTROPY_POOLINGS, "tel_entropy_pooling", f"one of {list(ENTROPY_POOLINGS)}")
        check(self.tel_student_t_dof > 2, "tel_student_t_dof", "> 2 (finite variance)")
        check(self.tel_entropy_ema_half_life is None or self.tel_entropy_ema_half_life > 0,
              "tel_entropy_ema_half_life", "None or > 0")
        check(self.tel_entropy_clip > 0, "tel_entropy_clip", "> 0")
        check(0 <= self.tel_dual_step < self.tel_step_size_max, "tel_dual_step",
              f"in [0, {eta_max}): the dual step must be slower than the primal one (§2.3)")
        check(math.isfinite(self.tel_entropy_scale) and self.tel_entropy_scale >= 0, "tel_entropy_scale",
              "a finite number >= 0 (g_beta must be monotone)")
        check(math.isfinite(self.tel_entropy_shift), "tel_entropy_shift", "finite")
        check(self.tel_exit_rule in EXIT_RULES, "tel_exit_rule", f"one of {list(EXIT_RULES)}")
        check(not (self.tel_exit_rule == "energy" and self.tel_activation == "silu"), "tel_exit_rule",
              "'gradient' with tel_activation='silu' (its entropy S has no closed form)")
        check(self.tel_exit_tolerance > 0, "tel_exit_tolerance", "> 0")
        check(self.tel_exit_patience >= 1, "tel_exit_patience", ">= 1")

    def tel_settings(self) -> "TELSettings":
        """These fields as a plain `TELSettings` (configs inherit the fields)."""
        return TELSettings(**{name: getattr(self, name) for name in TELSettings.__dataclass_fields__})


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
