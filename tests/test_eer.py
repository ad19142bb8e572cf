"""EER's loop, loss and diagnostics against independent references: the float64 loop of `eer_reference` (outputs,
loss parts and gradients on padded batches, both attention implementations), the loss parts recomputed from the
trajectory and maps the model returns, the Tsallis entropy's limits and eer.txt Lemma B.1, autograd for the
attention-energy gradient of eq. 1, and the memory of a length-1000 forward."""

import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from eer_reference import loss_parts, reference_forward, reference_parameters, sinusoid
from hypothesis import given, settings
from hypothesis import strategies as st
from test_eer_contract import tiny_eer_config
from torch.utils._python_dispatch import TorchDispatchMode

from energyzoo import EERForCausalLM
from energyzoo.modeling.eer_energy import attention_energy_gradient, tsallis_entropy
from energyzoo.modeling.transformers_compat import cache_of


def build(seed: int = 0, **overrides) -> EERForCausalLM:
    torch.manual_seed(seed)
    return EERForCausalLM(tiny_eer_config(**{"num_loops": 4, **overrides})).eval()


def padded_batch(side: str, vocab: int = 16):
    """Two rows of 9 positions; row 0 has 3 padding positions (ordinary tokens under a zero mask) on ``side``;
    labels are -100 there."""
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(3, vocab, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0 if side == "left" else 1
    if side == "right":
        mask[0, -3:] = 0
    labels = torch.randint(0, vocab, ids.shape, generator=generator).masked_fill(mask == 0, -100)
    return ids, mask, labels


BLOCKS = [{}, {"norm_placement": "post"}, {"attention_norm": False}, {"readout_with_inputs": False}]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: "-".join(f"{k}={v}" for k, v in block.items()) or "paper")
def test_loop_loss_and_gradients_match_the_float64_reference(implementation, side, block):
    """Logits at the real positions, the loss (eq. 2) and each part, and every parameter's gradient of the loss, on a
    padded batch in training mode, against the float64 loop written from eq. 2-5 and §5.1, for each reading of the
    block the paper leaves open (`EERConfig`)."""
    model = build(**block).train()
    model.set_attn_implementation(implementation)
    ids, mask, labels = padded_batch(side)
    outputs = model(input_ids=ids, attention_mask=mask, labels=labels)
    outputs.loss.backward()

    weights = reference_parameters(model)
    expected = reference_forward(model.config, weights, ids, mask, labels)
    expected["loss"].backward()
    real = mask.bool()
    torch.testing.assert_close(outputs.logits[real].double(), expected["logits"][real], rtol=1e-5, atol=1e-5)
    for name in ("loss", "task_loss", "kinetic", "potential", "entropy"):
        torch.testing.assert_close(outputs[name].double(), expected[name], rtol=1e-5, atol=1e-6, msg=name)
    for name, parameter in model.named_parameters():
        reference = weights[name].grad
        scale = reference.abs().max().clamp_min(1e-8)
        torch.testing.assert_close(parameter.grad.double(), reference, rtol=0, atol=1e-4 * scale, msg=name)


def test_regularisers_act_with_their_paper_weights_and_vanish_when_zero():
    """Eq. 2 with lambda = (0.1, 0.001, 0.02): the loss exceeds the task loss by exactly the weighted parts; with every
    lambda 0 it is the cross-entropy of the aligned labels, and 'shifted' alignment is the next-token loss."""
    ids, mask, labels = padded_batch("left")
    model = build()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    config = model.config
    extra = (config.lambda_potential * out.potential + config.lambda_kinetic * out.kinetic
             + config.lambda_entropy * out.entropy)
    assert extra > 1e-3
    torch.testing.assert_close(out.loss, out.task_loss + extra)

    plain = build(lambda_potential=0.0, lambda_kinetic=0.0, lambda_entropy=0.0)
    with torch.no_grad():
        out = plain(input_ids=ids, attention_mask=mask, labels=labels)
    aligned = F.cross_entropy(out.logits.reshape(-1, 16), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, aligned)

    shifted = build(lambda_potential=0.0, lambda_kinetic=0.0, lambda_entropy=0.0, label_alignment="shifted")
    with torch.no_grad():
        out = shifted(input_ids=ids, attention_mask=mask, labels=labels)
    next_token = F.cross_entropy(out.logits[:, :-1].reshape(-1, 16), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, next_token)


