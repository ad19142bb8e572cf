"""Weights of the public FEM reference layer (LJC-FVNR/FreeEnergyMixer, fem.py @ c617a95: `FreeEnergyMixer`) as an
energyzoo `FEMAttention` that computes that layer's function.

The reference is a layer, not a model; where it and the paper differ, energyzoo follows the paper (the FEM model
card's "Differences from the public reference layer" table). A converted layer keeps the reference's own terms where
its weights would otherwise mean something else, through config switches that are off by default:
``time_decay_activation="identity"`` and ``time_decay_bias=True`` (its conditioner has no SiLU and has biases), and
``public_reference_eps`` (its outer-gate and shortcut normalisations and its envelope floor D + 1e-12, which makes
it a different function from eq. 33 past a few dozen tokens). What has no energyzoo equivalent is refused with the
reason, in one line:
- priors: "softmax" (H.1) and "rnn_softmax" (the AFT prior, H.3) when its query weights are zero: its query gate
  softplus(q), which H.3 does not have, is then the constant 1. "linear", "gla" and "mamba" are parametrised
  differently (see the table) and are refused.
- the reference's flags must be those of FEM (use_temperature, use_lse); its outer gate may be on or off, and its
  ``bias`` too (its LayerNorms without a bias are energyzoo's with a zero one).
- its conditioner (use_conv, one direction) maps onto `TimeDecayConditioner`: W_f = in_f, W_x = x_f, W_s = shortcut,
  stacked in that order, and the columns of W_c reordered from the reference's [v, q, k, lambda, g] to energyzoo's
  [q, k, v, lambda, g]; its LayerNorms' eps (1e-5) becomes ``rms_norm_eps``. The AFT prior with a conditioner is
  refused (its key modulation has the query width).
- beta_max: the reference's softplus(p) + eps becomes softplus(raw + softplus^-1(beta_max_init)):
  raw = softplus^-1(softplus(p) + eps) - softplus^-1(beta_max_init).
- RoPE: the reference's `SimpleRoPE` is not a rotation. A layer trained with it has no energyzoo equivalent; a
  layer without it (use_rope=False) runs in energyzoo with position embeddings cos = 1, sin = 0.
"""

import torch

from ..modeling.configuration_fem import FEMConfig
from ..modeling.errors import UserError
from ..modeling.fem_free_energy import inverse_softplus
from ..modeling.modeling_fem import FEMAttention

REFERENCE_PRIORS = {"softmax": "softmax", "rnn_softmax": "aft"}
RENAMES = {"W_q": "q_proj", "W_k": "k_proj", "W_v": "v_proj", "W_o": "o_proj", "W_lambda": "temperature_proj",
           "W_gate": "outer_gate_proj", "tdc.fwd.norm": "time_decay.input_norm", "tdc.fwd.ln": "time_decay.state_norm"}
CONDITIONER_INPUTS = ("in_f", "x_f", "shortcut")  # W_f, W_x, W_s: the order of `TimeDecayConditioner.in_proj`
CONDITIONER_MODULES = {*(f"tdc.fwd.{name}" for name in CONDITIONER_INPUTS), "tdc.fwd"}  # "tdc.fwd": its out_proj
REFERENCE_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which the reference's conditioner keeps


def _softplus_inverse(value: torch.Tensor) -> torch.Tensor:
    return value + torch.log(-torch.expm1(-value))


def reference_config(state: dict[str, torch.Tensor], n_head: int, prior_type: str = "softmax",
                     eps: float = 1e-6) -> FEMConfig:
    """The `FEMConfig` of a reference layer (its ``n_head``, ``prior_type`` and ``eps``; the rest read from the
    state dict), for one `FEMAttention`."""
    if prior_type not in REFERENCE_PRIORS:
        raise UserError(f"fem reference: prior_type={prior_type!r} is parametrised differently from energyzoo's; "
                        f"energyzoo converts {sorted(REFERENCE_PRIORS)}")
    conditioner = "tdc.fwd.in_f.weight" in state
    read_here = ["W_v.weight", "W_q.weight", "W_k.weight", *(["tdc.fwd.out_proj"] if conditioner else [])]
    if absent := [key for key in read_here if key not in state]:
        raise UserError(f"fem reference: the state dict has no {', '.join(absent)}: a damaged or partial layer, "
                        f"refused")
    if "W_lambda.weight" not in state:
        raise UserError("fem reference: the layer has no W_lambda (use_temperature and use_lse off); energyzoo "
                        "converts layers with FEM's temperature gate and log-sum-exp branch")
    if any(key.startswith("tdc.bwd.") for key in state):
        raise UserError("fem reference: a bidirectional conditioner (conv_bidirectional) is not causal; refused")
    values, hidden = state["W_v.weight"].shape
    conditioner_bias = any(f"tdc.fwd.{name}.bias" in state for name in CONDITIONER_INPUTS)
    if prior_type == "rnn_softmax":
        query = [state["W_q.weight"], state.get("W_q.bias", torch.zeros(1))]
        if any(tensor.count_nonzero() for tensor in query):
            raise UserError("fem reference: the AFT prior's query gate softplus(q) (not in FEM H.3) is the constant 1 "
                            "only with zero W_q; this layer's W_q is not zero")
        key_width, value_width = state["W_k.weight"].shape[0] // n_head, values // n_head
        if value_width % key_width:
            raise UserError(f"fem reference: the AFT prior repeats each head's {key_width} keys over its values and "
                            f"their exponentials together, so the same key weighs a value and its exponential only "
                            f"when {key_width} divides the value head width {value_width}; it does not")
        if conditioner:
            raise UserError("fem reference: the AFT prior with a conditioner modulates keys of the query width, which "
                            "energyzoo's per-channel keys cannot express; refused")
    queries = state["W_q.weight"].shape[0]
    return FEMConfig(hidden_size=hidden, num_attention_heads=n_head, prior=REFERENCE_PRIORS[prior_type],
                     qk_ratio=queries / hidden, value_ratio=values / hidden, attention_bias="W_v.bias" in state,
                     use_time_decay=conditioner, use_outer_gate="W_gate.weight" in state,
                     time_decay_rank=state["tdc.fwd.in_f.weight"].shape[0] if conditioner else None,
                     time_decay_activation="identity", time_decay_bias=conditioner_bias,
                     public_reference_eps=eps, rms_norm_eps=REFERENCE_LAYER_NORM_EPS, num_hidden_layers=1,
                     vocab_size=8)


