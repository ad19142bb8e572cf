"""Configuration of EER, the single-head looped transformer trained with the energy-entropy regularised loss
(eer.txt, W.-L. Lam, "Energy-Entropy Regularization: The True Power of Minimal Looped Transformers")."""

from transformers import PreTrainedConfig

from .checks import check_derived_fields, check_transformers_fields, require, require_divisible, strict_config

OWNER = "EERConfig"
CHOICES = {"loop_dynamics": ("residual", "hamiltonian"), "label_alignment": ("aligned", "shifted"),
           "norm_placement": ("pre", "post")}


@strict_config
class EERConfig(PreTrainedConfig):
    r"""One transformer block applied ``num_loops`` times to a latent Z (eer.txt §5.1, Table 1), and the loss of
    eq. 2-5.
    Defaults are the paper's d = 8 single-head model (§6, Table 1); choices the paper leaves open are fields,
    each with its reason below.

    Model (§5.1, §6):
        vocab_size: 8 = the induction task's 7 ids (HOP 0, symbols a-d 1-4, "no previous occurrence" 5, BLANK 6;
            Sanford et al.'s) + PAD 7, so that batches of mixed lengths can be padded (`pad_token_id`).
        hidden_size d (8), num_attention_heads (1), intermediate_size (32 = 4d, the MLP of §6).
        num_loops T (25, train = eval, Table 1; §5.3's T in [16, 64] is read as the training length range);
        num_loops_range: [min, max] to draw T uniformly
            per training forward instead (§5.3's "varying rollout depth"; None: fixed T). ``refinement_steps=T'``
            in `forward` / `generate` overrides both.
        position_embedding_scale: X = E[x] + 0.15 PE(pos) with the fixed sinusoidal PE (§6, Table 1).
        attention_temperature tau: softmax(q k^T / (tau sqrt(d_head))) (1.0; the model's own attention, eq. 4).
        attention_bias, attention_output_projection: biases on q/k/v (/o) and an output projection o_proj; both
            off for the paper's model (§5.1: softmax(U W_Q (U W_K)^T / sqrt d) U W_V), on for the Looped GPT-2
            baseline of Table 1.
        loop_dynamics: "residual", Z_0 = 0, Z_{t+1} = Z_t + F(Z_t + X) (§5.1, the experiments), or "hamiltonian",
            the damped heavy-ball latent dynamics of eq. 1 (§4.3) with hamiltonian_momentum mu (0.5),
            hamiltonian_coupling alpha (0.5) and hamiltonian_gravity beta (0.1) (the paper gives none of the three;
            §4.4 reports the form insufficient, so it is kept for ablation).
    Block choices the paper leaves unstated (§5.1 gives F only as attention then MLP; defaults: the GPT-2-style
    reading used so far), screened by `energyzoo reproduce eer-block-screen`:
        norm_placement: "pre" (Z_{t+1} = Z_t + F(LN(Z_t + X)), LayerNorms inside the branch) or "post"
            (Z_{t+1} = LN(Z_t + F(Z_t + X)), the original Transformer's).
        attention_norm: a LayerNorm before the attention (True) or none (the MLP keeps its own).
        embedding_init_std: the token embedding's N(0, std) at initialisation (None: `initializer_range`'s rule).
        readout_with_inputs: the readout reads LN_f(Z_T + X) (True) or LN_f(Z_T) (the latent alone).
        initializer_range: None = PyTorch's own initialisation (Linear: kaiming-uniform, U(+-1/sqrt(fan_in))
            biases; Embedding: N(0, 1)), what a from-scratch model without an init scheme gets (the paper states
            none); a number = N(0, initializer_range) as in transformers. Neither reproduces App. C's epoch-0
            magnitudes (P 1.40, K 93.8): PyTorch's gives P 2.65-2.90 and K 36-76 on a first training batch (5
            seeds, measured), so the paper's initialisation is unknown.
    Loss (eq. 2-5, §6): CE + lambda_potential L_pot + lambda_kinetic L_kin + lambda_entropy |S_q - entropy_target|,
        with the paper's 0.1, 0.001, 0.02, tsallis_q = 1.5 (in (1, 2], where Lemma B.1 and the contraction bound
        hold) and eta = 0. All lambdas 0 give the cross-entropy-only baseline. label_alignment: "aligned" (label i
        answers input i, the induction task's format, which the paper never spells out;
            `energyzoo.data.induction` documents it) or "shifted" (the usual next-token LM loss).
    """

    model_type = "eer-looped"
    attribute_map = {"num_hidden_layers": "num_loops"}  # one cache layer and one attention map per loop

    vocab_size: int = 8
    hidden_size: int = 8
    num_attention_heads: int = 1
    intermediate_size: int = 32
    num_loops: int = 25
    num_loops_range: list[int] | None = None
    position_embedding_scale: float = 0.15
    attention_temperature: float = 1.0
    attention_bias: bool = False
    attention_output_projection: bool = False
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    loop_dynamics: str = "residual"
    hamiltonian_momentum: float = 0.5
    hamiltonian_coupling: float = 0.5
    hamiltonian_gravity: float = 0.1
    lambda_potential: float = 0.1
    lambda_kinetic: float = 0.001
    lambda_entropy: float = 0.02
    tsallis_q: float = 1.5
    entropy_target: float = 0.0
    label_alignment: str = "aligned"
    norm_placement: str = "pre"
    attention_norm: bool = True
    embedding_init_std: float | None = None
    readout_with_inputs: bool = True
    initializer_range: float | None = None
    use_cache: bool = True
    pad_token_id: int | None = 7
    bos_token_id: int | None = 0
    eos_token_id: int | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        check_transformers_fields(self)
        self._check_eer_fields()
        super().__post_init__(**kwargs)
        check_derived_fields(self)

    def _check_eer_fields(self) -> None:
        """Every field against its range, once (`checks.require`)."""
        require(OWNER, self.num_loops >= 0, "num_loops", "an integer >= 0", self.num_loops)
        span = self.num_loops_range
        require(OWNER, span is None or (len(span) == 2 and 1 <= span[0] <= span[1]), "num_loops_range",
                "None or [min, max] with 1 <= min <= max", span)
        require_divisible(OWNER, self, "hidden_size", "num_attention_heads")
        require(OWNER, 1 < self.tsallis_q <= 2, "tsallis_q", "in (1, 2] (Lemma B.1 and Theorem 3.2.1)", self.tsallis_q)
        require(OWNER, self.attention_temperature > 0, "attention_temperature", "> 0", self.attention_temperature)
        for field in ("lambda_potential", "lambda_kinetic", "lambda_entropy", "entropy_target",
                      "position_embedding_scale", "hamiltonian_coupling", "hamiltonian_gravity"):
            require(OWNER, getattr(self, field) >= 0, field, ">= 0", getattr(self, field))
        require(OWNER, 0 <= self.hamiltonian_momentum < 1, "hamiltonian_momentum", "in [0, 1) (dissipative)",
                self.hamiltonian_momentum)
        require(OWNER, self.embedding_init_std is None or self.embedding_init_std > 0, "embedding_init_std",
                "None or > 0", self.embedding_init_std)
        require(OWNER, self.attention_norm or self.norm_placement == "pre", "attention_norm",
                "True with norm_placement='post' (a post-norm block has no norm before the attention to drop)",
                self.attention_norm)
        for field, allowed in CHOICES.items():
            require(OWNER, getattr(self, field) in allowed, field, f"one of {list(allowed)}", getattr(self, field))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