@pytest.mark.parametrize("alignment", ["aligned", "shifted"])
def test_supplied_shift_labels_are_the_targets_in_either_alignment(alignment):
    """``shift_labels`` (targets aligned with the logits, what sequence-parallel trainers hand the model) are what the
    cross-entropy reads, whatever ``labels`` and `label_alignment` say."""
    ids, mask, labels = padded_batch("left")
    targets = torch.randint(0, 16, labels.shape, generator=torch.Generator().manual_seed(3)).masked_fill(mask == 0,
                                                                                                        -100)
    model = build(label_alignment=alignment)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, shift_labels=targets)
    expected = F.cross_entropy(out.logits.reshape(-1, 16), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.task_loss, expected)


def test_loss_parts_are_the_ones_of_the_returned_trajectory_and_maps():
    """hidden_states are Z_0 = 0, ..., Z_T and attentions the T maps; eq. 3-5 recomputed from them in float64 are the
    parts the model returns, with the entropy target eta in eq. 5's absolute value."""
    model = build(entropy_target=0.7)
    ids, mask, labels = padded_batch("left")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True,
                    output_attentions=True)
    assert len(out.hidden_states) == model.config.num_loops + 1 and len(out.attentions) == model.config.num_loops
    assert torch.equal(out.hidden_states[0], torch.zeros_like(out.hidden_states[0]))
    recomputed = loss_parts(list(out.hidden_states), list(out.attentions), mask.bool(), model.config.tsallis_q)
    for name in ("kinetic", "potential", "entropy"):
        torch.testing.assert_close(out[name].double(), recomputed[name], rtol=1e-6, atol=1e-7, msg=name)
    config = model.config
    expected = (out.task_loss + config.lambda_potential * out.potential + config.lambda_kinetic * out.kinetic
                + config.lambda_entropy * (out.entropy - 0.7).abs())
    torch.testing.assert_close(out.loss, expected)


def test_energy_trace_per_loop_matches_the_reference_and_theorem_3_2_1():
    """Per loop: kinetic, potential, entropy (eq. 3-5), E_tau = -tau log sum exp (mean over real rows), the mean update
    ||Z_{t+1} - Z_t|| and the contraction bound of Theorem 3.2.1 from singular values, Frobenius norms and the maps."""
    model = build(attention_temperature=0.7)
    ids, mask, _ = padded_batch("left")
    with torch.no_grad():
        trace = model(input_ids=ids, attention_mask=mask, output_energies=True).energies
    (loops,) = trace.layers
    expected = reference_forward(model.config, reference_parameters(model), ids, mask)
    for name in ("kinetic", "potential", "entropy"):
        torch.testing.assert_close(loops[name].double(), expected[f"{name}_per_loop"], rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(loops["energy"].double(), expected["energy"], rtol=1e-5, atol=1e-6)
    real = mask.bool()
    updates = [(b - a).norm(dim=-1)[real].mean() for a, b in zip(expected["trajectory"], expected["trajectory"][1:])]
    torch.testing.assert_close(loops["residual"].double(), torch.stack(updates), rtol=1e-5, atol=1e-6)

    attention = model.model.block.self_attn
    q = model.config.tsallis_q
    largest = [torch.linalg.svdvals(w.weight.double())[0] for w in (attention.q_proj, attention.k_proj)]
    frobenius = attention.v_proj.weight.double().pow(2).sum().sqrt()
    bounds = []
    for probabilities in expected["maps"]:
        rows = real[:, None, :].expand(-1, probabilities.shape[1], -1)
        entropy = (1 - probabilities.pow(q).sum(-1)) / (q - 1)
        dynamic = ((1 - (q - 1) * entropy).pow(2 / q) * rows).sum((1, 2)).sqrt()
        bounds.append(((2 * largest[0] * largest[1] + dynamic) * frobenius).mean())
    torch.testing.assert_close(loops["contraction_bound"].double(), torch.stack(bounds), rtol=1e-5, atol=1e-6)
    assert (loops["iterations"] == 4).all() and torch.allclose(loops["temperature"], torch.tensor(0.7))


def test_tsallis_entropy_limits():
    """0 on a one-hot distribution, (1 - n^(1-q)) / (q - 1) on the uniform one over n, Shannon's as q -> 1."""
    one_hot = torch.eye(5, dtype=torch.float64)
    assert torch.equal(tsallis_entropy(one_hot, 1.5), torch.zeros(5, dtype=torch.float64))
    for n in (2, 7, 1000):
        for q in (1.2, 1.5, 2.0):
            uniform = torch.full((n,), 1 / n, dtype=torch.float64)
            torch.testing.assert_close(tsallis_entropy(uniform, q), torch.tensor((1 - n ** (1 - q)) / (q - 1),
                                                                                 dtype=torch.float64))
    p = torch.distributions.Dirichlet(torch.ones(12, dtype=torch.float64)).sample((20,))
    shannon = -(p * p.log()).sum(-1)
    torch.testing.assert_close(tsallis_entropy(p, 1 + 1e-7), shannon, rtol=1e-5, atol=1e-6)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 60), concentration=st.floats(0.01, 10.0), q=st.floats(1.0001, 2.0),
       seed=st.integers(0, 2**31 - 1))
