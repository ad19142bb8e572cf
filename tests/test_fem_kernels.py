"""FEM's priors through the kernel libraries' calling conventions, checked on CPU: each library's own pure-PyTorch
reference stands in for its GPU kernel, and the dispatching code must give the PyTorch path's outputs, gradients
and final recurrent states - prefill, chunked prefill, token-by-token decoding, left padding, fp32 and bf16.

fla (GLA prior): `fla.ops.gla.naive.naive_recurrent_gla` for `chunk_gla` / `fused_recurrent_gla`. mamba-ssm (SSM
prior): `mamba_ssm.modules.ssd_minimal.ssd_minimal_discrete` (the SSD paper's listing) for
`mamba_chunk_scan_combined`. `.ci/run` installs both (mamba-ssm without its CUDA build). flash-attn (softmax prior,
through transformers' attn_implementation="flash_attention_2") ships no CPU reference of its kernel: an SDPA
reference of its documented semantics stands in, inside transformers' own flash-attention path."""

import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from energyzoo import model_from_preset
from energyzoo.modeling import fem_prior_gla, fem_prior_ssm
from energyzoo.modeling.fem_prior_gla import _linear_attention_chunk, fla_scan, gla_free_energy_read
from energyzoo.modeling.fem_prior_ssm import _chunk_scan, mamba_scan, ssm_free_energy_read

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def reference_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, **unused):
    """fla's `chunk_gla` / `fused_recurrent_gla` as its naive recurrence computes them (which fixes the scale at
    key_dim^-1/2: the requested scale is folded into the queries)."""
    from fla.ops.gla.naive import naive_recurrent_gla

    default = q.shape[-1] ** -0.5
    return naive_recurrent_gla(q * ((default if scale is None else scale) / default), k, v, g, initial_state,
                               output_final_state)


def reference_chunk_scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                         dt_softplus=False, return_final_states=False, **unused):
    """mamba-ssm's `mamba_chunk_scan_combined` as its minimal SSD computes it: the kernel multiplies x and A by dt
    and adds D x itself, the minimal form takes them multiplied, per-head B, C and whole chunks."""
    assert z is None and dt_bias is None and not dt_softplus  # FEM passes Delta itself
    from mamba_ssm.modules.ssd_minimal import ssd_minimal_discrete

    length, heads = x.shape[1], x.shape[2]
    B, C = (matrix.repeat_interleave(heads // matrix.shape[2], dim=2) for matrix in (B, C))
    padding = (-length) % chunk_size  # zero steps at the end: no input and no decay
    X, log_decay, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, padding)) for t in (x * dt[..., None], dt * A, B, C))
    y, final = ssd_minimal_discrete(X, log_decay, B, C, chunk_size,
                                    None if initial_states is None else initial_states[:, None])
    y = y[:, :length] + (0 if D is None else D[:, None] * x)
    return (y, final) if return_final_states else y


def reference_flash_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), deterministic=False):
    """flash-attn's `flash_attn_varlen_func` as documented: sequences packed as (total, heads, dim) and delimited
    by cu_seqlens, the causal mask aligned to the bottom-right corner (flash-attn >= 2.1), fp32 accumulation."""
    assert dropout_p == 0.0 and window_size == (-1, -1)
    outputs = []
    for query_span, key_span in zip(zip(cu_seqlens_q[:-1], cu_seqlens_q[1:]), zip(cu_seqlens_k[:-1], cu_seqlens_k[1:])):
        query, key, value = (tensor[start:end].transpose(0, 1).float()
                             for tensor, (start, end) in ((q, query_span), (k, key_span), (v, key_span)))
        length_q, length_k = query.shape[1], key.shape[1]
        mask = torch.ones(length_q, length_k, dtype=torch.bool).tril(length_k - length_q) if causal else None
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=softmax_scale)
        outputs.append(out.transpose(0, 1).to(q.dtype))
    return torch.cat(outputs)


def reference_flash(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    deterministic=False):
    """`flash_attn_func`: (batch, seq, heads, dim), every sequence whole."""
    (batch, length_q), length_k = q.shape[:2], k.shape[1]
    out = reference_flash_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                 torch.arange(batch + 1) * length_q, torch.arange(batch + 1) * length_k, length_q,
                                 length_k, dropout_p, softmax_scale, causal, window_size, deterministic)
    return out.view(batch, length_q, *out.shape[1:])


