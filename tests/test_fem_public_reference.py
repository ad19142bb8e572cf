"""Weights of the public FEM reference layer converted into an `FEMAttention` (`fem_public_reference`), checked in
float64 against that layer's equations written out with its own key names (tests/support/fem_reference.py)."""

import json
from pathlib import Path

import pytest
import torch
from support.fem_reference import public_reference_layer

from energyzoo.modeling.configuration_fem import FEMConfig
from energyzoo.modeling.errors import UserError
from energyzoo.modeling.fem_public_reference import fem_attention_from_reference

LAYOUT = json.loads((Path(__file__).parent / "support" / "fem_public_reference_layout.json").read_text())["keys"]
HEADS = 2
DIMS = {"D": 16, "E": 8, "Q": 16, "C": 4}
AFT_QUERIES = 4  # 2 per head: the reference repeats each head's keys over its values, so they must divide d_v


def reference_state(conditioner: bool = True, gate: bool = True, zero_queries: bool = False, seed: int = 0):
    """A state dict in the reference's layout (the JSON's key names and shapes), random float64 values."""
    dims = {**DIMS, "Q": AFT_QUERIES if zero_queries else DIMS["Q"]}
    dims["P"] = (3 if gate else 2) * dims["E"] + 2 * dims["Q"]
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in LAYOUT.items():
        if (key.startswith("tdc.") and not conditioner) or (key.startswith("W_gate") and not gate):
            continue
        sizes = [dims[name] for name in shape]
        state[key] = torch.randn(sizes, generator=generator, dtype=torch.float64) * 0.4
        if key.endswith(("norm.weight", "ln.weight")):
            state[key] += 1
    if zero_queries:
        state["W_q.weight"].zero_()
        state["W_q.bias"].zero_()
    return state


def converted_output(state, x, prior_type="softmax"):
    attention = fem_attention_from_reference(state, HEADS, prior_type)
    head_dim = attention.config.head_dim
    batch, length = x.shape[:2]
    cos = torch.ones(batch, length, head_dim, dtype=x.dtype)
    no_rotation = (cos, torch.zeros_like(cos))
    future = ~torch.ones(length, length, dtype=torch.bool).tril()
    causal = torch.zeros(length, length, dtype=x.dtype).masked_fill(future, -torch.inf)
    with torch.no_grad():
        return attention(x, position_embeddings=no_rotation, attention_mask=causal[None, None])[0]


@pytest.mark.parametrize(("conditioner", "gate", "tolerance"), [
    (False, True, 3e-4),  # the outer gate's eps, RMS with 1e-6 against + 1e-6 then l2 with 1e-5: ~1e-6 / softplus
    (False, False, 1e-10),
    (True, True, 1e-3),  # the conditioner's shortcut: RMS normalisation with 1e-5 against l2 with 1e-8
])
def test_a_converted_softmax_layer_computes_the_reference_layer(conditioner, gate, tolerance):
    state = reference_state(conditioner, gate)
    x = torch.randn(2, 12, DIMS["D"], dtype=torch.float64)
    expected = public_reference_layer(state, x, HEADS)
    torch.testing.assert_close(converted_output(state, x), expected, rtol=tolerance, atol=tolerance)


def test_a_converted_aft_layer_with_zero_queries_computes_the_reference_layer():
    state = reference_state(conditioner=False, gate=False, zero_queries=True)
    x = torch.randn(2, 12, DIMS["D"], dtype=torch.float64)
    torch.testing.assert_close(converted_output(state, x, "rnn_softmax"),
                               public_reference_layer(state, x, HEADS, prior="aft"), rtol=1e-10, atol=1e-10)


def test_the_conditioner_columns_are_reordered_not_merely_copied():
    """Swapping the reference's value and query blocks of W_c changes the converted layer's output: the order
    matters, and the conversion follows the reference's."""
    state = reference_state()
    x = torch.randn(1, 6, DIMS["D"], dtype=torch.float64)
    swapped = dict(state)
    out = state["tdc.fwd.out_proj"]
    swapped["tdc.fwd.out_proj"] = torch.cat([out[:, 8:16], out[:, :8], out[:, 16:]], dim=1)
    assert (converted_output(swapped, x) - public_reference_layer(state, x, HEADS)).abs().max() > 1e-3


def test_the_converted_config_reproduces_the_reference_conditioner_switches():
    attention = fem_attention_from_reference(reference_state(), HEADS)
    config = attention.config
    assert (config.time_decay_activation, config.time_decay_bias, config.attention_bias) == ("identity", True, True)
    assert FEMConfig().time_decay_activation == "silu" and FEMConfig().time_decay_bias is False


@pytest.mark.parametrize(("change", "prior", "message"), [
    (lambda state: state["W_q.weight"].normal_(), "rnn_softmax", "W_q is not zero"),
    (lambda state: state.update({"rope.inv_freq": torch.zeros(4)}), "softmax", "rope.inv_freq"),
    (lambda state: state.update({"tdc.bwd.in_f.weight": torch.zeros(4, 16)}), "softmax", "bidirectional"),
    (lambda state: None, "gla", "prior_type='gla'"),
])
def test_what_has_no_energyzoo_equivalent_is_refused_with_the_reason(change, prior, message):
    state = reference_state(conditioner=prior != "rnn_softmax", zero_queries=prior == "rnn_softmax")
    change(state)
    with pytest.raises(UserError, match=message):
        fem_attention_from_reference(state, HEADS, prior)


def test_the_conditioner_switch_drops_the_silu_and_adds_biases():
    """`time_decay_activation="identity"` computes the features without SiLU: against the App. I form with the SiLU
    removed, in float64."""
    torch.manual_seed(0)
    silu = FEMConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1, vocab_size=8, time_decay_rank=4)
    plain = FEMConfig(**{**silu.to_dict(), "time_decay_activation": "identity", "time_decay_bias": True})
    from energyzoo.modeling.modeling_fem import FEMAttention

    a, b = FEMAttention(silu, 0).double(), FEMAttention(plain, 0).double()
    assert b.time_decay.in_proj.bias is not None and a.time_decay.in_proj.bias is None
    with torch.no_grad():
        b.time_decay.in_proj.weight.copy_(a.time_decay.in_proj.weight)
        b.time_decay.in_proj.bias.zero_()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    rank = silu.time_decay_rank
    shortcut = torch.nn.functional.softplus(
        a.time_decay.input_norm(x) @ a.time_decay.in_proj.weight[2 * rank:].T)
    normed = shortcut * torch.rsqrt(shortcut.square().mean(-1, keepdim=True) + silu.rms_norm_eps)
    with_silu, _ = a.time_decay(x)
    without, _ = b.time_decay(x)
    torch.testing.assert_close(without * torch.nn.functional.silu(normed), with_silu * normed)
    assert (without - with_silu).abs().max() > 1e-2
