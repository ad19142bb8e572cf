"""Configuration of FEM-LM, the decoder LM whose attention is the Free Energy Mixer (fem.txt)."""

import math

from transformers import PreTrainedConfig
from transformers.utils import logging

from .checks import (
    OwnCacheLayerTypes,
    check_derived_fields,
    check_transformers_fields,
    require,
    require_sizes,
    set_cache_layer_types,
    strict_config,
)
from .fem_cache import fem_layer_type
from .fem_free_energy import PriorSpec
from .fem_prior_aft import PRIOR as AFT
from .fem_prior_gla import PRIOR as GLA
from .fem_prior_softmax import PRIOR as SOFTMAX
from .fem_prior_ssm import PRIOR as SSM
from .transformers_compat import CACHE_FIELD

logger = logging.get_logger(__name__)

OWNER = "FEMConfig"
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
GLA_DECAY_KINDS = ("head", "channel")

# The selection priors p_t of FEM App. H, each its own file's row (`fem_free_energy.PriorSpec`); the first is the
# default. The softmax prior's kernel is attn_implementation's, so it takes "auto".
PRIORS = {prior.name: prior for prior in (SOFTMAX, GLA, AFT, SSM)}
FEM_PRIORS = tuple(PRIORS)


@strict_config
class FEMConfig(OwnCacheLayerTypes, PreTrainedConfig):
    r"""Configuration of a FEM-LM: a Llama-style pre-norm decoder (RMSNorm, SwiGLU, RoPE) whose attention is
    the two-level gated Free Energy Mixer (FEM eq. 11) on a selection prior.

    Defaults are the paper's: the 340M LM shape of fem.txt §3 (hidden 1024, 24 layers, 16 heads, SwiGLU
    2816, vocab 32000, tied embeddings, 4096 positions) and budget (i) of FEM H.7: the prior's Q/K at the
    full width D (``qk_ratio=1``), the value/FEM path at d = D/2 (``value_ratio=0.5``).

    FEM-specific fields:
        prior: selection prior p_t (FEM App. H): "softmax" (H.1, O(T^2)); "gla" (H.2) or "aft" (H.3), O(T)
            with a fixed-size decoding state, or "ssm" (H.4, Mamba-style nonnegative impulse response, O(T)).
            The AFT prior has per-channel logits k (k_proj of the value width) and the SSM prior its step
            sizes and input/output matrices (dt_proj, bc_proj); neither has queries: the outer gate plays
            the query's role.
        gla_decay: GLA decay gate g <= 0 "head" (one per head, default) or "channel" (per key channel).
        aft_decay: add the AFT prior's input-conditioned decay (LRNN-decay, eq. 31); off is LRNN-softmax.
        ssm_state_size: N, the state size per channel of the SSM prior (16, as in Mamba).
        decay_normalizer: g = logsigmoid(x W_g) / normalizer (16, as in GLA, Yang et al. 2024), so the
            initial per-step decay is about exp(-0.043).
        prior_chunk_size: chunk length of the chunkwise linear-attention form (speed/memory only).
        kernel: the prior read's implementation. "torch": the chunkwise PyTorch form (the reference, the CPU path);
            "fla" (GLA prior): flash-linear-attention's chunk_gla, and fused_recurrent_gla for decoding; "mamba"
            (SSM prior): mamba-ssm's SSD chunk scan (the Mamba-2 kernel); "auto" (default): the library kernel
            when the tensors are on CUDA and the library is installed, else "torch", never chosen by sequence
            length. Naming a kernel that cannot run is an error. The AFT prior has only "torch" (see
            `fem_prior_aft`); the softmax prior's kernel is ``attn_implementation``'s ("sdpa", which is PyTorch's
            flash/memory-efficient kernels on CUDA, or "flash_attention_2"), so it takes only "auto".
        compile_decoding: run each layer's single-token decoding step (no autograd) as one ``torch.compile`` region
            (`fem_compiled_decoding`; speed only): at batch 1 a FEM step is dispatch-bound, and the region fuses its
            small operators. It compiles where that pays (once per model shape and batch size): on an accelerator at
            the first step, on a CPU after enough eager steps to earn the compile back (`fem_compiled_decoding`); False
            decodes eagerly.
        feature_eps: the eps of the nonnegative features ReLU(.) + eps (H.2).
        qk_ratio: total Q (and K) width / hidden_size. Per-head width must be even (RoPE).
        value_ratio: value-path width d / hidden_size; also the width of lambda, g and beta_max.
        use_time_decay: (C) the low-rank time-decay conditioner of App. I modulates q, k, v, lambda, g.
        use_lse: (L) add the log-sum-exp branch F^max (eq. 9). Off: the read is the expectation mu.
        use_temperature_gate: (T) the per-token inner gate lambda of linearised temperature learning
            (eq. 7/10). Off with the LSE on: lambda = 1, the fixed-temperature free energy F(beta_max) (eq. 4)
            with a learned per-channel beta_max.
        use_outer_gate: (G) the outer gate g (eq. 11): softplus, RMS-normalised per head, no gain.
        beta_max_init: initial per-channel beta_max; beta_max = softplus(p + softplus^-1(beta_max_init))
            with p initialised at 0 (App. K: softplus(x + 1.8), x = 0, i.e. ~1.953).
        time_decay_rank: H_c of the conditioner; None means d / 16 (FEM §2.3.3 default), at least 1.
        time_decay_chunk_size: chunk length of the parallel decayed scan (speed/memory only).
        time_decay_activation: the conditioner's gate on the shortcut branch: "silu" (App. I eq. 33) or "identity"
            (the public reference layer's, which has no SiLU), for weights ported from that layer.
        time_decay_bias: biases on the conditioner's W_f, W_x, W_s (App. I has none; the public reference layer
            has them), for weights ported from that layer.
        public_reference_eps: None (the paper's numerics), or the ``eps`` of the public reference layer
            (LJC-FVNR/FreeEnergyMixer) whose weights this model holds: its outer gate softplus(g) + eps, l2-normalised
            with eps 1e-5, times sqrt(d_v); its conditioner's shortcut softplus(a) + 1e-8, l2-normalised with eps
            1e-8, times sqrt(H_c); and its envelope floor h~_t = D_t sum_{i<=t} u_i / (D_i + 1e-12) in place of
            eq. 33, which it leaves once the decay passes about 28 nats. `energyzoo.convert.fem_reference` sets it:
            without it converted weights compute a different function past a few dozen tokens.
        layer_types: set from ``prior``: every layer's cache-layer type, which `DynamicCache(config=...)` reads. Not
            saved; a given list (an older saved config's) must be the prior's.
    Switching modules off removes their parameters; widths stay as the ratios say (re-budget with them).
    With all four switches off and ``value_ratio=1`` the model computes exactly a Llama model.
    """

    model_type = "fem"
    keys_to_ignore_at_inference = [CACHE_FIELD]

    vocab_size: int = 32000
    hidden_size: int = 1024
    intermediate_size: int = 2816
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = True
    rope_parameters: dict | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    prior: str = "softmax"
    kernel: str = "auto"
    qk_ratio: float = 1.0
    value_ratio: float = 0.5
    use_time_decay: bool = True
    use_lse: bool = True
    use_temperature_gate: bool = True
    use_outer_gate: bool = True
    beta_max_init: float = math.log1p(math.exp(1.8))
    time_decay_rank: int | None = None
    time_decay_chunk_size: int = 8
    time_decay_activation: str = "silu"
    time_decay_bias: bool = False
    public_reference_eps: float | None = None
    gla_decay: str = "head"
    aft_decay: bool = False
    decay_normalizer: float = 16.0
    ssm_state_size: int = 16
    prior_chunk_size: int = 64
    compile_decoding: bool = True
    feature_eps: float = 1e-6
    layer_types: list[str] | None = None

    def __post_init__(self, **kwargs):
        check_transformers_fields(self)
        self._check_fem_fields()
        if self.rope_parameters is None:
            self.rope_parameters = dict(DEFAULT_ROPE)
        elif not self.prior_spec.queries_and_keys and self.rope_parameters != DEFAULT_ROPE:
            logger.warning_once(
                f"FEMConfig: rope_parameters={self.rope_parameters} have no effect with prior={self.prior!r}, which "
                "has no queries or keys to rotate (FEM App. H.3 / H.4)."
            )
        if self.time_decay_rank is None:
            self.time_decay_rank = max(1, self.value_width // 16)
        set_cache_layer_types(self, OWNER, [fem_layer_type(self.prior)] * self.num_hidden_layers,
                              f"every FEM layer reads with prior {self.prior!r}")
        super().__post_init__(**kwargs)
        check_derived_fields(self)

    def _check_fem_fields(self) -> None:
        """Every FEM field against its allowed range (run once, from ``__post_init__``, before derived values
        such as the default conditioner rank are computed from them)."""
        require(OWNER, self.prior in FEM_PRIORS, "prior", f"one of {FEM_PRIORS}", self.prior)
        kernels = self.prior_spec.kernels
        require(OWNER, self.kernel in kernels, "kernel", f"one of {kernels} for prior {self.prior!r}", self.kernel)
        for field in ("qk_ratio", "value_ratio"):
            value = getattr(self, field)
            require(OWNER, value > 0, field, "a positive finite number", value)
        heads = self.num_attention_heads
        for field, path, width in (("qk_ratio", "Q/K", self.hidden_size * self.qk_ratio),
                                   ("value_ratio", "value", self.value_width_exact)):
            sizes = {"hidden_size": self.hidden_size, field: getattr(self, field), "num_attention_heads": heads}
            require_sizes(OWNER, float(width).is_integer() and int(width) % heads == 0, sizes,
                          f"a {path} width of {width:g}, which {heads} heads cannot split evenly")
        sizes = {"hidden_size": self.hidden_size, "qk_ratio": self.qk_ratio, "num_attention_heads": heads}
        require_sizes(OWNER, self.head_dim % 2 == 0, sizes,
                      f"a per-head Q/K width of {self.head_dim}, which is odd (RoPE rotates pairs of channels)")
        require(OWNER, self.beta_max_init > 0, "beta_max_init", "> 0", self.beta_max_init)
        if self.time_decay_rank is not None:
            rank = self.time_decay_rank
            require(OWNER, rank > 0, "time_decay_rank", "a positive integer or None", rank)
        for field in ("ssm_state_size", "prior_chunk_size"):
            require(OWNER, getattr(self, field) > 0, field, "a positive integer", getattr(self, field))
        require(OWNER, self.time_decay_chunk_size >= 2, "time_decay_chunk_size",
                "an integer >= 2 (the decayed scan carries chunk ends a level up, chunks of 2 or more at a time)",
                self.time_decay_chunk_size)
        require(OWNER, self.time_decay_activation in ("silu", "identity"), "time_decay_activation",
                "one of ['silu', 'identity']", self.time_decay_activation)
        require(OWNER, self.gla_decay in GLA_DECAY_KINDS, "gla_decay", f"one of {GLA_DECAY_KINDS}", self.gla_decay)
        require(OWNER, self.decay_normalizer > 0, "decay_normalizer", "> 0", self.decay_normalizer)

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (``from_pretrained(tp_plan="auto")``) splits heads, as for Llama: every projection
        with a head or channel axis (this prior's selection projections, values, the gates) and the per-channel
        parameters (beta_max, the SSM's Delta bias, a and D) are split by output columns, the output projection
        by input rows. Every FEM read is independent across heads (softmax, GLA) or channels (AFT, SSM), so a
        process reads its own heads exactly. Replicated: the SSM's B / C projection (shared by all channels) and
        the time-decay conditioner (low-rank; each process takes the modulator columns of its shards)."""
        prior = self.prior_spec
        columns = [name for name in prior.layer_projections(self) if name not in prior.replicated]
        columns += ["v_proj", *prior.parameters]
        columns += ["temperature_proj"] if self.use_lse and self.use_temperature_gate else []
        columns += ["outer_gate_proj"] if self.use_outer_gate else []
        columns += ["beta_max_raw"] if self.use_lse else []
        plan = {f"layers.*.self_attn.{name}": "colwise" for name in columns}
        plan["layers.*.self_attn.o_proj"] = "rowwise"
        plan["layers.*.self_attn"] = "local_params"  # its bare per-channel parameters, read as local shards
        plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
                     "layers.*.mlp.down_proj": "rowwise"})
        return plan

    @property
    def prior_spec(self) -> PriorSpec:
        """Everything about the selection prior ``prior`` (its own file's row)."""
        return PRIORS[self.prior]

    @property
    def head_dim(self) -> int:
        """Per-head width of the prior's queries and keys (what RoPE rotates)."""
        return int(self.hidden_size * self.qk_ratio) // self.num_attention_heads

    @property
    def value_width_exact(self) -> float:
        return self.hidden_size * self.value_ratio

    @property
    def value_width(self) -> int:
        """d, the width of the value path (values, lambda, g, beta_max) over all heads."""
        return int(self.value_width_exact)

    @property
    def value_head_dim(self) -> int:
        return self.value_width // self.num_attention_heads