@pytest.fixture
def flash_on_cpu(monkeypatch):
    """transformers' flash-attention path with the references above as its kernels (and its own pure-PyTorch
    unpad / pad): what runs under attn_implementation="flash_attention_2" with flash-attn on a GPU."""
    from transformers import modeling_flash_attention_utils as flash_utils

    monkeypatch.setattr(flash_utils, "_lazy_imports", lambda *args, **kwargs: (
        reference_flash, reference_flash_varlen, None, flash_utils._pad_input, flash_utils._unpad_input))
    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)


@pytest.fixture
def fla_on_cpu(monkeypatch):
    fla_gla = pytest.importorskip("fla.ops.gla")
    monkeypatch.setattr(fla_gla, "chunk_gla", reference_gla)
    monkeypatch.setattr(fla_gla, "fused_recurrent_gla", reference_gla)


@pytest.fixture
def mamba_on_cpu(monkeypatch):
    if "selective_scan_cuda" not in sys.modules and importlib.util.find_spec("selective_scan_cuda") is None:
        # mamba_ssm imports its compiled selective scan eagerly; built without CUDA it has none
        monkeypatch.setitem(sys.modules, "selective_scan_cuda", types.ModuleType("selective_scan_cuda"))
    ssd_combined = pytest.importorskip("mamba_ssm.ops.triton.ssd_combined")
    monkeypatch.setattr(ssd_combined, "mamba_chunk_scan_combined", reference_chunk_scan)


def draw(generator, dtype, *shape, sign=None):
    """Normal samples, or (sign +1 / -1) magnitudes in [0.1, 1.1) of that sign; a leaf that takes gradients."""
    if sign is None:
        sample = torch.randn(*shape, generator=generator)
    else:
        sample = sign * (torch.rand(*shape, generator=generator) + 0.1)
    return sample.to(dtype).requires_grad_()


def gla_inputs(per_channel: bool, dtype=torch.float32, length=11, seed=0):
    """value, beta, query, key, log decay; beta and value dims as FEMAttention passes them."""
    generator = torch.Generator().manual_seed(seed)
    batch, heads, key_dim, v_dim = 2, 2, 4, 3
    log_decay = draw(generator, dtype, batch, heads, length, key_dim if per_channel else 1, sign=-1)
    beta = (torch.rand(heads, v_dim, generator=generator) + 0.5).to(dtype)
    query, key = (draw(generator, dtype, batch, heads, length, key_dim) for _ in range(2))
    return draw(generator, dtype, batch, length, heads, v_dim), beta, query, key, log_decay


def ssm_inputs(dtype=torch.float32, length=11, seed=0):
    """value, beta, Delta, a, B, C, D as FEMAttention passes them (state size 5)."""
    generator = torch.Generator().manual_seed(seed)
    batch, heads, v_dim, state_size = 2, 2, 3, 5
    return (draw(generator, dtype, batch, length, heads, v_dim),
            (torch.rand(heads, v_dim, generator=generator) + 0.5).to(dtype),
            draw(generator, dtype, batch, length, heads, v_dim, sign=1),
            draw(generator, dtype, heads, v_dim, sign=-1),
            draw(generator, dtype, batch, length, state_size, sign=1),
            draw(generator, dtype, batch, length, state_size, sign=1),
            draw(generator, dtype, heads, v_dim, sign=1))


def gla_read(inputs, kernel, valid=None, state=None, span=slice(None)):
    value, beta, query, key, log_decay = inputs
    return gla_free_energy_read(value[:, span], beta, query[:, :, span], key[:, :, span], log_decay[:, :, span],
                                valid=None if valid is None else valid[:, span], state=state, chunk_size=4,
                                kernel=kernel)


def ssm_read(inputs, kernel, valid=None, state=None, span=slice(None)):
    value, beta, delta, generator, input_matrix, output_matrix, skip = inputs
    return ssm_free_energy_read(value[:, span], beta, delta[:, span], generator, input_matrix[:, span],
                                output_matrix[:, span], skip, valid=None if valid is None else valid[:, span],
                                state=state, chunk_size=4, kernel=kernel)


def assert_close_to_scale(actual, expected, rtol, atol):
    """Close elementwise up to ``atol`` times the largest |expected| (sums over a sequence round with their size)."""
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol,
                               atol=atol * float(expected.detach().float().abs().max()))


