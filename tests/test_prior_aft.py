"""The AFT prior's FEM read (FEM App. H.3) against an explicit float64 reference, and its streaming."""

import pytest
import torch

from energyzoo import FEMConfig
from energyzoo.modeling.modeling_fem import FEMAttention
from energyzoo.modeling.prior_aft import aft_free_energy_read

from streaming import assert_streaming_agrees


def reference(logits, v, beta, log_decay):
    """p_t(i) ∝ exp(k_i + sum_{i<tau<=t} g_tau) per channel, i <= t, built explicitly."""
    logits, v, beta, log_decay = (t.double() for t in (logits, v, beta, log_decay))
    cumulative = log_decay.cumsum(1)
    length = logits.shape[1]
    log_weights = logits[:, None] + cumulative[:, :, None] - cumulative[:, None, :]  # (b, t, i, c)
    causal = torch.ones(length, length, dtype=torch.bool).tril()[None, :, :, None]
    log_p = torch.log_softmax(log_weights.masked_fill(~causal, float("-inf")), dim=2)
    mu = (log_p.exp() * v[:, None]).sum(2)
    f_max = torch.logsumexp(log_p + beta * v[:, None], dim=2) / beta
    return mu, f_max


def case(seed, length=21, channels=5, decay=True):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, length, channels, generator=g) * 3
    v = torch.randn(2, length, channels, generator=g) * 3
    beta = torch.rand(channels, generator=g) * 3 + 0.5
    log_decay = -torch.rand(2, length, channels, generator=g) if decay else torch.zeros(2, length, channels)
    return logits, v, beta, log_decay


@pytest.mark.parametrize("decay,chunk", [(False, 4), (True, 4), (True, 64)])
def test_aft_read_matches_float64_reference(decay, chunk):
    logits, v, beta, log_decay = case(0, decay=decay)
    mu, f_max, _ = aft_free_energy_read(logits, v, beta, log_decay if decay else None, chunk_size=chunk)
    ref_mu, ref_f = reference(logits, v, beta, log_decay)
    for ours, ref in ((mu, ref_mu), (f_max, ref_f)):
        assert ((ours.double() - ref).abs() <= 1e-4 * (1 + ref.abs())).all()


def test_prefill_chunked_prefill_and_token_steps_agree():
    logits, v, beta, log_decay = case(1, length=40)

    def read(start, stop, state):
        piece = slice(start, stop)
        return aft_free_energy_read(logits[:, piece], v[:, piece], beta, log_decay[:, piece], state=state, chunk_size=8)

    assert_streaming_agrees(read, 40, time_dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sequences_with_huge_values_and_strong_decay_stay_finite(dtype):
    g = torch.Generator().manual_seed(2)
    length = 8192
    logits = (torch.randn(1, length, 3, generator=g) * 50).to(dtype)
    v = ((torch.rand(1, length, 3, generator=g) * 2 - 1) * 1e3).to(dtype)
    beta = torch.tensor([1e-3, 1.0, 1e3])
    log_decay = -torch.rand(1, length, 3, generator=g) * 20  # cumulative decay ~ -1e5
    mu, f_max, state = aft_free_energy_read(logits, v, beta, log_decay, chunk_size=64)
    assert mu.dtype == dtype
    for tensor in (mu, f_max, *state):
        assert torch.isfinite(tensor).all()
    assert (f_max >= mu).all() and (mu.float().abs() <= 1e3 * 1.01).all()


def test_padding_neither_enters_nor_changes_the_state():
    logits, v, beta, log_decay = case(3, length=12)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[0, :4] = False
    mu, f_max, _ = aft_free_energy_read(logits, v, beta, log_decay, valid=valid)
    alone_mu, alone_f, _ = aft_free_energy_read(logits[:1, 4:], v[:1, 4:], beta, log_decay[:1, 4:])
    torch.testing.assert_close(mu[0, 4:], alone_mu[0])
    torch.testing.assert_close(f_max[0, 4:], alone_f[0])
    assert (mu[0, :4] == 0).all() and (f_max[0, :4] == 0).all()


def test_aft_layer_has_channel_logits_and_no_queries():
    config = FEMConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=1,
                       vocab_size=50, prior="aft", aft_decay=True)
    layer = FEMAttention(config, 0)
    assert not hasattr(layer, "q_proj")
    assert layer.k_proj.out_features == layer.v_proj.out_features == config.value_width
    assert layer.decay_proj.out_features == config.value_width
    assert not hasattr(FEMAttention(FEMConfig(**{**config.to_dict(), "aft_decay": False}), 0), "decay_proj")
