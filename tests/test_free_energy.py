"""The softmax read's mask forms and monotonicity in beta (FEM Thm. 2.8), the gates (FEM eq. 10-11) and the
time-decay scan and modulation (FEM App. I) against explicit references. Every prior's read against float64:
test_fem_reads.py."""

import pytest
import torch

from energyzoo.modeling.fem_free_energy import gated_free_energy, outer_gate_activation
from energyzoo.modeling.fem_prior_softmax import softmax_free_energy_read
from energyzoo.modeling.fem_time_decay import decayed_cumsum


def random_case(seed, batch=2, heads=3, length=9, qk_dim=8, v_dim=4, value_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, length, qk_dim, generator=g)
    key = torch.randn(batch, heads, length, qk_dim, generator=g)
    value = torch.randn(batch, length, heads, v_dim, generator=g) * value_scale
    return query, key, value


def test_additive_float_mask_equals_boolean_mask():
    """The eager attention function gets an additive mask, SDPA a boolean one: the read is the same."""
    query, key, value = random_case(8)
    beta = torch.full((3, 4), 2.0)
    keys = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    keys[1, ..., :2] = False
    visible = keys & torch.ones(9, 9, dtype=torch.bool).tril()
    additive = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    boolean = softmax_free_energy_read(value, beta, query, key, attention_mask=visible)
    floating = softmax_free_energy_read(value, beta, query, key, attention_mask=additive)
    real = torch.tensor([True, True])[:, None].expand(2, 9).clone()
    real[1, :2] = False
    for ours, theirs in zip(boolean[:2], floating[:2]):
        torch.testing.assert_close(ours[real], theirs[real])


def test_free_energy_grows_with_beta_towards_the_running_max():
    """FEM Thm. 2.8: F(beta) is nondecreasing in beta, from mu (beta -> 0) towards the max of the support
    (Prop. E.5); below the cap, so no clipping is involved."""
    query, key, value = random_case(11)
    assert (8.0 * value.abs() <= 40).all()
    reads = [softmax_free_energy_read(value, torch.full((3, 4), beta), query, key) for beta in (0.5, 2.0, 8.0)]
    mu = reads[0].mu
    f_low, f_high, f_very_high = (read.f_max for read in reads)
    assert (f_low >= mu - 1e-6).all() and (f_high >= f_low - 1e-6).all() and (f_very_high >= f_high - 1e-6).all()
    assert (f_very_high > f_low + 1e-3).any()
    running_max = torch.cummax(value, dim=1).values  # the causal support's max
    assert (f_very_high <= running_max + 1e-5).all()


def test_without_beta_the_read_is_plain_attention():
    """The "L" switch off reads mu only: softmax attention over v, as in Llama."""
    query, key, value = random_case(12)
    read = softmax_free_energy_read(value, None, query, key)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value.transpose(1, 2), is_causal=True)
    assert read.f_max is None
    torch.testing.assert_close(read.mu, expected.transpose(1, 2))


def test_gated_free_energy_is_equation_eleven():
    g = torch.Generator().manual_seed(0)
    mu, f_max, lam, gate = (torch.rand(2, 5, 8, generator=g) for _ in range(4))
    torch.testing.assert_close(gated_free_energy(mu, f_max, lam, gate), gate * ((1 - lam) * mu + lam * f_max))
    torch.testing.assert_close(gated_free_energy(mu, f_max, torch.zeros_like(lam), gate), gate * mu)
    torch.testing.assert_close(gated_free_energy(mu, f_max, None, None), f_max)
    torch.testing.assert_close(gated_free_energy(mu), mu)


def test_outer_gate_is_the_softplus_over_its_root_mean_square_per_head():
    logits = torch.randn(3, 7, 4, 16, generator=torch.Generator().manual_seed(0)) * 5
    logits[0, 0, 0] = -30.0  # a head whose softplus is ~1e-13 everywhere: eps decides its scale
    softplus = torch.log1p(logits.double().exp())  # float64 reference, FEM §2.3.2
    expected = softplus / (softplus.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(outer_gate_activation(logits), expected.float(), rtol=1e-5, atol=1e-7)


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


def test_modulation_is_equation_34():
    """x_i (1 + c_i) with c = h W_c split into one column block per modulated tensor (FEM eq. 34a-d)."""
    from energyzoo.modeling.fem_time_decay import TimeDecayConditioner

    g = torch.Generator().manual_seed(0)
    conditioner = TimeDecayConditioner(hidden_size=6, rank=3, out_features=7)
    with torch.no_grad():
        conditioner.out_proj.normal_(generator=g)
    x, y, features = (torch.randn(2, 5, width, generator=g) for width in (4, 3, 3))
    c = torch.einsum("btr,ro->bto", features, conditioner.out_proj)
    expected = [x * (1 + c[..., :4]), y * (1 + c[..., 4:])]
    for ours, theirs in zip(conditioner.modulate([x, y], features), expected):
        torch.testing.assert_close(ours, theirs)
    with torch.no_grad():  # inference: each block computed on its own and applied in place to its tensor
        fresh = [x.clone(), y.clone()]
        in_place = conditioner.modulate(fresh, features)
    for ours, given, theirs in zip(in_place, fresh, expected, strict=True):
        assert ours.data_ptr() == given.data_ptr()
        torch.testing.assert_close(ours, theirs)


def test_the_restored_free_energy_without_autograd_is_the_closed_form_and_mu_where_no_key_is_seen():
    """f_max = (M + log Z) / beta, and mu on rows whose partition Z is 0 (they see no key), in float64: the
    inference path (in place on one buffer) and the autograd one give the closed form."""
    from energyzoo.modeling.fem_free_energy import restore_free_energy

    g = torch.Generator().manual_seed(1)
    mu = torch.randn(2, 5, 3, 4, dtype=torch.float64, generator=g)
    partition = torch.rand(2, 5, 3, 4, dtype=torch.float64, generator=g) + 1e-3
    partition[0, :2] = 0.0  # two rows of padding
    shift = torch.randn(2, 1, 3, 4, dtype=torch.float64, generator=g)
    beta = torch.rand(3, 4, dtype=torch.float64, generator=g) + 0.5
    expected = (shift + torch.log(partition.clamp_min(1e-300))) / beta
    expected[0, :2] = mu[0, :2]
    with torch.no_grad():
        torch.testing.assert_close(restore_free_energy(mu, partition, shift, beta), expected, rtol=1e-14, atol=0)
    graded = restore_free_energy(mu.requires_grad_(), partition.requires_grad_(), shift, beta.requires_grad_())
    torch.testing.assert_close(graded, expected, rtol=1e-14, atol=0)
    graded.sum().backward()
    assert torch.isfinite(partition.grad).all() and (partition.grad[0, :2] == 0).all()
