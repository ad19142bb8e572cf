"""The FEM read (FEM eq. 4-11) and the time-decay scan (FEM App. I) against float64 explicit references."""

import math

import pytest
import torch

from energyzoo.modeling.free_energy import gated_free_energy, outer_gate_activation, softmax_prior_read
from energyzoo.modeling.time_decay import decayed_cumsum


def reference_read(q, k, v, beta, visible):
    """Explicit float64 FEM read: p = masked softmax(q k^T / sqrt(d)); mu = E_p[v];
    f = beta^-1 log sum_i p_i exp(beta v_i) computed as a log-sum-exp over (log p_i + beta v_i)."""
    q, k, v, beta = (t.double() for t in (q, k, v, beta))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~visible, float("-inf"))
    log_p = torch.log_softmax(scores, dim=-1)  # (b, h, q, k)
    mu = log_p.exp() @ v
    beta = beta[None, :, None, :]
    f = torch.logsumexp(log_p[..., None] + (beta * v)[:, :, None, :, :], dim=-2) / beta
    return mu, f


def random_case(seed, batch=2, heads=3, q_len=9, k_len=9, qk_dim=8, v_dim=4, value_scale=3.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, qk_dim, generator=g)
    k = torch.randn(batch, heads, k_len, qk_dim, generator=g)
    v = torch.randn(batch, heads, k_len, v_dim, generator=g) * value_scale
    beta = torch.rand(heads, v_dim, generator=g) * 4.5 + 0.5
    return q, k, v, beta


def causal_visibility(q_len, k_len):
    return torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)


def assert_matches_reference(ours, ref):
    ours, ref = ours.double(), ref
    assert ((ours - ref).abs() <= 1e-4 * (1 + ref.abs())).all(), (ours - ref).abs().max()


@pytest.mark.parametrize("seed", range(4))
def test_causal_read_matches_float64_reference(seed):
    q, k, v, beta = random_case(seed)
    mu, f_max = softmax_prior_read(q, k, v, beta)
    ref_mu, ref_f = reference_read(q, k, v, beta, causal_visibility(9, 9))
    assert_matches_reference(mu, ref_mu)
    assert_matches_reference(f_max, ref_f)


def test_left_padded_and_cached_reads_match_reference():
    q, k, v, beta = random_case(7, q_len=3, k_len=10)
    keys = torch.ones(2, 10, dtype=torch.bool)
    keys[0, :4] = False  # row 0 is left-padded by four
    mask = keys[:, None, None, :]
    mu, f_max = softmax_prior_read(q, k, v, beta, attention_mask=mask, causal=True)
    visible = causal_visibility(3, 10)[None, None] & mask
    ref_mu, ref_f = reference_read(q, k, v, beta, visible)
    assert_matches_reference(mu, ref_mu)
    assert_matches_reference(f_max, ref_f)


def test_additive_float_mask_equals_boolean_mask():
    q, k, v, beta = random_case(8)
    keys = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    keys[1, ..., :2] = False
    additive = torch.zeros(keys.shape).masked_fill(~keys, torch.finfo(torch.float32).min)
    for ours, theirs in zip(softmax_prior_read(q, k, v, beta, keys), softmax_prior_read(q, k, v, beta, additive)):
        torch.testing.assert_close(ours, theirs)


def test_values_beyond_the_cap_are_clipped_consistently():
    q, k, v, beta = random_case(9, value_scale=1.0)
    v = v.clone()
    v[0, 0, 0, 0] = 1e3  # beta * v far above 40
    mu, f_max = softmax_prior_read(q, k, v, beta)
    clipped = v.clone()
    clipped[0, 0, 0, 0] = 40.0 / beta[0, 0]
    ref_mu, ref_f = reference_read(q, k, clipped, beta, causal_visibility(9, 9))
    assert_matches_reference(mu, ref_mu)
    assert_matches_reference(f_max, ref_f)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_inputs_stay_finite_and_obey_jensen(dtype):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 64, 8, generator=g) * 50
    k = torch.randn(2, 2, 64, 8, generator=g) * 50
    v = (torch.rand(2, 2, 64, 4, generator=g) * 2 - 1) * 1e4
    beta = torch.tensor([1e-3, 1.0, 1e2, 1e3]).repeat(2, 1)
    keys = torch.ones(2, 64, dtype=torch.bool)
    keys[0, :40] = False  # with causality, rows 0..39 of batch 0 see no key at all
    mask = keys[:, None, None, :]
    mu, f_max = softmax_prior_read(q.to(dtype), k.to(dtype), v.to(dtype), beta, attention_mask=mask)
    assert torch.isfinite(mu).all() and torch.isfinite(f_max).all()
    assert (f_max >= mu).all()
    assert (mu[0, :, :40] == 0).all() and (f_max[0, :, :40] == 0).all()


