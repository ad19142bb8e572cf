"""Weights of the public FEM reference layer converted into an `FEMAttention` (`energyzoo.convert.fem_reference`),
checked in float64 against that layer's equations written out with its own key names
(tests/support/fem_reference.py)."""

import json
from pathlib import Path

import pytest
import torch
from support.fem_reference import public_reference_layer
from transformers import DynamicCache

from energyzoo.convert.fem_reference import fem_attention_from_reference
from energyzoo.modeling.configuration_fem import FEMConfig
from energyzoo.modeling.errors import UserError
from energyzoo.modeling.modeling_fem import FEMAttention, FEMForCausalLM

LAYOUT = json.loads((Path(__file__).parent / "support" / "fem_public_reference_layout.json").read_text())["keys"]
HEADS = 2
DIMS = {"D": 16, "E": 8, "Q": 16, "C": 4}
AFT_QUERIES = 4  # 2 per head: the reference repeats each head's keys over its values, so they must divide d_v


def reference_state(conditioner: bool = True, gate: bool = True, zero_queries: bool = False, bias: bool = True,
                    seed: int = 0):
    """A state dict in the reference's layout (the JSON's key names and shapes; without biases for ``bias=False``, as
    the reference's config builds every Linear and LayerNorm), random float64 values."""
    dims = {**DIMS, "Q": AFT_QUERIES if zero_queries else DIMS["Q"]}
    dims["P"] = (3 if gate else 2) * dims["E"] + 2 * dims["Q"]
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in LAYOUT.items():
        if (key.startswith("tdc.") and not conditioner) or (key.startswith("W_gate") and not gate):
            continue
        if key.endswith(".bias") and not bias:
            continue
        sizes = [dims[name] for name in shape]
        state[key] = torch.randn(sizes, generator=generator, dtype=torch.float64) * 0.4
        if key.endswith(("norm.weight", "ln.weight")):
            state[key] += 1
    if zero_queries:
        state["W_q.weight"].zero_()
        state.get("W_q.bias", torch.zeros(1)).zero_()
    return state


def converted_call(attention, x):
    """``attention`` on ``x`` as the reference runs (causal, no rotation: position embeddings cos = 1, sin = 0)."""
    head_dim = attention.config.head_dim
    batch, length = x.shape[:2]
    cos = torch.ones(batch, length, head_dim, dtype=x.dtype)
    no_rotation = (cos, torch.zeros_like(cos))
    future = ~torch.ones(length, length, dtype=torch.bool).tril()
    causal = torch.zeros(length, length, dtype=x.dtype).masked_fill(future, -torch.inf)
    return attention(x, position_embeddings=no_rotation, attention_mask=causal[None, None])[0]


def converted_output(state, x, prior_type="softmax"):
    with torch.no_grad():
        return converted_call(fem_attention_from_reference(state, HEADS, prior_type), x)


# the reference's parameters that a converted layer holds as they are, under energyzoo's names (the others are
# stacked, reordered or reparametrised)
SAME_TENSOR = {"W_v.weight": "v_proj.weight", "W_o.weight": "o_proj.weight", "W_k.weight": "k_proj.weight",
               "W_lambda.weight": "temperature_proj.weight", "W_gate.weight": "outer_gate_proj.weight",
               "tdc.fwd.norm.weight": "time_decay.input_norm.weight",
               "tdc.fwd.ln.weight": "time_decay.state_norm.weight"}


@pytest.mark.parametrize("length", [12, 96, 256])
@pytest.mark.parametrize(("conditioner", "gate", "bias"), [
    (True, True, True), (True, True, False), (False, True, True), (False, False, True)],
    ids=["conditioner-gate", "without-biases", "gate", "bare"])
def test_a_converted_softmax_layer_computes_the_reference_layer_and_its_gradients(conditioner, gate, bias, length):
    """Outputs, input gradients and the gradients of the weights held as they are, in float64, at lengths where the
    reference's envelope floor D + 1e-12 has long left eq. 33 (about 28 nats of decay: the weights here decay
    faster than that by 96 tokens)."""
    state = reference_state(conditioner, gate, bias=bias)
    x = torch.randn(2, length, DIMS["D"], dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    cotangent = torch.randn(2, length, DIMS["D"], dtype=torch.float64)
    leaves = {key: tensor.clone().requires_grad_() for key, tensor in state.items()}
    x_reference = x.clone().requires_grad_()
    expected = public_reference_layer(leaves, x_reference, HEADS)
    expected.backward(cotangent)

    attention = fem_attention_from_reference(state, HEADS)
    x_converted = x.clone().requires_grad_()
    output = converted_call(attention, x_converted)
    output.backward(cotangent)
    torch.testing.assert_close(output, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x_converted.grad, x_reference.grad, rtol=1e-9, atol=1e-9)
    parameters = dict(attention.named_parameters())
    for key, name in SAME_TENSOR.items():
        if key in state:
            torch.testing.assert_close(parameters[name].grad, leaves[key].grad, rtol=1e-9, atol=1e-9)


def test_without_the_references_numerics_a_long_sequence_is_another_function():
    """The switch matters: the same weights with eq. 33 evaluated exactly (and the paper's normalisations) leave the
    reference by far more than rounding at 96 tokens, so a converted layer that dropped it would be caught above."""
    state = reference_state()
    x = torch.randn(1, 96, DIMS["D"], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    attention = fem_attention_from_reference(state, HEADS)
    exact = FEMConfig(**{**attention.config.to_dict(), "public_reference_eps": None})
    exact._attn_implementation = "sdpa"
    paper = FEMAttention(exact, layer_idx=0).double()
    paper.load_state_dict(attention.state_dict())
    with torch.no_grad():
        gap = (converted_call(paper, x) - public_reference_layer(state, x, HEADS)).abs().max()
    assert gap > 1e-2


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
    (lambda state: state.pop("tdc.fwd.out_proj"), "softmax", "has no tdc.fwd.out_proj"),
    (lambda state: state.pop("W_o.bias"), "softmax", "missing: o_proj.bias; left over: none"),
    (lambda state: state.pop("tdc.fwd.in_f.bias"), "softmax", "lacks tdc.fwd.in_f.bias beside"),
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


def test_a_model_with_the_references_numerics_decodes_step_by_step_as_it_reads_at_once():
    """The floored envelope's state (cumulative log decay, running sum) carries across cache calls: a prefill and
    one-token steps give the logits of one forward over the whole sequence, past the length where the floor acts."""
    config = FEMConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                       time_decay_rank=4, time_decay_activation="identity", time_decay_bias=True,
                       public_reference_eps=1e-6)
    torch.manual_seed(0)
    model = FEMForCausalLM(config).double().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.time_decay.out_proj.normal_(std=0.5)
            layer.self_attn.time_decay.in_proj.bias.fill_(2.0)  # about 2 nats of decay a token: past 28 by token 15
    ids = torch.randint(0, 32, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(ids).logits
        cache = DynamicCache(config=config)
        pieces = [model(ids[:, :20], cache=cache).logits]
        pieces += [model(ids[:, t:t + 1], cache=cache).logits for t in range(20, 48)]
        exact = FEMForCausalLM(FEMConfig(**{**config.to_dict(), "public_reference_eps": None})).double().eval()
        exact.load_state_dict(model.state_dict())
        assert (exact(ids).logits - whole).abs().max() > 1e-3  # the floor acts at these lengths
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-9, atol=1e-9)