def assert_kernel_read_matches_torch(read, inputs, kernel, dtype):
    """Outputs, gradients of every differentiable input and final states of ``read`` with ``kernel`` against
    "torch", on a left-padded batch with ordinary values under the padding."""
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, :3] = False
    trainable = [tensor for tensor in inputs if tensor.requires_grad]
    results = {}
    for name in ("torch", kernel):
        result = read(inputs, name, valid)
        (result.mu.float().square().sum() + result.f_max.float().sin().sum()).backward()
        results[name] = (result, [tensor.grad.clone() for tensor in trainable])
        for tensor in trainable:
            tensor.grad = None
    (torch_read, torch_grads), (kernel_read, kernel_grads) = results["torch"], results[kernel]
    torch.testing.assert_close(kernel_read.mu, torch_read.mu, **TOLERANCE[dtype])
    torch.testing.assert_close(kernel_read.f_max, torch_read.f_max, **TOLERANCE[dtype])
    for kernel_state, torch_state in zip(kernel_read.state, torch_read.state, strict=True):
        assert_close_to_scale(kernel_state, torch_state, **TOLERANCE[dtype])
    for kernel_grad, torch_grad in zip(kernel_grads, torch_grads, strict=True):
        assert_close_to_scale(kernel_grad, torch_grad, **TOLERANCE[dtype])


def assert_decoding_continues_the_torch_read(read, inputs, kernel):
    """On the kernel: a prefill of 4, a second prefill chunk of 4 from its state, then one token at a time with the
    carried state; together they are the whole sequence's torch read, and end in its final state. Left padding."""
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, :6] = False  # the first prefill chunk of row 1 is all padding, the second half
    whole = read(inputs, "torch", valid)
    state, mus, f_maxes = None, [], []
    for span in [slice(0, 4), slice(4, 8)] + [slice(position, position + 1) for position in range(8, 11)]:
        step = read(inputs, kernel, valid, state=state, span=span)
        state = step.state
        mus.append(step.mu)
        f_maxes.append(step.f_max)
    torch.testing.assert_close(torch.cat(mus, dim=1), whole.mu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat(f_maxes, dim=1), whole.f_max, rtol=1e-5, atol=1e-5)
    for carried, expected in zip(state, whole.state, strict=True):
        assert_close_to_scale(carried, expected, rtol=1e-5, atol=1e-5)


def dispatch_reads(monkeypatch, choose) -> None:
    """Every prior's kernel choice made by ``choose`` (in place of `fem_free_energy.read_kernel`)."""
    for prior_module in (fem_prior_gla, fem_prior_ssm):
        monkeypatch.setattr(prior_module, "read_kernel", choose)


def assert_model_kernel_matches_torch(model, kernel, monkeypatch):
    """The whole model with its reads dispatched to ``kernel`` (the CUDA check bypassed) against "torch": logits,
    every parameter's gradient, and greedy generation with the cache (prefill, then one token per call)."""
    ids = torch.randint(4, 200, (2, 13))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    runs = {}
    for name in ("torch", kernel):
        dispatch_reads(monkeypatch, lambda requested, tensor, library, package, name=name: name)
        model.zero_grad()
        outputs = model(input_ids=ids, attention_mask=mask, labels=ids)
        outputs.loss.backward()
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
        runs[name] = (outputs.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, generated)
    torch.testing.assert_close(runs[kernel][0], runs["torch"][0], rtol=1e-4, atol=1e-4)
    for name, gradient in runs["torch"][1].items():
        assert_close_to_scale(runs[kernel][1][name], gradient, rtol=1e-4, atol=1e-4)
    assert torch.equal(runs[kernel][2], runs["torch"][2])