def test_lemma_b1_squared_norm_is_bounded_by_the_tsallis_term(size, concentration, q, seed):
    """eer.txt Lemma B.1 (eq. 6): ||r||_2^2 <= (1 - (q - 1) S_q(r))^(2/q) = ||r||_q^2 for q in (1, 2]."""
    generator = torch.Generator().manual_seed(seed)
    gamma = torch._standard_gamma(torch.full((size,), concentration, dtype=torch.float64), generator=generator)
    r = gamma / gamma.sum()
    bound = (1 - (q - 1) * tsallis_entropy(r, q)).pow(2 / q)
    assert r.pow(2).sum() <= bound * (1 + 1e-12) + 1e-15
    torch.testing.assert_close(bound, r.pow(q).sum().pow(2 / q))


def test_attention_energy_gradient_is_the_autograd_gradient_of_e_tau():
    """grad_Z E_tau(Z; X) of §4.3, summed over heads, with E_tau = -tau log sum_{i <= position} exp(<W_Q z, W_K x_i> /
    (tau sqrt d_h)), against autograd in float64."""
    torch.manual_seed(0)
    batch, length, width, heads, tau = 2, 6, 8, 2, 0.6
    head_dim = width // heads
    z = torch.randn(batch, length, width, dtype=torch.float64, requires_grad=True)
    x = torch.randn(batch, length, width, dtype=torch.float64)
    w_q, w_k = torch.randn(width, width, dtype=torch.float64), torch.randn(width, width, dtype=torch.float64)
    query = (z @ w_q.T).view(batch, length, heads, head_dim).transpose(1, 2)
    key = (x @ w_k.T).view(batch, length, heads, head_dim).transpose(1, 2)
    logits = (query @ key.transpose(-1, -2) / (tau * math.sqrt(head_dim))).masked_fill(
        torch.ones(length, length, dtype=torch.bool).triu(1), -math.inf)
    energy = -tau * logits.logsumexp(-1)
    (gradient,) = torch.autograd.grad(energy.sum(), z)
    ours = attention_energy_gradient(logits.softmax(-1).detach(), key.detach(), w_q, head_dim)
    torch.testing.assert_close(ours, gradient)


def test_hamiltonian_dynamics_follow_eq_1():
    """Two steps of eq. 1 by hand in float64: Z_0 = X, V_0 = 0, V_{k+1} = mu V_k + alpha (F(Z_k) - Z_k) - beta grad E,
    Z_{k+1} = Z_k + V_{k+1}, with F the causal cross-attention to X; hidden_states are Z_0..Z_2."""
    model = build(loop_dynamics="hamiltonian", num_loops=2, hamiltonian_momentum=0.3, hamiltonian_coupling=0.6,
                  hamiltonian_gravity=0.4)
    ids = torch.randint(3, 16, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    config, attention = model.config, model.model.block.self_attn
    heads, head_dim = config.num_attention_heads, config.head_dim
    positions = torch.arange(7)
    x = model.model.embed_tokens.weight.double()[ids] + config.position_embedding_scale * sinusoid(positions, 16)

    def split(h, weight):
        return (h @ weight.double().T).view(2, 7, heads, head_dim).transpose(1, 2)

    key, value = split(x, attention.k_proj.weight), split(x, attention.v_proj.weight)
    z, v = x, torch.zeros_like(x)
    expected = [z]
    for _ in range(2):
        zr = z.detach().requires_grad_(True)
        logits = (split(zr, attention.q_proj.weight) @ key.transpose(-1, -2) / math.sqrt(head_dim)).masked_fill(
            torch.ones(7, 7, dtype=torch.bool).triu(1), -math.inf)
        (grad_e,) = torch.autograd.grad((-logits.logsumexp(-1)).sum(), zr)
        attended = (logits.softmax(-1) @ value).transpose(1, 2).reshape(2, 7, 16).detach()
        v = (config.hamiltonian_momentum * v + config.hamiltonian_coupling * (attended - z)
             - config.hamiltonian_gravity * grad_e)
        z = z + v
        expected.append(z)
    for ours, theirs in zip(out.hidden_states, expected):
        torch.testing.assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-5)


