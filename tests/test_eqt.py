"""EqT-LLaMA beyond the contract: the solver against a float64 reference of the energy, the objective's descent,
eq. 18's training signal, the implicit gradient, the memory EMA, early stop, the Llama warm start, and causality
and caching under the large presets' options."""


import pytest
import torch
from eqt_reference import reference_energy
from test_eqt_contract import tiny_eqt_config
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from energyzoo.modeling.configuration_eqt import EqTLlamaConfig
from energyzoo.modeling.eqt_energy import position_mask
from energyzoo.modeling.modeling_eqt import EqTLlamaForCausalLM, EqTLlamaModel
from energyzoo.modeling.transformers_compat import cache_of

LARGE_PRESET_OPTIONS = dict(erm_head_vocabulary="window", erm_confidence_topk=5)  # as eqt-llama-340m
MODES = {"paper": {}, "large-preset": LARGE_PRESET_OPTIONS}


def build(seed=0, **overrides) -> EqTLlamaForCausalLM:
    torch.manual_seed(seed)
    return EqTLlamaForCausalLM(tiny_eqt_config(**overrides)).eval()


def proposal_and_refined(model, **inputs):
    """(f, h_K) of the refined site in one forward."""
    captured = {}
    hooks = [model.model.layers[-1].register_forward_hook(lambda m, a, out: captured.setdefault("f", out)),
             model.model.erm.register_forward_hook(lambda m, a, out: captured.setdefault("h", out))]
    model(**inputs)
    for hook in hooks:
        hook.remove()
    return captured["f"], captured["h"]


def ids_and_mask(vocab: int, left_pad: int = 0, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :left_pad] = 0
    return ids, mask


@pytest.mark.parametrize("mode", MODES)
def test_first_step_is_minus_alpha_times_the_reference_energy_gradient(mode):
    """h_1 - f = -alpha grad L(f) (eq. 8 at h_0 = f), grad by autograd through the float64 loop reference of eq.
    11-15, on a left-padded batch (padding holds ordinary tokens)."""
    model = build(**MODES[mode]).double()
    ids, mask = ids_and_mask(model.config.vocab_size, left_pad=3)
    with torch.no_grad():
        f, h1 = proposal_and_refined(model, input_ids=ids, attention_mask=mask, refinement_steps=1)
    point = f.clone().requires_grad_(True)
    energy = reference_energy(model, ids, point, f, valid=mask)
    (gradient,) = torch.autograd.grad((energy * mask).sum(), point)
    real = mask.bool()
    assert gradient[real].abs().max() > 1e-3  # the energy acts
    torch.testing.assert_close(h1[real], (f - model.config.erm_step_size * gradient)[real], rtol=1e-9, atol=1e-10)


def test_traced_energies_are_the_reference_energy_along_the_steps():
    model = build().double()
    ids, _ = ids_and_mask(model.config.vocab_size)
    with torch.no_grad():
        f, h2 = proposal_and_refined(model, input_ids=ids, refinement_steps=2)
        _, h1 = proposal_and_refined(model, input_ids=ids, refinement_steps=1)
        trace = model(input_ids=ids, refinement_steps=3, output_energies=True).energies.layers[0]
        expected = [reference_energy(model, ids, h, f).mean() for h in (f, h1, h2)]
    torch.testing.assert_close(trace["energy"], torch.stack(expected), rtol=1e-9, atol=1e-9)
    proximal = [((h - f).pow(2).sum(-1) / 2).mean() for h in (f, h1, h2)]
    torch.testing.assert_close(trace["proximal_energy"], torch.stack(proximal), rtol=1e-9, atol=1e-12)
    relative = ((h2 - h1).norm(dim=-1) / h1.norm(dim=-1)).mean()
    torch.testing.assert_close(trace["residual"][1], relative, rtol=1e-9, atol=1e-12)


def test_objective_does_not_increase_along_the_steps_with_a_small_step():
    """Phi(h_k) = L(h_k) + ||h_k - f||^2 / (2 gamma) (eq. 7) from the reference, per position, k = 0..8."""
    model = build(erm_step_size=0.01).double()
    ids, _ = ids_and_mask(model.config.vocab_size)
    objectives = []
    with torch.no_grad():
        for steps in range(9):
            f, h = proposal_and_refined(model, input_ids=ids, refinement_steps=steps)
            objectives.append(reference_energy(model, ids, h, f) + (h - f).pow(2).sum(-1) / 2)
    objectives = torch.stack(objectives)
    assert (objectives[1:] <= objectives[:-1] + 1e-9).all()
    assert (objectives[-1] < objectives[0] - 1e-3).all()