@pytest.mark.parametrize("length", [1, 7])  # fused_recurrent_gla (one decoded token), chunk_gla (prefill)
def test_fla_scan_computes_the_torch_chunk_recurrence_before_normalisation(fla_on_cpu, length):
    """Unnormalised, so that a wrong score scale shows (the read's num / den would cancel it)."""
    generator = torch.Generator().manual_seed(1)
    q, k = (torch.rand(2, 3, length, 4, generator=generator) for _ in range(2))
    values = torch.randn(2, 3, length, 5, generator=generator)
    log_decay = -torch.rand(2, 3, length, 4, generator=generator)
    state = torch.randn(2, 3, 4, 5, generator=generator)
    for actual, expected in zip(fla_scan(q, k, values, log_decay, state),
                                _linear_attention_chunk(q, k, values, log_decay, state), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_gla_dispatch_gives_the_torch_read_outputs_gradients_and_state(fla_on_cpu, per_channel, dtype):
    assert_kernel_read_matches_torch(gla_read, gla_inputs(per_channel, dtype), "fla", dtype)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fla_gla_chunked_prefill_and_decoding_continue_the_torch_read(fla_on_cpu, per_channel):
    assert_decoding_continues_the_torch_read(gla_read, gla_inputs(per_channel), "fla")


def test_a_fem_gla_model_on_the_fla_path_matches_the_torch_path_in_training_and_generation(fla_on_cpu, monkeypatch):
    torch.manual_seed(0)
    model = model_from_preset("fem-gla-tiny", num_hidden_layers=2, gla_decay="channel")
    assert_model_kernel_matches_torch(model, "fla", monkeypatch)


@pytest.mark.parametrize("length", [1, 7])
def test_mamba_scan_computes_the_torch_chunk_scan_of_the_three_streams(mamba_on_cpu, length):
    generator = torch.Generator().manual_seed(1)
    channels, state_size = 6, 5
    streams, state = torch.randn(2, length, 3, channels, generator=generator), torch.randn(2, channels, state_size, 3)
    delta, decay = torch.rand(2, length, channels, generator=generator), -torch.rand(channels, generator=generator)
    input_matrix, output_matrix = (torch.rand(2, length, state_size, generator=generator) for _ in range(2))
    skip = torch.rand(channels, generator=generator)
    arguments = (streams, delta, decay, input_matrix, output_matrix, skip, state)
    for actual, expected in zip(mamba_scan(*arguments), _chunk_scan(*arguments), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mamba_ssd_dispatch_gives_the_torch_read_outputs_gradients_and_state(mamba_on_cpu, dtype):
    assert_kernel_read_matches_torch(ssm_read, ssm_inputs(dtype), "mamba", dtype)


def test_mamba_ssd_chunked_prefill_and_decoding_continue_the_torch_read(mamba_on_cpu):
    assert_decoding_continues_the_torch_read(ssm_read, ssm_inputs(), "mamba")


def test_a_fem_ssm_model_on_the_mamba_path_matches_the_torch_path_in_training_and_generation(mamba_on_cpu,
                                                                                              monkeypatch):
    torch.manual_seed(0)
    model = model_from_preset("fem-lm-tiny", prior="ssm", num_hidden_layers=2)
    with torch.no_grad():  # Delta, a and D away from their initial constants, so the scan's every input acts
        for layer in model.model.layers:
            attention = layer.self_attn
            for parameter in (attention.dt_bias, attention.ssm_generator_raw, attention.ssm_skip_raw):
                parameter.add_(torch.randn_like(parameter))
    assert_model_kernel_matches_torch(model, "mamba", monkeypatch)


@pytest.mark.parametrize("prior, kernel", [("gla", "fla"), ("ssm", "mamba")])
def test_naming_a_kernel_that_cannot_run_here_is_an_error_and_auto_runs_torch(prior, kernel):
    ids = torch.randint(4, 200, (1, 6))
    auto = model_from_preset("fem-lm-tiny", prior=prior, num_hidden_layers=1)
    named = model_from_preset("fem-lm-tiny", prior=prior, num_hidden_layers=1, kernel=kernel)
    named.load_state_dict(auto.state_dict())
    with pytest.raises(ValueError, match=f"kernel='{kernel}' needs CUDA tensors"):
        named(ids)
    named.config.kernel = "torch"
    torch.testing.assert_close(auto(ids).logits, named(ids).logits, rtol=0, atol=0)


def test_auto_picks_the_library_only_for_cuda_tensors_in_a_kernel_dtype_with_the_library_installed(monkeypatch):
    from energyzoo.modeling import fem_free_energy

    def tensor(device="cuda:0", dtype=torch.float32):  # what read_kernel reads of a tensor, without a GPU
        return types.SimpleNamespace(is_cuda=device.startswith("cuda"), dtype=dtype, device=device)

    monkeypatch.setattr(fem_free_energy, "installed", lambda package: package == "fla")
    choose = fem_free_energy.read_kernel
    assert [choose("auto", tensor(dtype=dtype), "fla", "fla") for dtype in (torch.float32, torch.bfloat16,
                                                                           torch.float16)] == ["fla"] * 3
    assert choose("auto", tensor(dtype=torch.float64), "fla", "fla") == "torch"  # the kernels have no float64
    assert choose("auto", tensor("cpu"), "fla", "fla") == "torch"
    assert choose("auto", tensor(), "mamba", "mamba_ssm") == "torch"  # not installed
    assert choose("torch", tensor(), "fla", "fla") == "torch"
    for refused in (tensor(dtype=torch.float64), tensor("cpu")):
        with pytest.raises(ValueError, match="kernel='fla' needs CUDA tensors of at most float32"):
            choose("fla", refused, "fla", "fla")
    with pytest.raises(ValueError, match="mamba_ssm not installed"):
        choose("mamba", tensor(), "mamba", "mamba_ssm")


@pytest.mark.parametrize("prior, refused", [("softmax", "torch"), ("aft", "fla"), ("gla", "mamba"), ("ssm", "flash")])
def test_a_kernel_the_prior_does_not_have_is_refused_by_the_config(prior, refused):
    with pytest.raises(ValueError, match="kernel"):
        model_from_preset("fem-lm-tiny", prior=prior, kernel=refused)


@pytest.mark.parametrize("value_ratio", [0.5, 0.25])  # [v, exp(beta v)] as wide as the queries, or narrower
def test_the_softmax_prior_on_transformers_flash_path_matches_sdpa_in_training_and_generation(flash_on_cpu,
                                                                                             value_ratio):
    """bf16 (the flash path's dtype), left padding (flash-attn's varlen call), cached decoding (queries shorter
    than keys: the bottom-right causal alignment), logits, gradients and greedy tokens."""
    torch.manual_seed(0)
    model = model_from_preset("fem-lm-tiny", num_hidden_layers=2, value_ratio=value_ratio).to(torch.bfloat16)
    ids = torch.randint(4, 200, (2, 13))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    runs = {}
    for implementation in ("sdpa", "flash_attention_2"):
        model.config._attn_implementation = implementation
        model.zero_grad()
        outputs = model(input_ids=ids, attention_mask=mask, labels=ids)
        outputs.loss.backward()
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
        runs[implementation] = (outputs.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()},
                                generated)
    (sdpa_logits, sdpa_grads, sdpa_tokens), (flash_logits, flash_grads, flash_tokens) = runs.values()
    real = mask.bool()
    torch.testing.assert_close(flash_logits[real].float(), sdpa_logits[real].float(), rtol=3e-2, atol=3e-2)
    for name, gradient in sdpa_grads.items():
        assert_close_to_scale(flash_grads[name], gradient, rtol=5e-2, atol=5e-2)
    assert torch.equal(flash_tokens, sdpa_tokens)


def test_the_softmax_prior_on_the_flash_path_refuses_values_wider_than_the_queries(flash_on_cpu):
    model = model_from_preset("fem-lm-tiny", num_hidden_layers=1, value_ratio=1.0).to(torch.bfloat16)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="value_ratio"):
        model(torch.randint(4, 200, (1, 5)))