def reference_weights(state: dict[str, torch.Tensor], config: FEMConfig, eps: float = 1e-6) -> dict[str, torch.Tensor]:
    """The reference layer's state dict under `FEMAttention`'s names (module docstring)."""
    weights, unknown = {}, []
    for key, value in state.items():
        module, _, attribute = key.rpartition(".")
        if module in RENAMES:
            name = f"{RENAMES[module]}.{attribute}"
            per_channel = not config.prior_spec.queries_and_keys  # AFT's logits, one per value channel
            if per_channel and module == "W_k":  # each head's d_k keys repeated over d_v
                heads = config.num_attention_heads
                per_head = value.view(heads, -1, *value.shape[1:])
                repeats = config.value_head_dim // per_head.shape[1]
                value = per_head.repeat(1, repeats, *([1] * (value.dim() - 1))).flatten(0, 1)
            if not (per_channel and module == "W_q"):
                weights[name] = value
        elif key == "_beta_param":
            beta = torch.nn.functional.softplus(value.double()) + eps
            offset = inverse_softplus(config.beta_max_init)
            weights["beta_max_raw"] = (_softplus_inverse(beta) - offset).to(value.dtype)
        elif module in CONDITIONER_MODULES:
            continue  # stacked and reordered below
        else:
            unknown.append(key)
    if unknown:
        raise UserError(f"fem reference: keys of no FEM module, refused: {', '.join(sorted(unknown))}")
    for norm in ("input_norm", "state_norm"):  # a LayerNorm built with bias=False: energyzoo's with a zero bias
        weight = weights.get(f"time_decay.{norm}.weight")
        if weight is not None:
            weights.setdefault(f"time_decay.{norm}.bias", torch.zeros_like(weight))
    if config.use_time_decay:
        for attribute in ("weight", "bias") if config.time_decay_bias else ("weight",):
            keys = [f"tdc.fwd.{name}.{attribute}" for name in CONDITIONER_INPUTS]
            if absent := [key for key in keys if key not in state]:
                raise UserError(f"fem reference: the conditioner lacks {', '.join(absent)} beside "
                                f"{', '.join(sorted(set(keys) - set(absent)))}: a damaged or partial layer, refused")
            weights[f"time_decay.in_proj.{attribute}"] = torch.cat([state[key] for key in keys])
        out = state["tdc.fwd.out_proj"]
        values, queries = config.value_width, state["W_q.weight"].shape[0]
        widths = [values, queries, queries, values * (1 + config.use_outer_gate)]  # v, q, k, lambda [, g]
        if out.shape[1] != sum(widths):
            raise UserError(f"fem reference: the conditioner's output width {out.shape[1]} is not v + q + k + lambda "
                            f"+ g = {sum(widths)}")
        v, q, k, gates = out.split(widths, dim=1)
        weights["time_decay.out_proj"] = torch.cat([q, k, v, gates], dim=1)
    return weights


def fem_attention_from_reference(state: dict[str, torch.Tensor], n_head: int, prior_type: str = "softmax",
                                 eps: float = 1e-6) -> FEMAttention:
    """An `FEMAttention` with the weights of a reference `FreeEnergyMixer` layer (its state dict, ``n_head``,
    ``prior_type`` and ``eps``), loaded strictly; call it with position embeddings cos = 1, sin = 0 (the reference
    without RoPE)."""
    config = reference_config(state, n_head, prior_type, eps)
    config._attn_implementation = "sdpa"  # a standalone layer: no model dispatches it
    attention = FEMAttention(config, layer_idx=0).to(state["W_v.weight"].dtype)
    weights = reference_weights(state, config, eps)
    expected = attention.state_dict().keys()
    missing, extra = sorted(expected - weights.keys()), sorted(weights.keys() - expected)
    if missing or extra:
        raise UserError(f"fem reference: the state dict does not hold one layer of the kind its keys imply (under "
                        f"energyzoo's names, missing: {', '.join(missing) or 'none'}; left over: "
                        f"{', '.join(extra) or 'none'}); a damaged or partial layer, refused")
    attention.load_state_dict(weights, strict=True)
    return attention
