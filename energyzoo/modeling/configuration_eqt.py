"""Configuration of EqT-LLaMA, Llama with the Equilibrium Refinement Module (eqt.txt)."""

from transformers import LlamaConfig

from .checks import (
    OwnCacheLayerTypes,
    check_derived_fields,
    check_transformers_fields,
    require,
    require_divisible,
    set_cache_layer_types,
    strict_config,
)

OWNER = "EqTLlamaConfig"
# The cache-layer type of the first decoder layer, whose cache layer also keeps the token window (`eqt_cache`).
WINDOW_LAYER_TYPE = "eqt_window_attention"
CHOICES = {"erm_backprop": ("unrolled", "implicit"), "erm_head_vocabulary": ("full", "window")}


@strict_config
class EqTLlamaConfig(OwnCacheLayerTypes, LlamaConfig):
    r"""A `LlamaConfig` plus the Equilibrium Refinement Module (ERM, eqt.txt §3, Algorithm 1). Every Llama field
    keeps its meaning, so a Llama checkpoint's config loads as it is (`EqTLlamaForCausalLM.from_pretrained(llama_dir,
    **erm_fields)`). Defaults are the paper's (§3.7); where the paper contradicts itself the choice and its reason are
    given here, and each is a field:

    Sites and solver (eq. 7-8):
        erm_layers: decoder layers whose output f is refined; None = the last layer only: §5.3.3's "+8% params
            dominated by the reverse prediction head" implies one shared energy network, and the confidence term
            (eq. 14) needs the LM head; §2.4's "every token and every layer" is the full list.
        erm_num_steps: K at inference (8: "~3x at K = 8", Table 2). erm_num_steps_train: K in training (2, §5.1.2).
            ``refinement_steps=K`` in `forward` / `generate` overrides both at run time.
        erm_step_size: alpha (0.1, §3.7). erm_gamma: gamma of the proximal anchor ||h - f||^2 / (2 gamma) (1.0).
            Eq. 7 is read literally: a small gamma keeps h near f (§3.5's "gamma large initially so refinement
            is conservative" contradicts eq. 7, where a large gamma weakens the anchor).
        erm_tol: per-position early stop when ||h_{k+1} - h_k|| / ||h_k|| <= erm_tol (§3.7, §5.3.1); None: off.
        erm_backprop: "unrolled" (§3.5, K <= 16) or "implicit": the implicit-function gradient of eq. 19 with the
            path through f that eq. 19 omits (without it the decoder below gets no gradient), solved by
            `erm_implicit_iterations` fixed-point steps.
    Energy (eq. 11): lambda_rev, lambda_mask, lambda_conf, lambda_mem = 1.0, 0.5, 0.2, 0.1 (§3.7); 0 drops a term.
        erm_rev_window: W, the window of eq. 12 and 13 (32). erm_rev_num_layers, erm_rev_hidden_size,
            erm_rev_num_heads: the reverse encoder q_phi (2 Llama layers of width d/4, within §2.3's "2-4 layers,
            d_ERM << d"; 0 = hidden_size / 4).
        erm_head_vocabulary: what the reverse and masked heads predict over: "full" (the vocabulary, the paper's
            softmax) or "window" (the distinct tokens of the window, in-window negatives as in contrastive
            predictive coding): a full-vocabulary softmax costs W * vocab * d per position and step, ~60x a 340M
            Llama's forward at W = 32, so the large presets use "window".
        erm_confidence_topk: the confidence term (eq. 14) over the top-k tokens of the proposal's readout (the
            proposal's argmax among them); None: the whole vocabulary (exact, one vocab x d product per step).
        erm_mask_ratio, erm_mask_seed: eq. 13's mask, keyed on each token's position among the real tokens, so
            training, evaluation, the cache and padding agree. Eq. 13 conditions on an unmasked context, yet the
            energy must be computable without supervision at test time (§2.2.2): a latent probe, no input corruption.
        erm_memory_size, erm_memory_temperature, erm_memory_topk, erm_memory_ema_decay: eq. 15-16's buffer of M
            prototypes (10,000), tau_m (0.1), the k prototypes most similar to f that count as relevant (8), the EMA
            decay of eq. 16 (0.99; 1.0 freezes the memory). The paper gives only M (§3.7); it calls the memory
            both "jointly optimized" (§3.5) and an EMA buffer (§3.3.4): the EMA buffer of eq. 15-16 is used.
    Training (eq. 18): energy_loss_weight beta (0.3): the loss is CE + beta * mean energy of the refined states.
        ``erm_num_steps_train=0`` trains the energies at h* = f (eq. 18's second term) with no refinement: the arm
        that separates the auxiliary losses from refinement in `energyzoo reproduce eqt-parity`.
    Not implemented (options the paper allows and leaves unused in its experiment): a learned step-size schedule
        (§3.7's "or a learned schedule"; alpha is a constant), eq. 4's bidirectional-consistency term L_consist
        (absent from eq. 11, Algorithm 1 and §5), a "prefix" reverse head that re-reads the window per step (eq. 12
        is implemented as a once-per-forward encoder), an extra output norm after the last site (the base model's
        final norm is reused), copying the base model's first layers into the reverse encoder, and a separate set
        of energies for inference (the training ones are used).
    """

    model_type = "eqt-llama"

    erm_layers: list[int] | None = None
    erm_num_steps: int = 8
    erm_num_steps_train: int = 2
    erm_step_size: float = 0.1
    erm_gamma: float = 1.0
    erm_tol: float | None = None
    erm_backprop: str = "unrolled"
    erm_implicit_iterations: int = 30
    lambda_rev: float = 1.0
    lambda_mask: float = 0.5
    lambda_conf: float = 0.2
    lambda_mem: float = 0.1
    erm_rev_window: int = 32
    erm_rev_num_layers: int = 2
    erm_rev_hidden_size: int = 0
    erm_rev_num_heads: int = 4
    erm_head_vocabulary: str = "full"
    erm_confidence_topk: int | None = None
    erm_mask_ratio: float = 0.15
    erm_mask_seed: int = 0
    erm_memory_size: int = 10_000
    erm_memory_temperature: float = 0.1
    erm_memory_topk: int = 8
    erm_memory_ema_decay: float = 0.99
    energy_loss_weight: float = 0.3
    layer_types: list[str] | None = None

    def __post_init__(self, **kwargs):
        check_transformers_fields(self)
        set_cache_layer_types(self, OWNER, [WINDOW_LAYER_TYPE] + ["full_attention"] * (self.num_hidden_layers - 1),
                              "the first decoder layer's cache layer also keeps the energies' token window")
        super().__post_init__(**kwargs)
        check_derived_fields(self)
        self._check_llama_fields()
        if self.erm_rev_hidden_size == 0:
            self.erm_rev_hidden_size = self.hidden_size // 4
        self._check_erm_fields()

    def _check_llama_fields(self) -> None:
        """What Llama's attention needs of its fields (`LlamaConfig` checks none): heads split the width, key-value
        heads the heads, and RoPE an even head width."""
        require_divisible(OWNER, self, "hidden_size", "num_attention_heads")
        require_divisible(OWNER, self, "num_attention_heads", "num_key_value_heads")
        require(OWNER, self.head_dim % 2 == 0, "head_dim", "even (RoPE rotates pairs of channels; unset, it is "
                "hidden_size / num_attention_heads)", self.head_dim)

    def _check_erm_fields(self) -> None:
        """Every ERM field against its range, once (`checks.require`)."""
        layers = self.num_hidden_layers
        sites = self.erm_layers
        require(OWNER, sites is None or (len(sites) > 0 and len(set(sites)) == len(sites)
                                         and all(0 <= site < layers for site in sites)),
                "erm_layers", f"None or distinct layer indices in [0, {layers})", sites)
        for field in ("erm_num_steps", "erm_num_steps_train"):
            require(OWNER, getattr(self, field) >= 0, field, "an integer >= 0", getattr(self, field))
        for field in ("erm_rev_window", "erm_rev_num_heads", "erm_memory_topk", "erm_implicit_iterations"):
            require(OWNER, getattr(self, field) >= 1, field, "an integer >= 1", getattr(self, field))
        require(OWNER, self.erm_rev_num_layers >= 0, "erm_rev_num_layers", "an integer >= 0", self.erm_rev_num_layers)
        require(OWNER, self.erm_step_size > 0, "erm_step_size", "> 0", self.erm_step_size)
        require(OWNER, self.erm_gamma > 0, "erm_gamma", "> 0", self.erm_gamma)
        require(OWNER, self.erm_step_size / self.erm_gamma < 2, "erm_step_size",
                f"< 2 * erm_gamma ({2 * self.erm_gamma}): the proximal step alone must contract (§3.2)",
                self.erm_step_size)
        for field in ("lambda_rev", "lambda_mask", "lambda_conf", "lambda_mem", "energy_loss_weight"):
            require(OWNER, getattr(self, field) >= 0, field, ">= 0", getattr(self, field))
        require(OWNER, self.erm_tol is None or self.erm_tol > 0, "erm_tol", "None or > 0", self.erm_tol)
        require(OWNER, 0 < self.erm_mask_ratio < 1, "erm_mask_ratio", "in (0, 1)", self.erm_mask_ratio)
        require(OWNER, self.erm_memory_size >= self.erm_memory_topk, "erm_memory_size",
                f">= erm_memory_topk ({self.erm_memory_topk})", self.erm_memory_size)
        require(OWNER, self.erm_memory_temperature > 0, "erm_memory_temperature", "> 0", self.erm_memory_temperature)
        require(OWNER, 0 <= self.erm_memory_ema_decay <= 1, "erm_memory_ema_decay", "in [0, 1]",
                self.erm_memory_ema_decay)
        topk = self.erm_confidence_topk
        require(OWNER, topk is None or 1 <= topk <= self.vocab_size, "erm_confidence_topk",
                f"None or in [1, vocab_size={self.vocab_size}]", topk)
        heads = self.erm_rev_num_heads
        require(OWNER, self.erm_rev_hidden_size > 0 and self.erm_rev_hidden_size % (2 * heads) == 0,
                "erm_rev_hidden_size", f"a positive multiple of 2 x erm_rev_num_heads ({2 * heads}): the reverse "
                "encoder's heads are RoPE'd, which needs an even head width", self.erm_rev_hidden_size)
        for field, allowed in CHOICES.items():
            require(OWNER, getattr(self, field) in allowed, field, f"one of {list(allowed)}", getattr(self, field))

    @property
    def erm_sites(self) -> list[int]:
        """The refined layers: `erm_layers`, or the last layer."""
        return list(self.erm_layers) if self.erm_layers is not None else [self.num_hidden_layers - 1]

    @property
    def erm_context_length(self) -> int:
        """Token positions before a refined one that its energies read: the window W, plus the reverse encoder's
        receptive field n_rev (W - 1) and the one position its context state u_{i-1} lags."""
        window = self.erm_rev_window
        return window + self.erm_rev_num_layers * (window - 1)