def test_energy_term_of_eq18_trains_the_energy_network():
    """CE + beta * L(h*): training lowers the refined states' energy, and only beta > 0 reaches it that fast."""
    ids, _ = ids_and_mask(97, seed=4)

    def train(beta):
        model = build(energy_loss_weight=beta, lambda_mem=0.0).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        energies = []
        for _ in range(40):
            optimizer.zero_grad()
            outputs = model.model(input_ids=ids, readout_weight=model.lm_head.weight, return_refined_energy=True)
            energies.append(outputs.refined_energy.item())
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
        return energies

    with_energy, without = train(0.3), train(0.0)
    assert with_energy[-1] < 0.7 * with_energy[0]
    assert with_energy[-1] < without[-1] - 1.0  # the CE alone also lowers it, through the refined states


def test_implicit_gradient_matches_unrolled_backprop_at_convergence():
    """At a converged fixed point (K = 400 steps of alpha = 0.03: the tiny random model's hidden states are small,
    so the energy's curvature is large and a large step would not contract), the implicit-function gradient equals
    unrolled backprop, for the energy network and for the decoder below the site (the path through f that eq. 19
    drops, without which the decoder would get no gradient)."""
    def gradients(backprop):
        model = build(erm_backprop=backprop, erm_num_steps_train=400, erm_step_size=0.03, erm_implicit_iterations=400,
                      lambda_mem=0.0).double().train()
        ids, _ = ids_and_mask(model.config.vocab_size)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    unrolled, implicit = gradients("unrolled"), gradients("implicit")
    assert unrolled.keys() == implicit.keys()
    assert implicit["model.layers.0.self_attn.q_proj.weight"].abs().max() > 1e-6
    for name in unrolled:
        scale = unrolled[name].abs().max().clamp_min(1e-12)
        torch.testing.assert_close(implicit[name], unrolled[name], rtol=0, atol=1e-6 * scale, msg=name)


def test_memory_moves_by_the_ema_of_eq16_in_training_only():
    model = build(erm_memory_ema_decay=0.9)
    ids, mask = ids_and_mask(model.config.vocab_size, left_pad=2)
    before = model.model.erm.energy.memory_banks[0].clone().double()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert torch.equal(model.model.erm.energy.memory_banks[0].double(), before)  # frozen in eval
    model.train()
    with torch.no_grad():
        _, refined = proposal_and_refined(model, input_ids=ids, attention_mask=mask)
    expected = before.clone()
    states = refined[mask.bool()].double()
    slots = [int((before @ state).argmax()) for state in states]
    for slot in set(slots):
        mean = torch.stack([state for state, s in zip(states, slots) if s == slot]).mean(0)
        expected[slot] = 0.9 * before[slot] + 0.1 * mean
    assert len(set(slots)) >= 2
    torch.testing.assert_close(model.model.erm.energy.memory_banks[0].double(), expected, rtol=1e-5, atol=1e-6)


def test_early_stop_is_decided_per_position():
    """With erm_tol, positions stop before K (so the logits differ from K full steps), and a sequence's logits are
    those it has alone (float64, so that no residual sits within rounding of the tolerance)."""
    fields = dict(erm_num_steps=60, erm_step_size=0.01, lambda_mem=0.0)
    model = build(erm_tol=2e-3, **fields).double()
    ids, _ = ids_and_mask(model.config.vocab_size)
    with torch.no_grad():
        batched = model(input_ids=ids).logits
        alone = model(input_ids=ids[:1], output_energies=True)
        unstopped = build(**fields).double()(input_ids=ids[:1]).logits
    torch.testing.assert_close(batched[:1], alone.logits, rtol=1e-10, atol=1e-10)
    assert 5 <= alone.energies.layers[0]["iterations"] < 60
    assert not torch.allclose(unstopped, alone.logits, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_causal_and_cached_in_eval_mode_with_every_energy_on(mode):
    """Changing later tokens leaves earlier logits unchanged; prefill + one-token steps with the cache give the full
    forward's logits on a left-padded batch."""
    model = build(**MODES[mode])
    ids, mask = ids_and_mask(model.config.vocab_size, left_pad=2)
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 7) % 90 + 3
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        other = model(input_ids=changed, attention_mask=mask, use_cache=False).logits
        torch.testing.assert_close(other[:, :6], full[:, :6], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(other[:, 6:], full[:, 6:])
        cache, pieces = None, []
        for start, stop in [(0, 4), *((t, t + 1) for t in range(4, 9))]:
            step = model(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop], cache=cache,
                         use_cache=True)
            cache = cache_of(step)
            pieces.append(step.logits)
    stepped = torch.cat(pieces, dim=1)
    real = mask.bool()
    torch.testing.assert_close(stepped[real], full[real], rtol=1e-4, atol=1e-4)


def test_decoding_refines_only_the_new_position_and_runs_under_inference_mode():
    model = build()
    ids, _ = ids_and_mask(model.config.vocab_size)
    widths = []
    model.model.erm.register_forward_hook(lambda m, args, out: widths.append(out.shape[1]))
    settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    generated = model.generate(ids, **settings)
    assert widths == [9, 1, 1, 1, 1]
    with torch.inference_mode():
        assert torch.equal(model.generate(ids, **settings), generated)


