"""FEM's priors through the kernel libraries' calling conventions, checked on CPU: each library's own pure-PyTorch
reference stands in for its GPU kernel, and the dispatching code must give the PyTorch path's outputs, gradients
and final recurrent states - prefill, chunked prefill, token-by-token decoding, left padding, fp32 and bf16."""

import pytest
import torch

fla_gla = pytest.importorskip("fla.ops.gla")
from fla.ops.gla.naive import naive_recurrent_gla  # noqa: E402

from energyzoo.modeling.fem_prior_gla import gla_free_energy_read  # noqa: E402


def reference_kernel(q, k, v, g, scale=None, initial_state=None, output_final_state=False, **unused):
    """fla's `chunk_gla` / `fused_recurrent_gla` as its naive recurrence computes them (which fixes the scale at
    key_dim^-1/2: the requested scale is folded into the queries)."""
    default = q.shape[-1] ** -0.5
    return naive_recurrent_gla(q * ((default if scale is None else scale) / default), k, v, g, initial_state,
                               output_final_state)


@pytest.fixture
def fla_on_cpu(monkeypatch):
    monkeypatch.setattr(fla_gla, "chunk_gla", reference_kernel)
    monkeypatch.setattr(fla_gla, "fused_recurrent_gla", reference_kernel)


def gla_inputs(per_channel: bool, dtype=torch.float32, length=11, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batch, heads, key_dim, v_dim = 2, 2, 4, 3

    def draw(*shape):
        return torch.randn(*shape, generator=generator).to(dtype).requires_grad_()

    decay_width = key_dim if per_channel else 1
    log_decay = (-torch.rand(batch, heads, length, decay_width, generator=generator)).to(dtype).requires_grad_()
    beta = (torch.rand(heads, v_dim, generator=generator) + 0.5).to(dtype)
    return draw(batch, length, heads, v_dim), beta, draw(batch, heads, length, key_dim), \
        draw(batch, heads, length, key_dim), log_decay


def assert_close_to_scale(actual, expected, rtol, atol):
    """Close elementwise up to ``atol`` times the largest |expected| (sums over a sequence round with their size)."""
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol,
                               atol=atol * float(expected.detach().float().abs().max()))


def read(inputs, kernel, valid=None, state=None, span=slice(None)):
    value, beta, query, key, log_decay = inputs
    return gla_free_energy_read(value[:, span], beta, query[:, :, span], key[:, :, span], log_decay[:, :, span],
                                valid=None if valid is None else valid[:, span], state=state, chunk_size=4,
                                kernel=kernel)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_gla_dispatch_gives_the_torch_read_outputs_gradients_and_state(fla_on_cpu, per_channel, dtype):
    inputs = gla_inputs(per_channel, dtype)
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, :3] = False  # left padding, ordinary values under it
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    results = {}
    for kernel in ("torch", "fla"):
        result = read(inputs, kernel, valid)
        (result.mu.float().square().sum() + result.f_max.float().sin().sum()).backward()
        results[kernel] = (result, [tensor.grad.clone() for tensor in (inputs[0], inputs[2], inputs[3], inputs[4])])
        for tensor in (inputs[0], inputs[2], inputs[3], inputs[4]):
            tensor.grad = None
    (torch_read, torch_grads), (fla_read, fla_grads) = results["torch"], results["fla"]
    torch.testing.assert_close(fla_read.mu, torch_read.mu, **tolerance)
    torch.testing.assert_close(fla_read.f_max, torch_read.f_max, **tolerance)
    for fla_state, torch_state in zip(fla_read.state, torch_read.state):
        assert_close_to_scale(fla_state, torch_state, **tolerance)
    for fla_grad, torch_grad in zip(fla_grads, torch_grads):
        assert_close_to_scale(fla_grad, torch_grad, **tolerance)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fla_gla_chunked_prefill_and_decoding_continue_the_torch_read(fla_on_cpu, per_channel):
    inputs = gla_inputs(per_channel)
    whole = read(inputs, "torch")
    prefill = read(inputs, "fla", span=slice(0, 5))
    state, mus = prefill.state, [prefill.mu]
    for position in range(5, 11):  # one token at a time: fla's fused recurrent kernel with the carried state
        step = read(inputs, "fla", state=state, span=slice(position, position + 1))
        state = step.state
        mus.append(step.mu)
    torch.testing.assert_close(torch.cat(mus, dim=1), whole.mu, rtol=1e-5, atol=1e-5)
    for carried, expected in zip(state, whole.state):
        assert_close_to_scale(carried, expected, rtol=1e-5, atol=1e-5)


def test_a_fem_gla_model_on_the_fla_path_matches_the_torch_path_in_training_and_generation(fla_on_cpu, monkeypatch):
    """The whole model with its reads dispatched to fla (the CUDA check bypassed): logits, gradients, and greedy
    generation with the cache (prefill through chunk_gla, each new token through fused_recurrent_gla)."""
    from energyzoo import model_from_preset
    from energyzoo.modeling import modeling_fem

    torch.manual_seed(0)
    model = model_from_preset("fem-gla-tiny", num_hidden_layers=2, gla_decay="channel")
    ids = torch.randint(4, 200, (2, 13))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    runs = {}
    for kernel in ("torch", "fla"):
        monkeypatch.setattr(modeling_fem, "gla_kernel", lambda requested, tensor, kernel=kernel: kernel)
        model.zero_grad()
        outputs = model(input_ids=ids, attention_mask=mask, labels=ids)
        outputs.loss.backward()
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
        runs[kernel] = (outputs.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, generated)
    torch.testing.assert_close(runs["fla"][0], runs["torch"][0], rtol=1e-4, atol=1e-4)
    for name, gradient in runs["torch"][1].items():
        assert_close_to_scale(runs["fla"][1][name], gradient, rtol=1e-4, atol=1e-4)
    assert torch.equal(runs["fla"][2], runs["torch"][2])
