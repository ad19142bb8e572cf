"""Every FEM prior's read (FEM eq. 4-9 with App. H.1-H.4) against the explicit float64 references of
`fem_reference`: outputs and gradients, on left-padded batches whose padding holds ordinary values, with
values near and beyond the |beta v| <= 40 cap, in every dtype, streamed in pieces or token by token."""

import pytest
import torch
from fem_reference import CAP, PRIOR_CASES, explicit_read
from transformers.cache_utils import CacheLayerMixin

from energyzoo.modeling.configuration_fem import FEM_PRIORS, PRIORS


def causal_mask(valid, start, stop):
    """The boolean mask `create_causal_mask` builds for SDPA: queries [start, stop) over keys [0, stop)."""
    queries = torch.arange(start, stop)[:, None]
    return (torch.arange(stop)[None, :] <= queries)[None, None] & valid[:, None, None, :stop]


class Case:
    """One prior's inputs (float64) and how to read a slice of positions [start, stop) with a state: its selection
    drawn as its test row says (`fem_reference.PRIOR_CASES`), its read called as its row (`PriorSpec`) says."""

    def __init__(self, prior, seed=0, batch=2, length=23, heads=2, v_dim=3, key_dim=4, value_scale=12.0, pad=5,
                 gla_decay="head"):
        g = torch.Generator().manual_seed(seed)
        self.spec, self.case, self.length = PRIORS[prior], PRIOR_CASES[prior], length
        self.value = torch.randn(batch, length, heads, v_dim, generator=g, dtype=torch.float64) * value_scale
        self.beta = torch.rand(heads, v_dim, generator=g, dtype=torch.float64) * 3 + 0.5
        self.valid = torch.ones(batch, length, dtype=torch.bool)
        self.valid[0, :pad] = False  # left padding; the padded positions hold ordinary values
        self.selection = self.case.draw(g, self.value, key_dim, gla_decay)

    def stress(self):
        """Sharp priors and strong decays (each prior's own factors): e.g. softmax scores x2500, GLA/AFT cumulative
        decays ~ -1e5 over 8192 positions, AFT logits x50, SSM step sizes x20."""
        self.selection = [s * factor for s, factor in zip(self.selection, self.case.stress, strict=True)]

    def tensors(self):
        return [self.value, self.beta, *self.selection]

    def read(self, value, beta, *selection, start=0, stop=None, state=None, chunk_size=4):
        """Our read of positions [start, stop) (inputs given for all positions)."""
        stop = self.length if stop is None else stop
        piece = slice(start, stop)
        sliced = [s if axis is None else s[(slice(None),) * axis + (piece,)]
                  for s, axis in zip(selection, self.case.time_axes, strict=True)]
        if self.spec.attention_function:  # its cache layer is its state; the mask is the one SDPA takes
            state = self.spec.cache_layers[0]() if state is None else state
            options = dict(attention_mask=causal_mask(self.valid, start, stop))
        else:
            options = dict(valid=self.valid[:, piece], chunk_size=chunk_size)
        return self.spec.read(value[:, piece], beta, *sliced, state=state, **options)

    def reference(self, value, beta, *selection):
        """(mu, f) in float64 from the explicit prior."""
        return explicit_read(self.case.reference(*selection, valid=self.valid), value, beta)


def state_tensors(state) -> tuple:
    """The tensors of a read's state: a cache layer (the softmax prior's) holds keys, augmented values and the
    shift."""
    return (state.keys, state.values, state.exp_shift) if isinstance(state, CacheLayerMixin) else state


def assert_close_to_reference(ours, ref, valid, tolerance):
    real = valid[:, :, None, None].expand_as(ref)
    error = (ours.double() - ref).abs()[real]
    assert (error <= tolerance * (1 + ref.abs()[real])).all(), error.max()


@pytest.mark.parametrize("prior,gla_decay", [(prior, "head") for prior in FEM_PRIORS] + [("gla", "channel")])
@pytest.mark.parametrize("chunk_size", [4, 64])
def test_read_matches_the_float64_reference_on_a_left_padded_batch(prior, gla_decay, chunk_size):
    case = Case(prior, gla_decay=gla_decay)
    scaled = (case.beta * case.value).abs()
    assert ((scaled > 30) & (scaled < CAP)).any() and (scaled > CAP).any()  # near and beyond the cap
    mu, f_max, _, _ = case.read(*(t.float() for t in case.tensors()), chunk_size=chunk_size)
    ref_mu, ref_f = case.reference(*case.tensors())
    assert_close_to_reference(mu, ref_mu, case.valid, 1e-4)
    assert_close_to_reference(f_max, ref_f, case.valid, 1e-4)
    # padded query rows see no key: they read 0
    assert (mu[0, :5] == 0).all() and (f_max[0, :5] == 0).all()


@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_read_gradients_match_the_float64_reference(prior):
    """Gradients of every input, padded positions included (they must get none), against autograd through
    the explicit reference."""
    case = Case(prior, seed=1)
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(case.value.shape, generator=g, dtype=torch.float64) * case.valid[..., None, None]
               for _ in range(2)]

    def gradients(fn):
        inputs = [t.clone().requires_grad_() for t in case.tensors()]
        mu, f_max = fn(*inputs)[:2]
        ((mu * weights[0]).sum() + (f_max * weights[1]).sum()).backward()
        return [t.grad for t in inputs]

    ours, reference = gradients(case.read), gradients(case.reference)
    for name, mine, theirs in zip(["value", "beta", "selection 0", "selection 1", "selection 2", "selection 3",
                                   "selection 4"], ours, reference):
        assert torch.isfinite(mine).all(), name
        torch.testing.assert_close(mine, theirs, rtol=1e-7, atol=1e-9, msg=name)
    assert (ours[0][0, :5] == 0).all()  # padded values do not reach the output


