"""`ParameterCache`: a value of a parameter kept between calls is never stale (an in-place write, a replaced tensor, a
dtype change), carries gradients when autograd asks, and FEM's beta_max through it equals eq. 9 computed afresh."""

import torch
import torch.nn.functional as F
from test_fem import tiny_fem
from torch import nn

from energyzoo.modeling.fem_parameter_cache import ParameterCache


def counted_square():
    calls = []

    def square(parameter):
        calls.append(1)
        return parameter.detach().square() if not torch.is_grad_enabled() else parameter.square()

    return ParameterCache(square), calls


def test_the_value_is_computed_again_exactly_when_the_parameter_changed():
    parameter = nn.Parameter(torch.tensor([1.0, 2.0]))
    cache, calls = counted_square()
    with torch.no_grad():
        assert cache(parameter).tolist() == [1.0, 4.0] and cache(parameter).tolist() == [1.0, 4.0]
        assert len(calls) == 1
        parameter.add_(1.0)  # in place: the version counter moves
        assert cache(parameter).tolist() == [4.0, 9.0]
        parameter.data = torch.tensor([3.0, 0.5])  # a tensor of its own, even at a reused address
        assert cache(parameter).tolist() == [9.0, 0.25]
        parameter.data = parameter.data.double()
        assert cache(parameter).dtype == torch.float64
    assert len(calls) == 4


def test_under_autograd_every_call_computes_a_value_that_carries_the_gradient():
    parameter = nn.Parameter(torch.tensor([3.0]))
    cache, calls = counted_square()
    (gradient,) = torch.autograd.grad(cache(parameter).sum(), parameter)
    assert gradient.item() == 6.0
    cache(parameter)
    assert len(calls) == 2


def test_fems_beta_max_follows_its_parameter_through_optimiser_steps_and_moves():
    model = tiny_fem()
    layer = model.model.layers[0].self_attn

    def eq_9():
        return F.softplus(layer.beta_max_raw.detach().double() + layer.beta_max_offset).view(-1, layer.value_head_dim)

    with torch.no_grad():
        first = layer.beta_max()
        assert layer.beta_max() is first  # kept
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    ids = torch.randint(3, 97, (2, 7))
    model(ids, labels=ids).loss.backward()
    assert layer.beta_max_raw.grad.abs().sum() > 0  # the trained value carried its gradient
    optimizer.step()
    with torch.no_grad():
        torch.testing.assert_close(layer.beta_max().double(), eq_9())
        assert not torch.equal(layer.beta_max(), first)
        model.double()
        assert layer.beta_max().dtype == torch.float64
        torch.testing.assert_close(layer.beta_max(), eq_9(), rtol=1e-15, atol=0)


def test_a_copied_or_pickled_model_computes_what_the_original_does(tmp_path):
    """The caches and the joint projections travel with `copy.deepcopy` and `torch.save` of the whole model, and a
    copy never reads the original's tensors."""
    import copy

    model = tiny_fem()
    ids = torch.randint(3, 97, (2, 7))
    with torch.no_grad():
        expected = model(ids).logits
        twin = copy.deepcopy(model)
        torch.save(model, tmp_path / "model.pt")
        loaded = torch.load(tmp_path / "model.pt", weights_only=False)
        for other in (twin, loaded):
            torch.testing.assert_close(other(ids).logits, expected, rtol=0, atol=0)
        model.model.layers[0].self_attn.beta_max_raw.add_(1.0)
        model.model.layers[0].self_attn.k_proj.weight.mul_(2.0)
        assert not torch.allclose(model(ids).logits, expected)
        torch.testing.assert_close(twin(ids).logits, expected, rtol=0, atol=0)