def test_free_energy_grows_with_beta_towards_the_max():
    q, k, v, _ = random_case(11, value_scale=1.0)
    assert (8.0 * v.abs() <= 40).all()  # below the exp cap, so no clipping is involved
    low, high, very_high = (torch.full((3, 4), b) for b in (0.5, 2.0, 8.0))
    mu, f_low = softmax_prior_read(q, k, v, low)
    _, f_high = softmax_prior_read(q, k, v, high)
    _, f_very_high = softmax_prior_read(q, k, v, very_high)
    assert (f_low >= mu - 1e-6).all() and (f_high >= f_low - 1e-6).all() and (f_very_high >= f_high - 1e-6).all()
    running_max = torch.cummax(v, dim=-2).values  # the causal support's max (FEM Prop. E.5)
    assert (f_very_high <= running_max + 1e-5).all()


def test_read_gradients_match_finite_differences():
    q, k, v, beta = (t.double().requires_grad_() for t in random_case(12, batch=1, heads=2, q_len=5, k_len=5))

    def read(q, k, v, beta):
        mu, f_max = softmax_prior_read(q, k, v, beta)
        return mu.sum() + (f_max * torch.linspace(0.5, 1.5, f_max.numel()).view_as(f_max).double()).sum()

    assert torch.autograd.gradcheck(read, (q, k, v, beta))


def test_gated_free_energy_is_equation_eleven():
    g = torch.Generator().manual_seed(0)
    mu, f_max, lam, gate = (torch.rand(2, 5, 8, generator=g) for _ in range(4))
    torch.testing.assert_close(gated_free_energy(mu, f_max, lam, gate), gate * ((1 - lam) * mu + lam * f_max))
    torch.testing.assert_close(gated_free_energy(mu, f_max, torch.zeros_like(lam), gate), gate * mu)
    torch.testing.assert_close(gated_free_energy(mu, f_max, None, None), f_max)
    torch.testing.assert_close(gated_free_energy(mu), mu)


def test_outer_gate_is_positive_with_unit_rms_per_head():
    logits = torch.randn(3, 7, 4, 16) * 5
    gate = outer_gate_activation(logits)
    assert (gate > 0).all()
    torch.testing.assert_close(gate.pow(2).mean(-1), torch.ones(3, 7, 4), rtol=1e-4, atol=1e-4)


def loop_reference(log_decay, inputs, initial_state=None):
    state = torch.zeros_like(inputs[:, 0]) if initial_state is None else initial_state.clone()
    states = []
    for t in range(inputs.shape[1]):
        state = log_decay[:, t].exp() * state + inputs[:, t]
        states.append(state)
    return torch.stack(states, dim=1)


@pytest.mark.parametrize("length,chunk", [(1, 16), (7, 16), (37, 4), (300, 8)])
def test_decayed_cumsum_matches_the_recurrence(length, chunk):
    g = torch.Generator().manual_seed(length)
    log_decay = -torch.rand(2, length, 5, generator=g, dtype=torch.float64) * 3
    inputs = torch.randn(2, length, 5, generator=g, dtype=torch.float64)
    initial = torch.randn(2, 5, generator=g, dtype=torch.float64)
    states, final = decayed_cumsum(log_decay, inputs, initial, chunk_size=chunk)
    expected = loop_reference(log_decay, inputs, initial)
    torch.testing.assert_close(states, expected)
    torch.testing.assert_close(final, expected[:, -1])


def test_decayed_cumsum_in_pieces_equals_whole_and_survives_long_strong_decay():
    g = torch.Generator().manual_seed(0)
    log_decay = -torch.rand(1, 9000, 3, generator=g) * 30  # cumulative decay ~ -1e5: exp would underflow
    inputs = torch.randn(1, 9000, 3, generator=g) * 100
    whole, final = decayed_cumsum(log_decay, inputs)
    first, state = decayed_cumsum(log_decay[:, :4000], inputs[:, :4000])
    second, final_pieces = decayed_cumsum(log_decay[:, 4000:], inputs[:, 4000:], state)
    assert torch.isfinite(whole).all()
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)
    torch.testing.assert_close(final_pieces, final)


def test_low_rank_modulation_is_equation_34_with_exact_gradients():
    from energyzoo.modeling.time_decay import TimeDecayConditioner, _LowRankModulation

    g = torch.Generator().manual_seed(0)
    conditioner = TimeDecayConditioner(hidden_size=6, rank=3, out_features=7)
    with torch.no_grad():
        conditioner.out_proj.normal_(generator=g)
    x, y, features = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    expected = torch.cat([x, y], -1) * (1 + features @ conditioner.out_proj)
    torch.testing.assert_close(torch.cat(conditioner.modulate([x, y], features), dim=-1), expected)
    with torch.no_grad():  # the inference path shares one matmul
        torch.testing.assert_close(torch.cat(conditioner.modulate([x, y], features), dim=-1), expected)
    inputs = (x.double().requires_grad_(), features.double().requires_grad_(),
              torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(_LowRankModulation.apply, inputs)
