"""Configuration of Hyper-SET, the hyperspherical energy transformer (hyperset.txt)."""

import math

from transformers import PreTrainedConfig

from .checks import check_derived_fields, check_transformers_fields, require, require_divisible, strict_config

OWNER = "HyperSETConfig"
CHOICES = {
    "layer_type": ("hyperset", "transformer"),
    "hidden_act": ("relu", "gelu"),
    "attention_type": ("bisoftmax", "sigmoid", "linear"),
    "ff_type": ("standard", "softmax", "gated"),
    "qkv_norm": ("shared", "separate"),
    "step_size_mode": ("learned", "fixed"),
    "step_condition": ("input", "current"),
    "linear_attention_scale": ("head_dim", "tokens"),
    "update_mode": ("gd", "momentum", "rmsprop", "rmsprop_momentum", "adam"),
    "step_zero_init": ("all", "output"),
    "input_type": ("patches", "tokens"),
    "position_embedding_type": ("sinusoidal", "learned", "sincos2d"),
}


@strict_config
class HyperSETConfig(PreTrainedConfig):
    r"""Configuration of a Hyper-SET model: L distinct layers, each applied R times, each iteration one step of
    alternating descent on E = E_ATTN + E_FF on the hypersphere (hyperset.txt eq. 6, 9, 11).

    Defaults are the paper's image-classification "Small-Scale-up" model (Table 13: d = 512, 8 heads, M = d,
    R = 12, time embedding 512) on 32-pixel images with 4-pixel patches. Where the paper and its public code
    differ, each choice is a field here, with the reason:

    Core:
        hidden_size: d. num_attention_heads: H (head width p = d / H). intermediate_size: M, the width of D.
        num_hidden_layers: L, distinct layers. num_iterations: R, iterations per layer; ``refinement_steps=R'`` in
            `forward` evaluates the same weights at R' iterations (test-time scaling, Fig. 3b).
        layer_type: "hyperset" (the energy layer) or "transformer": the paper's Transformer baseline (§5: one
            pre-norm RMSNorm layer without biases, MLP width `intermediate_size`, iterated R times like Hyper-SET,
            `hyperset_layer.TransformerBaselineLayer`), with the same embeddings, heads and test-time scaling; the
            step-size and LoRA fields are Hyper-SET's and must stay off (step_size_mode "fixed", lora_rank 0).
        hidden_act: the feed-forward nonlinearity, "relu" (eq. 5, 11; the paper) or "gelu" (the IC code's).
            The traced E_FF is always the ReLU energy of eq. 5, as in the paper's Fig. 5.
        attention_type: "bisoftmax" (eq. 9), or App. G.1's alternative energies: "sigmoid" (weights
            sigma(A)(1 - sigma(A))) and "linear" (phi = sigmoid: phi'(q) * (phi(v) phi(q)^T phi(k) * s), O(N)).
        linear_attention_scale: s of the "linear" attention: "head_dim" (1 / sqrt(p), App. G.1 Table 19 and the IC
            code) or "tokens" (1 / sqrt(N), the token count: the public MaskGIT code's).
        ff_type: "standard" (eq. 11 with `hidden_act`), or App. G.1's "softmax" (D softmax(RMSNorm(D^T x))) and
            "gated" (D [(sum_m phi(h_m)) phi'(h)], phi = sigmoid).
        qkv_norm: RMSNorm gains on the per-head projections: "shared" (one gain, eq. 8; Sudoku and MIM code)
            or "separate" (query, key and value gains; the IC code).
        rms_norm_eps: epsilon of every RMSNorm; None is torch's default (the code's).
    Step sizes (eq. 12, App. D.1):
        step_size_mode: "learned" (the step-size network) or "fixed" (alpha = gamma = `fixed_step_size`,
            Table 4's ablation).
        step_condition: what the network conditions on beside t: "input" (x(0), eq. 12; Sudoku, MIM) or
            "current" (x_t, the IC code's Tables 10/12 "X_t").
        step_condition_rmsnorm: an RMSNorm (with a gain) on the condition before it is added to c_t. None pairs
            them as the public code's defaults do: x(0) raw (Sudoku, MIM) and RMSNorm(x_t) (IC). True with "input"
            is the IC code's ``input_cond=True``; False with "current" the Sudoku code's ``input_cond=False``.
        step_head_per_layer: one step-size head (RMSNorm on the condition, [RMSNorm,] GELU, Linear) per layer,
            inside the layer, sharing c_t: the public IC code's alternative-attention and alternative-feedforward
            models. False (the paper's Fig. 7): one head shared by the layers.
        time_embed_dim: width of the sinusoidal embedding of t fed to an MLP (512, Table 6); 0 uses the raw
            sinusoid of width d with no MLP (MIM, App. D.4).
        step_net_rmsnorm: RMSNorms inside the t-path MLP (IC code). step_head_rmsnorm: an RMSNorm before the
            head's GELU (IC "Basic" and MIM code).
        step_zero_init: "all" zero-initialises every Linear of the network (the paper's ReZero init; the code's):
            the model starts as the identity, and the t-path then never receives a gradient (its second Linear sees only
            zeros), so the steps depend on the conditioning only. "output" zero-initialises the last Linear alone, so t
            matters (on 4x4 Sudoku it trained worse when measured: board accuracy 0.09 against 0.97, same seed).
    Update rule (the public code's ``adaptive_mode``; the paper describes only "gd"):
        update_mode: how each half-step turns its descent direction g (the attention or feed-forward term of eq. 9,
            11) into the update that alpha or gamma scales, with running statistics kept per layer and half-step,
            restarting at t = 1 for each layer: "gd" (g itself, eq. 9, 11), "momentum" (b = mu b + g),
            "rmsprop" (v = eta v + (1 - eta) g^2; g / (sqrt(v) + eps)), "rmsprop_momentum" (b = mu b +
            g / (sqrt(v) + eps)) or "adam" (m = mu m + (1 - mu) g, bias-corrected m / (sqrt(v^) + eps)). The
            code's comment: they "perform worse than gd" in preliminary tests.
        update_momentum: mu (0.9, the code's). update_second_moment_decay: eta; None is the code's 0.8 for
            RMSProp and 0.96 for Adam. update_eps: eps (1e-6, the code's).
        fixed_feedforward_step_size: gamma with step_size_mode "fixed"; None uses fixed_step_size (the MaskGIT
            code's fixed-step update modes use alpha = 0.5, gamma = 0.1).
    Depth-wise LoRA (App. G.2): lora_rank r > 0 adds per-iteration low-rank updates W + s A_r B_r and
        D + s A'_r B'_r shared by the layers, s = lora_alpha / lora_rank (None: s = 4, the paper's).
    Inputs:
        input_type: "patches" (images: patch embedding LN-Linear-LN, the IC code) or "tokens" (ids: Sudoku
            digits, MaskGIT visual tokens). image_size, patch_size (pixels: the paper's "patch size 8" is 8
            patches per side, i.e. 4 pixels at 32 px), num_channels, use_cls_token (a CLS token in front).
        position_embedding_type: "sinusoidal" (fixed 1-D, IC), "learned" (Sudoku: "vital for extrapolation"),
            "sincos2d" (fixed 2-D over the patch grid, or the square grid of max_position_embeddings cells; MIM, and
            the Sudoku code's "sincos"; a CLS token gets zeros, MAE's convention). max_position_embeddings: token
            positions (81 for 9x9 Sudoku, 256 for a 16x16 code grid). embedding_dropout: after the embedding (0.1
            in the Sudoku code).
        vocab_size: token ids (Sudoku 10, MaskGIT codebook_size + 1); codebook_size: visual tokens the MIM head
            predicts; mask_token_id: the MIM mask token (the paper's is codebook_size, with
            vocab_size = codebook_size + 1).
    """

    model_type = "hyperset"

    hidden_size: int = 512
    num_attention_heads: int = 8
    intermediate_size: int = 512
    num_hidden_layers: int = 1
    num_iterations: int = 12
    layer_type: str = "hyperset"
    hidden_act: str = "relu"
    attention_type: str = "bisoftmax"
    linear_attention_scale: str = "head_dim"
    ff_type: str = "standard"
    qkv_norm: str = "shared"
    rms_norm_eps: float | None = None
    step_size_mode: str = "learned"
    fixed_step_size: float = 0.1
    step_condition: str = "input"
    step_condition_rmsnorm: bool | None = None
    step_head_per_layer: bool = False
    time_embed_dim: int = 512
    step_net_rmsnorm: bool = False
    step_head_rmsnorm: bool = False
    step_zero_init: str = "all"
    update_mode: str = "gd"
    update_momentum: float = 0.9
    update_second_moment_decay: float | None = None
    update_eps: float = 1e-6
    fixed_feedforward_step_size: float | None = None
    lora_rank: int = 0
    lora_alpha: int | float | None = None
    initializer_range: float = 0.02
    input_type: str = "patches"
    image_size: int = 32
    patch_size: int = 4
    num_channels: int = 3
    use_cls_token: bool = True
    position_embedding_type: str = "sinusoidal"
    max_position_embeddings: int = 81
    embedding_dropout: float = 0.0
    vocab_size: int = 10
    codebook_size: int = 1024
    mask_token_id: int | None = None

    def __post_init__(self, **kwargs):
        check_transformers_fields(self)
        self._check_hyperset_fields()
        super().__post_init__(**kwargs)
        check_derived_fields(self)

    def _check_hyperset_fields(self) -> None:
        """Every field against its range, once, from ``__post_init__`` (`checks.require`)."""
        for field in ("num_iterations", "codebook_size"):
            value = getattr(self, field)
            require(OWNER, value > 0, field, "a positive integer", value)
        for field, allowed in CHOICES.items():
            require(OWNER, getattr(self, field) in allowed, field, f"one of {list(allowed)}", getattr(self, field))
        require_divisible(OWNER, self, "hidden_size", "num_attention_heads")
        require(OWNER, self.time_embed_dim >= 0 and self.time_embed_dim % 2 == 0, "time_embed_dim",
                "an even integer >= 0", self.time_embed_dim)
        require(OWNER, self.time_embed_dim > 0 or self.hidden_size % 2 == 0, "hidden_size",
                "even when time_embed_dim = 0 (the raw sinusoid has width hidden_size)", self.hidden_size)
        require(OWNER, self.lora_rank >= 0, "lora_rank", "an integer >= 0", self.lora_rank)
        if self.layer_type == "transformer":  # its layer has no step sizes and no W, D for the LoRA to update
            require(OWNER, self.step_size_mode == "fixed", "step_size_mode", "'fixed' with layer_type='transformer'",
                    self.step_size_mode)
            require(OWNER, self.lora_rank == 0, "lora_rank", "0 with layer_type='transformer'", self.lora_rank)
        if self.layer_type == "transformer":
            require(OWNER, self.update_mode == "gd", "update_mode", "'gd' with layer_type='transformer'",
                    self.update_mode)
        require(OWNER, not self.step_head_per_layer or self.step_size_mode == "learned", "step_head_per_layer",
                "False with step_size_mode='fixed' (there is no step-size network)", self.step_head_per_layer)
        require(OWNER, 0 <= self.update_momentum < 1, "update_momentum", "in [0, 1)", self.update_momentum)
        decay = self.update_second_moment_decay
        require(OWNER, decay is None or 0 <= decay < 1, "update_second_moment_decay", "None or in [0, 1)", decay)
        require(OWNER, self.lora_alpha is None or self.lora_alpha > 0, "lora_alpha", "None or > 0", self.lora_alpha)
        require(OWNER, self.image_size % self.patch_size == 0, "patch_size",
                f"a divisor of image_size ({self.image_size})", self.patch_size)
        if self.position_embedding_type == "sincos2d":
            side = math.isqrt(self.max_position_embeddings)
            require(OWNER, self.input_type == "patches" or side * side == self.max_position_embeddings,
                    "max_position_embeddings",
                    "a square grid (side * side) for position_embedding_type='sincos2d'", self.max_position_embeddings)
            require(OWNER, self.hidden_size % 4 == 0, "hidden_size",
                    "divisible by 4 for position_embedding_type='sincos2d'", self.hidden_size)
        mask = self.mask_token_id
        require(OWNER, mask is None or 0 <= mask < self.vocab_size, "mask_token_id",
                f"None or in [0, vocab_size={self.vocab_size})", mask)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def condition_rmsnorm(self) -> bool:
        """Whether the step-size condition is RMS-normalised (`step_condition_rmsnorm`, None resolved)."""
        if self.step_condition_rmsnorm is None:
            return self.step_condition == "current"
        return self.step_condition_rmsnorm

    @property
    def second_moment_decay(self) -> float:
        """eta of the RMSProp and Adam update modes (`update_second_moment_decay`, None resolved)."""
        if self.update_second_moment_decay is not None:
            return self.update_second_moment_decay
        return 0.96 if self.update_mode == "adam" else 0.8

    @property
    def feedforward_step_size(self) -> float:
        """gamma with step_size_mode "fixed"."""
        fixed = self.fixed_feedforward_step_size
        return self.fixed_step_size if fixed is None else fixed

    @property
    def lora_scale(self) -> float:
        """s = lora_alpha / lora_rank (App. G.2); 4 when lora_alpha is None."""
        return 4.0 if self.lora_alpha is None else self.lora_alpha / self.lora_rank

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_layer_iterations(self) -> int:
        """L * R: the hidden states a forward records after the embedding's (one per iteration of each layer)."""
        return self.num_hidden_layers * self.num_iterations