def test_position_mask_selects_the_ratio_and_depends_on_the_key_only():
    keys = torch.arange(20000)
    masked = position_mask(keys, 0.15, seed=0)
    assert abs(masked.float().mean().item() - 0.15) < 0.01
    assert torch.equal(position_mask(keys[5000:6000], 0.15, seed=0), masked[5000:6000])
    assert not torch.equal(position_mask(keys, 0.15, seed=1), masked)


def test_llama_checkpoint_loads_and_k0_or_zero_weights_give_llama_exactly(tmp_path):
    """`from_pretrained(llama_dir)` initialises only model.erm.* (and reports them); with K = 0, or with every
    lambda = 0 at K = 8, logits and greedy generations are Llama's bit for bit."""
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, pad_token_id=0, tie_word_embeddings=True)).eval()
    llama.save_pretrained(tmp_path)
    ids, mask = ids_and_mask(97, left_pad=2)
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = llama(input_ids=ids, attention_mask=mask).logits
    expected_tokens = llama.generate(input_ids=ids, attention_mask=mask, **settings)
    for fields in ({"erm_num_steps": 0}, {"lambda_rev": 0.0, "lambda_mask": 0.0, "lambda_conf": 0.0,
                                         "lambda_mem": 0.0}):
        model, info = EqTLlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True, erm_memory_size=16,
                                                          **fields)
        model.eval()
        assert info["missing_keys"] and all(key.startswith("model.erm.") for key in info["missing_keys"])
        assert not info["unexpected_keys"]
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, expected)
        assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, **settings), expected_tokens)
    base, info = EqTLlamaModel.from_pretrained(tmp_path, output_loading_info=True, erm_num_steps=0,
                                               erm_memory_size=16)
    assert info["missing_keys"] and all(key.startswith("erm.") for key in info["missing_keys"])
    with torch.no_grad():  # the base model on the LM's folder: transformers' LlamaModel on it
        assert torch.equal(base.eval()(input_ids=ids, attention_mask=mask).last_hidden_state,
                           LlamaModel.from_pretrained(tmp_path)(input_ids=ids, attention_mask=mask).last_hidden_state)
    in_memory = EqTLlamaForCausalLM.from_llama(llama, erm_num_steps=0, erm_memory_size=16).eval()
    with torch.no_grad():
        assert torch.equal(in_memory(input_ids=ids, attention_mask=mask).logits, expected)
        refined = EqTLlamaForCausalLM.from_llama(llama, erm_memory_size=16).eval()(input_ids=ids).logits
    assert not torch.allclose(refined, llama(input_ids=ids).logits)


def test_config_loads_a_llama_config_and_round_trips(tmp_path):
    llama = LlamaConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3)
    llama.save_pretrained(tmp_path)
    config = EqTLlamaConfig.from_pretrained(tmp_path, erm_layers=[0, 2])
    assert config.erm_sites == [0, 2] and config.erm_rev_hidden_size == 8
    config.save_pretrained(tmp_path / "eqt")
    again = EqTLlamaConfig.from_pretrained(tmp_path / "eqt")
    assert again.to_dict()["model_type"] == "eqt-llama" and again.erm_layers == [0, 2]


def test_every_layer_sites_refine_each_with_its_own_memory():
    model = build(erm_layers=[0, 1], erm_memory_ema_decay=0.5).train()
    ids, _ = ids_and_mask(97)
    banks = model.model.erm.energy.memory_banks.clone()
    outputs = model(input_ids=ids, labels=ids, output_energies=True)
    assert len(outputs.energies.layers) == 2
    moved = (model.model.erm.energy.memory_banks != banks).any(-1).any(-1)
    assert moved.tolist() == [True, True]
    outputs.loss.backward()
    assert model.model.layers[0].mlp.down_proj.weight.grad.abs().max() > 0


def test_eager_attention_reaches_the_reverse_encoder_and_gives_the_sdpa_logits(monkeypatch):
    """After set_attn_implementation("eager") no layer, the reverse encoder's included, calls SDPA, and the logits
    (padded batch, every energy on) are SDPA's; back on SDPA, every decoder and reverse-encoder layer calls it."""
    model = build()
    ids, mask = ids_and_mask(model.config.vocab_size, left_pad=3)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    calls = []
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    monkeypatch.setitem(
        ALL_ATTENTION_FUNCTIONS._global_mapping,
        "sdpa",
        lambda *args, **kwargs: calls.append(1) or sdpa(*args, **kwargs),
    )
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask).logits
    assert calls == []
    real = mask.bool()
    torch.testing.assert_close(eager[real], expected[real], rtol=1e-5, atol=1e-5)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert len(calls) == model.config.num_hidden_layers + model.config.erm_rev_num_layers
