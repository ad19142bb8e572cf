"""The SSM prior's FEM read (FEM App. H.4) against an explicit float64 reference, and its streaming."""

import pytest
import torch
import torch.nn.functional as F

from energyzoo.modeling.prior_ssm import ssm_free_energy_read

from streaming import assert_streaming_agrees


def reference(v, beta, delta, generator, input_matrix, output_matrix, skip):
    """s_t(i) = exp(sum_{i<tau<=t} Delta_tau a) (C_t . B_i) Delta_i + D 1{i=t}, built explicitly."""
    v, beta, delta, generator, input_matrix, output_matrix, skip = (
        t.double() for t in (v, beta, delta, generator, input_matrix, output_matrix, skip)
    )
    length = v.shape[1]
    cumulative = (delta * generator).cumsum(1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()[None, :, :, None]
    decay = torch.exp(cumulative[:, :, None] - cumulative[:, None]) * causal
    scores = decay * (output_matrix @ input_matrix.transpose(1, 2))[..., None] * delta[:, None]
    scores = scores + torch.eye(length, dtype=torch.float64)[None, :, :, None] * skip
    p = scores / scores.sum(2, keepdim=True)
    mu = (p * v[:, None]).sum(2)
    f_max = torch.log((p * torch.exp(beta * v[:, None])).sum(2)) / beta
    return mu, f_max


def case(seed, length=23, channels=5, state_size=3, decay_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(2, length, channels, generator=g) * 3
    beta = torch.rand(channels, generator=g) * 3 + 0.5
    delta = F.softplus(torch.randn(2, length, channels, generator=g)) * decay_scale
    generator = -F.softplus(torch.randn(channels, generator=g))
    input_matrix = F.softplus(torch.randn(2, length, state_size, generator=g))
    output_matrix = F.softplus(torch.randn(2, length, state_size, generator=g))
    skip = F.softplus(torch.randn(channels, generator=g))
    return v, beta, delta, generator, input_matrix, output_matrix, skip


@pytest.mark.parametrize("chunk", [4, 64])
def test_ssm_read_matches_float64_reference(chunk):
    inputs = case(0)
    mu, f_max, _ = ssm_free_energy_read(*inputs, chunk_size=chunk)
    ref_mu, ref_f = reference(*inputs)
    for ours, ref in ((mu, ref_mu), (f_max, ref_f)):
        assert ((ours.double() - ref).abs() <= 1e-4 * (1 + ref.abs())).all()


def test_prefill_chunked_prefill_and_token_steps_agree():
    v, beta, delta, generator, input_matrix, output_matrix, skip = case(1, length=40)

    def read(start, stop, state):
        piece = slice(start, stop)
        return ssm_free_energy_read(v[:, piece], beta, delta[:, piece], generator, input_matrix[:, piece],
                                    output_matrix[:, piece], skip, state=state, chunk_size=8)

    assert_streaming_agrees(read, 40, time_dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sequences_with_huge_values_and_strong_decay_stay_finite(dtype):
    v, beta, delta, generator, input_matrix, output_matrix, skip = case(2, length=8192, channels=3, decay_scale=20.0)
    v = ((torch.rand(v.shape, generator=torch.Generator().manual_seed(5)) * 2 - 1) * 1e3).to(dtype)
    beta = torch.tensor([1e-3, 1.0, 1e3])
    mu, f_max, state = ssm_free_energy_read(v, beta, delta, generator, input_matrix, output_matrix, skip, chunk_size=64)
    assert mu.dtype == dtype
    for tensor in (mu, f_max, *state):
        assert torch.isfinite(tensor).all()
    assert (f_max >= mu).all() and (mu.float().abs() <= 1e3 * 1.01).all()


def test_padding_neither_enters_nor_changes_the_state():
    v, beta, delta, generator, input_matrix, output_matrix, skip = case(3, length=12)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[0, :4] = False
    mu, f_max, _ = ssm_free_energy_read(v, beta, delta, generator, input_matrix, output_matrix, skip, valid=valid)
    alone_mu, alone_f, _ = ssm_free_energy_read(v[:1, 4:], beta, delta[:1, 4:], generator, input_matrix[:1, 4:],
                                                output_matrix[:1, 4:], skip)
    torch.testing.assert_close(mu[0, 4:], alone_mu[0])
    torch.testing.assert_close(f_max[0, 4:], alone_f[0])
    assert (mu[0, :4] == 0).all() and (f_max[0, :4] == 0).all()