class LiveStorageBytes(TorchDispatchMode):
    """The peak of the bytes held by live tensor storages created while active (weakref-tracked)."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.seen = 0, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.seen:
                    self.seen.add(key)
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._release, key, storage.nbytes())
        return out

    def _release(self, key, nbytes):
        self.seen.discard(key)
        self.live -= nbytes


def test_a_length_1000_forward_keeps_no_loops_attention_maps():
    """Loss parts and the trace at L = 1000 with T = 25 loops (the paper's evaluation): the regularisers are reduced
    inside the loop, so the live memory peaks at a few (n x n) maps, not T of them."""
    torch.manual_seed(0)
    model = EERForCausalLM(tiny_eer_config(hidden_size=8, num_attention_heads=1, num_loops=25)).eval()
    ids = torch.randint(3, 16, (1, 1000))
    one_map = 1000 * 1000 * 4
    with torch.no_grad():
        with LiveStorageBytes() as tracker:
            out = model(input_ids=ids, labels=ids, output_energies=True, use_cache=False)
    assert torch.isfinite(out.loss) and out.energies.layers[0]["entropy"].shape == (25,)
    assert tracker.peak < 6 * one_map, tracker.peak / one_map


def test_cache_must_hold_the_loops_a_call_runs():
    """A cache filled with T loops refuses a decode step with more loops; generate with T' loops (lazily grown cache)
    equals generate without a cache."""
    model = build()
    ids = torch.randint(3, 16, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = cache_of(model(input_ids=ids, use_cache=True))
        with pytest.raises(ValueError, match="one cache layer per loop"):
            model(input_ids=ids[:, :1], cache=cache, refinement_steps=6)
    settings_ = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, refinement_steps=7)
    cached = model.generate(ids, use_cache=True, **settings_)
    assert torch.equal(cached, model.generate(ids, use_cache=False, **settings_))


def test_num_loops_range_draws_the_loop_count_in_training_only():
    """§5.3's varying rollout depth: training forwards draw T in [min, max]; evaluation runs num_loops."""
    model = build(num_loops_range=[2, 6])
    ids = torch.randint(3, 16, (1, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert model(input_ids=ids, output_energies=True).energies.layers[0]["iterations"] == 4
        model.train()
        drawn = {int(model(input_ids=ids, output_energies=True).energies.layers[0]["iterations"]) for _ in range(40)}
    assert drawn == {2, 3, 4, 5, 6}


def test_refinement_steps_overrides_the_drawn_loop_count_without_drawing():
    """An explicit T runs T loops in training too, and leaves the global RNG where it was (no draw thrown away)."""
    model = build(num_loops_range=[2, 6]).train()
    ids = torch.randint(3, 16, (1, 5), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(11)
    with torch.no_grad():
        out = model(input_ids=ids, refinement_steps=3, output_energies=True)
    following = torch.rand(4)
    assert out.energies.layers[0]["iterations"] == 3
    torch.manual_seed(11)
    assert torch.equal(following, torch.rand(4))


def test_default_initialisation_is_pytorchs_and_initializer_range_is_transformers():
    """None: Linear weights and biases uniform in +-1/sqrt(fan_in) (kaiming-uniform, a = sqrt 5), embeddings N(0, 1);
    a number: N(0, initializer_range) and zero biases."""
    torch.manual_seed(0)
    model = EERForCausalLM(tiny_eer_config(hidden_size=64, num_attention_heads=4, intermediate_size=256))
    up = model.model.block.mlp.up_proj
    bound = 1 / math.sqrt(64)
    assert up.weight.abs().max() <= bound and up.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert up.bias.abs().max() <= bound and up.bias.abs().max() > 0.5 * bound
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(1.0, rel=0.15)
    torch.manual_seed(0)
    model = EERForCausalLM(tiny_eer_config(hidden_size=64, num_attention_heads=4, intermediate_size=256,
                                           initializer_range=0.02))
    assert model.model.block.mlp.up_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(model.model.block.mlp.up_proj.bias, torch.zeros(256))
    torch.manual_seed(0)
    model = EERForCausalLM(tiny_eer_config(hidden_size=64, num_attention_heads=4, embedding_init_std=0.1))
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(0.1, rel=0.1)
    assert model.model.block.mlp.up_proj.weight.abs().max() <= bound  # the rest stays PyTorch's