@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_gradcheck_with_a_padding_mask(prior):
    case = Case(prior, seed=3, length=7, heads=1, v_dim=2, key_dim=2, value_scale=4.0, pad=3)
    g = torch.Generator().manual_seed(4)
    weights = torch.randn(2, *case.value.shape, generator=g, dtype=torch.float64)

    def read(*inputs):
        mu, f_max = case.read(*inputs, chunk_size=3)[:2]
        return (mu * weights[0]).sum() + (f_max * weights[1]).sum()

    assert torch.autograd.gradcheck(read, [t.clone().requires_grad_() for t in case.tensors()])


@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_prefill_chunked_prefill_and_token_steps_agree(prior):
    """A cache's state carried across calls gives the read of one call: uneven pieces and single tokens."""
    case = Case(prior, seed=5, length=40)
    inputs = [t.float() for t in case.tensors()]
    full_mu, full_f, _, _ = case.read(*inputs, chunk_size=8)
    for bounds in (((0, 13), (13, 14), (14, 31), (31, 40)), tuple((t, t + 1) for t in range(40))):
        state, mus, f_maxes = None, [], []
        for start, stop in bounds:
            mu, f_max, state, _ = case.read(*inputs, start=start, stop=stop, state=state, chunk_size=8)
            mus.append(mu)
            f_maxes.append(f_max)
        torch.testing.assert_close(torch.cat(mus, 1), full_mu, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.cat(f_maxes, 1), full_f, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prior", [name for name, prior in PRIORS.items() if prior.recurrent])
def test_streamed_recurrent_states_equal_the_full_reads_state(prior):
    """The fixed-size state a cache keeps after prefill, chunked prefill or token steps is the same (the
    shift M is the running max in every path, and the sums are rescaled whenever it rises)."""
    case = Case(prior, seed=9, length=40)
    inputs = [t.float() for t in case.tensors()]
    full_state = case.read(*inputs, chunk_size=8).state
    for bounds in (((0, 13), (13, 14), (14, 31), (31, 40)), tuple((t, t + 1) for t in range(40))):
        state = None
        for start, stop in bounds:
            state = case.read(*inputs, start=start, stop=stop, state=state, chunk_size=8).state
        for ours, full in zip(state, full_state):
            torch.testing.assert_close(ours, full, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("prior", FEM_PRIORS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_reads_keep_the_lse_branch(prior, dtype):
    """bf16 and fp16 reads against float64 on the same (rounded) inputs, at a tolerance well below the LSE
    branch's own size f - mu: a branch that collapsed to mu (fp16 underflow of exp(beta v - M)) fails."""
    case = Case(prior, seed=6, value_scale=6.0)
    rounded = [t.to(dtype) for t in case.tensors()]
    rounded[1] = case.beta.float()  # beta_max is an fp32 parameter function in the model
    mu, f_max, state, _ = case.read(*rounded)
    assert mu.dtype == dtype and f_max.dtype == dtype
    ref_mu, ref_f = case.reference(*(t.double() for t in rounded))
    real = case.valid[:, :, None, None].expand_as(ref_f)
    lse_effect = (ref_f - ref_mu).abs()[real].mean()
    assert lse_effect > 1.0
    error = (f_max.double() - ref_f).abs()[real]
    assert error.mean() < 0.02 * lse_effect and error.max() < 0.2 * lse_effect, (error.mean(), lse_effect)
    assert ((mu.double() - ref_mu).abs()[real]).mean() < 0.02 * lse_effect
    assert all(torch.isfinite(t).all() for t in state_tensors(state) if t is not None)


@pytest.mark.parametrize("prior", FEM_PRIORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_long_sequences_with_extreme_values_stay_finite_and_in_range(prior, dtype):
    """8192 positions, values up to 1e3 with beta from 1e-3 to 1e3 (clipped to |beta v| <= 40), sharp priors
    and strong decays (cumulative ~ -1e5): finite, and mu stays within the values' range (it is a mean)."""
    case = Case(prior, seed=7, length=8192, heads=1, v_dim=3, value_scale=1.0, pad=100)
    g = torch.Generator().manual_seed(8)
    case.value = (torch.rand(case.value.shape, generator=g, dtype=torch.float64) * 2 - 1) * 1e3
    case.beta = torch.tensor([[1e-3, 1.0, 1e3]], dtype=torch.float64)
    case.stress()
    inputs = [t.to(dtype) for t in case.tensors()]
    inputs[1] = case.beta.float()
    mu, f_max, state, _ = case.read(*inputs, chunk_size=256)
    for tensor in (mu, f_max, *(t for t in state_tensors(state) if t is not None)):
        assert torch.isfinite(tensor).all()
    clipped = torch.minimum(inputs[0].double().abs().amax(dim=1), CAP / case.beta)  # per (batch, head, channel)
    assert (mu.double().abs() <= clipped[:, None] * 1.01 + 1e-6).all()
