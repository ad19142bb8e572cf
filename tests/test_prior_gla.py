"""The GLA prior's FEM read (FEM App. H.2) against an explicit float64 reference, and its streaming."""

import pytest
import torch

from energyzoo.modeling.prior_gla import gla_free_energy_read


def reference(q, k, v, beta, log_decay, eps=1e-6):
    """Explicit O(T^2) prior: s_t(i) = exp(sum_{i<tau<=t} g_tau) <relu(q_t)+eps, relu(k_i)+eps>, i <= t."""
    q, k, v, beta, log_decay = (t.double() for t in (q, k, v, beta, log_decay))
    q, k = torch.relu(q) + eps, torch.relu(k) + eps
    cumulative = log_decay.cumsum(dim=2)  # (b, h, t, 1 or m)
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    decay = torch.exp(cumulative[:, :, :, None, :] - cumulative[:, :, None, :, :])  # (b, h, t, i, 1|m)
    scores = (q[:, :, :, None, :] * k[:, :, None, :, :] * decay).sum(-1) * causal
    p = scores / scores.sum(-1, keepdim=True)
    mu = p @ v
    f = torch.log(p @ torch.exp(beta * v)) / beta
    return mu, f


def case(seed, length=23, decay="head", heads=2, key_dim=4, v_dim=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, length, key_dim, generator=g)
    k = torch.randn(2, heads, length, key_dim, generator=g)
    v = torch.randn(2, heads, length, v_dim, generator=g) * 3
    beta = torch.rand(1, heads, 1, v_dim, generator=g) * 3 + 0.5
    width = 1 if decay == "head" else key_dim
    log_decay = -torch.rand(2, heads, length, width, generator=g) * 0.5
    return q, k, v, beta, log_decay


@pytest.mark.parametrize("decay,chunk", [("head", 5), ("head", 64), ("channel", 4)])
def test_gla_read_matches_float64_reference(decay, chunk):
    q, k, v, beta, log_decay = case(0, decay=decay)
    mu, f_max, _ = gla_free_energy_read(q, k, v, beta, log_decay, chunk_size=chunk)
    ref_mu, ref_f = reference(q, k, v, beta, log_decay)
    for ours, ref in ((mu, ref_mu), (f_max, ref_f)):
        assert ((ours.double() - ref).abs() <= 1e-4 * (1 + ref.abs())).all()


def test_prefill_chunked_prefill_and_token_steps_agree():
    q, k, v, beta, log_decay = case(1, length=40)
    full_mu, full_f, full_state = gla_free_energy_read(q, k, v, beta, log_decay, chunk_size=8)
    pieces, state = [], None
    for start, stop in ((0, 13), (13, 14), (14, 31), (31, 40)):
        piece = slice(start, stop)
        mu, f_max, state = gla_free_energy_read(q[:, :, piece], k[:, :, piece], v[:, :, piece], beta,
                                                log_decay[:, :, piece], state=state, chunk_size=8)
        pieces.append((mu, f_max))
    steps, step_state = [], None
    for t in range(40):
        piece = slice(t, t + 1)
        mu, f_max, step_state = gla_free_energy_read(q[:, :, piece], k[:, :, piece], v[:, :, piece], beta,
                                                     log_decay[:, :, piece], state=step_state)
        steps.append((mu, f_max))
    for parts in (pieces, steps):
        torch.testing.assert_close(torch.cat([p[0] for p in parts], 2), full_mu, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.cat([p[1] for p in parts], 2), full_f, rtol=1e-4, atol=1e-4)
    # the exp shifts differ between the three paths, the states they describe do not
    for state in (state, step_state):
        scale = torch.exp(state[1] - full_state[1])
        v_dim = v.shape[-1]
        torch.testing.assert_close(state[0][..., v_dim:2 * v_dim] * scale, full_state[0][..., v_dim:2 * v_dim],
                                   rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sequences_with_huge_values_and_strong_decay_stay_finite(dtype):
    g = torch.Generator().manual_seed(2)
    length = 8192
    q = torch.randn(1, 2, length, 4, generator=g).to(dtype)
    k = torch.randn(1, 2, length, 4, generator=g).to(dtype)
    v = ((torch.rand(1, 2, length, 3, generator=g) * 2 - 1) * 1e3).to(dtype)
    beta = torch.tensor([1e-3, 1.0, 1e3]).view(1, 1, 1, 3).repeat(1, 2, 1, 1)
    log_decay = -torch.rand(1, 2, length, 1, generator=g) * 20  # cumulative decay ~ -1e5
    mu, f_max, (state, shift) = gla_free_energy_read(q, k, v, beta, log_decay, chunk_size=256)
    assert mu.dtype == dtype
    for tensor in (mu, f_max, state, shift):
        assert torch.isfinite(tensor).all()
    assert (f_max >= mu).all()
    # values are read within their range: the mean of a set of values cannot leave [min, max]
    assert (mu.float().abs() <= 1e3 * 1.01).all()


def test_padding_neither_enters_nor_changes_the_state():
    q, k, v, beta, log_decay = case(3, length=12)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[0, :4] = False
    mu, f_max, (state, _) = gla_free_energy_read(q, k, v, beta, log_decay, valid=valid)
    alone_mu, alone_f, (alone_state, _) = gla_free_energy_read(
        q[:1, :, 4:], k[:1, :, 4:], v[:1, :, 4:], beta, log_decay[:1, :, 4:]
    )
    torch.testing.assert_close(mu[0, :, 4:], alone_mu[0])
    torch.testing.assert_close(f_max[0, :, 4:], alone_f[0])
    assert (mu[0, :, :4] == 0).all() and (f_max[0, :, :4] == 0).all()
