"""FEM's projections as one matrix multiply (`fem_joint_linears`): the joint product equals the maps one by one, it
never reads a weight that was replaced or edited, and the joint storage survives what a user does to a model
(``.to()``, loading, an optimiser step, saving) without changing a checkpoint. (The layer's values and gradients
against the float64 reference, every prior and switch, are `test_fem.test_fem_layer_matches_the_float64_...`.)"""

import pytest
import torch
from accelerate import PartialState
from accelerate.utils.other import clean_state_dict_for_safetensors
from safetensors.torch import save_file
from test_fem import tiny_fem
from test_fem_contract import perturb_fem
from torch import nn
from transformers import AutoModelForCausalLM

from energyzoo.modeling.configuration_fem import FEM_PRIORS

IDS = torch.randint(3, 97, (2, 11), generator=torch.Generator().manual_seed(0))


def attention_layers(model):
    return [layer.self_attn for layer in model.model.layers]


def joined(model) -> bool:
    return all(layer.joint_projections.joined(layer.joint_projections.linears(layer))
               for layer in attention_layers(model))


def map_by_map(layer, x):
    """Each projection of ``x`` as its own module computes it, side by side: the independent reference."""
    return torch.cat([linear(x) for linear in layer.joint_projections.linears(layer)], dim=-1)


@pytest.mark.parametrize("prior", FEM_PRIORS)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_joint_product_equals_the_maps_one_by_one_in_float64(prior, bias):
    """With and without autograd (the concatenated weights, or the joint storage), with biases on some maps only
    (GLA's and AFT's decay projections always have one)."""
    model = tiny_fem(prior=prior, aft_decay=True, ssm_state_size=4, attention_bias=bias).double()
    layer = attention_layers(model)[0]
    x = torch.randn(2, 5, model.config.hidden_size, dtype=torch.float64)
    assert joined(model)
    with torch.no_grad():
        torch.testing.assert_close(layer.joint_projections(layer, x), map_by_map(layer, x), rtol=1e-14, atol=1e-14)
    x.requires_grad_()
    joint = layer.joint_projections(layer, x)
    upstream = torch.randn(joint.shape, dtype=torch.float64)
    parameters = [p for linear in layer.joint_projections.linears(layer) for p in linear.parameters()] + [x]
    for ours, theirs in zip(torch.autograd.grad(joint, parameters, upstream),
                            torch.autograd.grad(map_by_map(layer, x), parameters, upstream), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=1e-14)


def test_an_edited_weight_is_read_and_a_replaced_one_sends_the_maps_one_by_one():
    model = tiny_fem().double()
    layer = attention_layers(model)[0]
    x = torch.randn(1, 4, model.config.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        layer.k_proj.weight.mul_(3.0)  # in place: the joint matrix is the weight
        torch.testing.assert_close(layer.joint_projections(layer, x), map_by_map(layer, x), rtol=1e-14, atol=1e-14)
        layer.v_proj.weight = nn.Parameter(torch.randn_like(layer.v_proj.weight))  # a tensor of its own
        assert layer.joint_projections(layer, x) is None
        before = model(IDS).logits
        layer.joint_projections.join(layer)
        assert joined(model)
        torch.testing.assert_close(model(IDS).logits, before, rtol=1e-13, atol=1e-13)


def test_a_wrapped_map_is_never_read_through_the_joint_matrix():
    """A map that is no plain nn.Linear (peft's LoRA layers, a subclass) may compute anything: the maps then run one
    by one, with and without autograd."""
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = tiny_fem()
    layer = attention_layers(model)[0]
    wrapped = Scaled(layer.q_proj.in_features, layer.q_proj.out_features, bias=False)
    wrapped.weight = layer.q_proj.weight
    layer.q_proj = wrapped
    x = torch.randn(1, 3, model.config.hidden_size)
    assert layer.joint_projections(layer, x) is None
    with torch.no_grad():
        assert layer.joint_projections(layer, x) is None


def test_the_projections_stay_joined_through_to_loading_and_training_steps(tmp_path):
    model = tiny_fem()
    perturb_fem(model)
    assert joined(model)
    model.double()
    assert joined(model) and attention_layers(model)[0].joint_projections.weight.dtype == torch.float64
    model.float()
    with torch.no_grad():
        expected = model(IDS).logits
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert joined(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, expected, rtol=0, atol=0)

    fresh = tiny_fem()
    fresh.load_state_dict({key: value.clone() for key, value in model.state_dict().items()}, assign=True)
    assert joined(fresh)

    loaded.train()
    optimizer = torch.optim.AdamW(loaded.parameters(), lr=1e-2)
    loaded(IDS, labels=IDS).loss.backward()
    optimizer.step()
    assert joined(loaded)
    loaded.eval()
    layer = attention_layers(loaded)[0]
    x = torch.randn(1, 3, loaded.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(layer.joint_projections(layer, x), map_by_map(layer, x))


def test_saving_keeps_every_projection_and_the_keys_of_the_maps(tmp_path):
    """accelerate's safetensors saving drops all but one of the tensors that share a storage (it takes them for tied
    weights): the state dict gives each map its own copy, so only the tied head goes."""
    PartialState()
    model = tiny_fem()
    state = model.state_dict()
    assert set(state) == {name for name, _ in model.named_parameters(remove_duplicate=False)}
    assert set(state) - set(clean_state_dict_for_safetensors(dict(state))) == {"lm_head.weight"}
    untied = {key: value for key, value in state.items() if key != "lm_head.weight"}
    save_file(untied, tmp_path / "weights.safetensors")  # refuses tensors that share memory