def test_the_doctor_passes_each_kernel_through_the_references_and_flags_a_wrong_one(fla_on_cpu, mamba_on_cpu,
                                                                                   flash_on_cpu, monkeypatch):
    """`energyzoo doctor` with the references standing in for the kernels on CPU: every (prior, kernel, dtype) it
    can run passes; a kernel that computes something else (fla's gate sign flipped) is reported as a failure."""
    from fla.ops import gla as fla_gla

    from energyzoo.bench import kernels

    monkeypatch.setattr(kernels, "why_not_runnable",
                        lambda package, kernel, dtype, device: "no float32 kernel" if kernel == "flash_attention_2"
                        and dtype == "float32" else None)
    dispatch_reads(monkeypatch, lambda requested, tensor, library, package: requested)
    checks = kernels.run_doctor(device="cpu")
    assert [(c.prior, c.dtype, c.status) for c in checks] == [
        ("softmax", "float32", "not run: no float32 kernel"), ("softmax", "bfloat16", "pass"),
        ("gla", "float32", "pass"), ("gla", "bfloat16", "pass"),
        ("ssm", "float32", "pass"), ("ssm", "bfloat16", "pass")]
    assert all(c.logits_error < 1e-3 for c in checks if c.dtype == "float32" and c.status == "pass")

    monkeypatch.setattr(fla_gla, "chunk_gla", lambda q, k, v, g, **options: reference_gla(q, k, v, -g, **options))
    wrong = kernels.check_kernel("gla", "fla", "float32", "cpu")
    assert wrong.status == "FAIL" and wrong.logits_error > kernels.TOLERANCE["float32"]
