"""FEM-LM beyond the shared contract: Llama equivalence, presets, initialisation, ablations, bad input."""

import importlib
from pathlib import Path

import pytest
import test_fem_contract
import torch
from fem_reference import fem_layer_reference, rope, softmax_prior, time_decay_features
from test_fem_contract import perturb_fem, without_lse_branch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, StaticCache

from energyzoo import FEMConfig, FEMForCausalLM, config_from_preset, model_from_preset, preset_names
from energyzoo.modeling import configuration_fem
from energyzoo.modeling.configuration_fem import FEM_PRIORS, PRIORS
from energyzoo.modeling.modeling_fem import GATES, FEMAttention
from energyzoo.modeling.transformers_compat import cache_of, with_cache

ALL_OFF = dict(use_time_decay=False, use_lse=False, use_temperature_gate=False, use_outer_gate=False)


def tiny_fem(**overrides):
    fields = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  time_decay_rank=4, pad_token_id=0)
    fields.update(overrides)
    torch.manual_seed(0)
    return FEMForCausalLM(FEMConfig(**fields)).eval()


def test_fem_with_every_module_off_computes_exactly_llama():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                    max_position_embeddings=64)
    ).eval()
    fem = FEMForCausalLM.from_llama(llama, **ALL_OFF).eval()
    ids = torch.randint(0, 101, (2, 20))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        torch.testing.assert_close(fem(ids).logits, llama(ids).logits, rtol=1e-5, atol=1e-5)
        real = mask.bool()
        torch.testing.assert_close(fem(ids, attention_mask=mask).logits[real],
                                   llama(ids, attention_mask=mask).logits[real], rtol=1e-5, atol=1e-5)


def test_from_llama_with_fem_modules_on_differs_from_llama():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4)).eval()
    fem = FEMForCausalLM.from_llama(llama).eval()
    ids = torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        assert not torch.allclose(fem(ids).logits, llama(ids).logits, atol=1e-4)


def test_zero_initialised_conditioner_starts_as_the_identity_modulation():
    with_tdc = tiny_fem()
    without = tiny_fem(use_time_decay=False)
    missing = without.load_state_dict(with_tdc.state_dict(), strict=False)
    assert all(".time_decay." in key for key in missing.unexpected_keys) and not missing.missing_keys
    ids = torch.randint(3, 97, (2, 14))
    with torch.no_grad():
        torch.testing.assert_close(with_tdc(ids).logits, without(ids).logits)


def test_beta_max_initialises_at_softplus_of_one_point_eight():
    beta = tiny_fem().model.layers[0].self_attn.beta_max()
    torch.testing.assert_close(beta, torch.full_like(beta, torch.nn.functional.softplus(torch.tensor(1.8)).item()))


def layer_inputs(model, ids, attention_mask=None):
    """The hidden states each FEM layer's attention receives (captured by hooks) and its outputs."""
    captured = []
    hooks = [layer.self_attn.register_forward_hook(
        lambda module, args, kwargs, output: captured.append((kwargs["hidden_states"] if "hidden_states" in kwargs
                                                              else args[0], output)), with_kwargs=True)
        for layer in model.model.layers]
    try:
        with torch.no_grad():
            result = model(ids, attention_mask=attention_mask, use_cache=False, output_energies=True)
    finally:
        for hook in hooks:
            hook.remove()
    return captured, result


SWITCHES = [{}, dict(use_temperature_gate=False), dict(use_lse=False), dict(use_outer_gate=False),
            dict(use_time_decay=False)]


@pytest.mark.parametrize("prior", FEM_PRIORS)
@pytest.mark.parametrize("switches", SWITCHES, ids=["all", "no_T", "no_L", "no_G", "no_C"])
def test_fem_layer_matches_the_float64_reference_in_outputs_and_gradients(prior, switches):
    """One whole FEM layer (conditioner, modulation, RoPE, prior, LSE branch, lambda, outer gate, output
    projection: FEM eq. 33-35) in float64 against `fem_reference.fem_layer_reference`, on a left-padded batch
    with ordinary tokens under the mask; then the gradient of every parameter of the layer."""
    model = tiny_fem(prior=prior, aft_decay=True, ssm_state_size=4, prior_chunk_size=4, time_decay_chunk_size=4,
                     **switches).double()
    perturb_fem(model)
    ids = torch.randint(3, 97, (2, 13), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    captured, _ = layer_inputs(model, ids, mask)
    hidden, (output, _) = captured[0]
    layer = model.model.layers[0].self_attn
    reference, _, _ = fem_layer_reference(layer, hidden, mask.bool())
    real = mask.bool()
    assert reference[real].abs().mean() > 1e-2
    torch.testing.assert_close(output[real], reference[real], rtol=1e-9, atol=1e-12 * reference.abs().max().item())

    weights = torch.randn(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    weights = weights * real[..., None]
    layer.train()
    _, module_grads = fem_layer_gradients(layer, model, hidden, mask, weights)
    reference_grads = {}
    layer.zero_grad()
    (fem_layer_reference(layer, hidden, mask.bool())[0] * weights).sum().backward()
    reference_grads = {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}
    assert module_grads.keys() == reference_grads.keys()
    for name, grad in module_grads.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-9, atol=1e-12 * scale, msg=name)


def fem_layer_gradients(layer, model, hidden, mask, weights):
    """Run the layer alone (as the model calls it) and backpropagate sum(output * weights)."""
    from transformers.masking_utils import create_causal_mask

    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    causal_mask = None
    if model.config.prior_spec.attention_function:
        causal_mask = create_causal_mask(config=model.config, inputs_embeds=hidden, attention_mask=mask,
                                         position_ids=positions, **with_cache(None))
    layer.zero_grad()
    output, _ = layer(hidden, position_embeddings=model.model.rotary_emb(hidden, positions),
                      attention_mask=causal_mask, padding_mask=mask.bool())
    (output * weights).sum().backward()
    return output, {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}


def test_contract_fixture_reaches_the_exp_cap_with_a_working_conditioner():
    """The contract's FEM fixture (tests/test_fem_contract.py) drives beta_max |v| to the cap of 40 and gives
    the conditioner an output map that moves the modulators away from 1."""
    model = tiny_fem(time_decay_chunk_size=4)
    perturb_fem(model)
    peaks = []
    for layer in model.model.layers:
        attention = layer.self_attn
        attention.v_proj.register_forward_hook(
            lambda module, args, output, attention=attention: peaks.append(
                (output.view(*output.shape[:2], 4, -1).abs() * attention.beta_max()).amax().item()))
    with torch.no_grad():
        model(torch.randint(3, 97, (2, 16), generator=torch.Generator().manual_seed(0)))
    assert all(30 < peak < 80 for peak in peaks), peaks
    assert all(layer.self_attn.time_decay.out_proj.abs().mean() > 0.1 for layer in model.model.layers)


@pytest.mark.parametrize("prior", ["softmax", "gla"])
def test_traced_energies_equal_the_float64_recomputation(prior):
    """output_energies: per layer, energy = mean over channels of (F(beta_max) - mu) (FEM eq. 6),
    temperature_gate = mean lambda and inverse_temperature = beta_max, against the float64 reference run on
    the input each layer received."""
    model = tiny_fem(prior=prior, prior_chunk_size=4, time_decay_chunk_size=4).double()
    perturb_fem(model)
    ids = torch.randint(3, 97, (2, 11), generator=torch.Generator().manual_seed(3))
    captured, result = layer_inputs(model, ids)
    trace = result.energies
    for index, (layer, (hidden, _)) in enumerate(zip(model.model.layers, captured)):
        attention = layer.self_attn
        _, mu, f = fem_layer_reference(attention, hidden)
        torch.testing.assert_close(trace.layers[index]["energy"], (f - mu).mean(dim=(-2, -1)))
        assert (f - mu).mean() > 0.1  # values near the cap: a large gain (f -> max v), not a rounding residue
        torch.testing.assert_close(trace.layers[index]["inverse_temperature"], attention.beta_max())


def test_temperature_gate_off_reads_the_fixed_temperature_free_energy():
    """The T switch off (lambda = 1) reads F(beta_max) = beta_max^-1 log E_p[exp(beta_max v)] (FEM eq. 4)."""
    model = tiny_fem(use_temperature_gate=False, use_outer_gate=False, use_time_decay=False).double()
    perturb_fem(model)
    attention = model.model.layers[0].self_attn
    assert attention.temperature_proj is None and attention.outer_gate_proj is None
    ids = torch.randint(3, 97, (1, 10), generator=torch.Generator().manual_seed(4))
    captured, result = layer_inputs(model, ids)
    hidden, (output, _) = captured[0]
    _, mu, f = fem_layer_reference(attention, hidden)
    o_proj = attention.o_proj.weight
    torch.testing.assert_close(output, f.reshape(1, 10, -1) @ o_proj.T)
    assert not torch.allclose(output, mu.reshape(1, 10, -1) @ o_proj.T, atol=1e-3)
    assert "temperature_gate" not in result.energies.names()


@pytest.mark.parametrize("name,target", [("fem-lm-340m", 340e6), ("fem-lm-1.3b", 1.3e9), ("fem-gla-340m", 340e6),
                                         ("fem-gla-1.3b", 1.3e9), ("llama-340m", 340e6), ("llama-1.3b", 1.3e9)])
def test_presets_have_their_nominal_size(name, target):
    with torch.device("meta"):
        model = model_from_preset(name)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / target - 1) <= 0.05, f"{name}: {count / 1e6:.1f}M parameters"


def test_fem_presets_match_their_llama_baselines_in_shape():
    for size in ("340m", "1.3b"):
        fem, llama = config_from_preset(f"fem-lm-{size}"), config_from_preset(f"llama-{size}")
        assert isinstance(fem, FEMConfig) and isinstance(llama, LlamaConfig)
        for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                      "tie_word_embeddings", "max_position_embeddings"):
            assert getattr(fem, field) == getattr(llama, field), field
    assert config_from_preset("fem-lm-340m").intermediate_size == 2816
    assert config_from_preset("fem-lm-1.3b").intermediate_size == 5440  # budgeted for the conditioner
    assert {"fem-lm-tiny", "llama-tiny", "fem-gla-tiny"} <= set(preset_names())
    for size in ("340m", "1.3b", "tiny"):  # the GLA presets are the softmax ones with another prior
        gla, softmax = config_from_preset(f"fem-gla-{size}"), config_from_preset(f"fem-lm-{size}")
        assert gla.prior == "gla" and softmax.prior == "softmax"
        assert {**gla.to_dict(), "prior": "softmax", "layer_types": None} == {**softmax.to_dict(), "layer_types": None}


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="fem-lm-340m"):
        config_from_preset("fem-lm-9000b")


def test_time_decay_rank_defaults_to_a_sixteenth_of_the_value_width():
    assert config_from_preset("fem-lm-340m").time_decay_rank == 512 // 16
    assert config_from_preset("fem-lm-1.3b").time_decay_rank == 1024 // 16


def test_checkpoint_of_another_shape_fails_loudly(tmp_path):
    tiny_fem().save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForCausalLM.from_pretrained(tmp_path, hidden_size=64)


@pytest.mark.parametrize("prior", ["softmax", "gla"])
def test_empty_caches_of_other_classes_take_fem_layers_and_filled_ones_are_refused(prior):
    """A plain `DynamicCache()`, or one built from transformers' process-wide table of layer types (which holds the
    cache-layer classes of whichever copy of this code registered last), gets FEM's own layers while empty: prefill and
    steps give the logits of one forward. A filled layer of another class is refused, with advice."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    model = tiny_fem(prior=prior)
    ids = torch.randint(3, 97, (2, 9))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        for cache in (DynamicCache(), DynamicCache(config=model.config)):
            cache.layers[:] = [DynamicLayer() for _ in cache.layers]  # another copy's (here: no FEM) layer classes
            first = model(ids[:, :5], cache=cache, use_cache=True)
            steps = [model(ids[:, t : t + 1], cache=cache_of(first), use_cache=True).logits
                     for t in range(5, 9)]
            torch.testing.assert_close(torch.cat([first.logits, *steps], 1), full, rtol=1e-4, atol=1e-4)
        filled = DynamicCache()
        filled.update(torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 3, 8), 0)
        with pytest.raises(TypeError, match="found a filled transformers.cache_utils.DynamicLayer.*DynamicCache"):
            model(ids, cache=filled, use_cache=True)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_cache_keeps_its_exp_shift_even_78_below_new_values(static):
    """Clipping bounds beta v to [-40, 40], so a cached shift is at most 80 below a later value: the cache keeps the
    prompt's shift (no rescaling, in a growing cache and a static one), and decoding still computes the full
    forward. Here the cached shift is lowered by 78 (the exp half scaled up to match), near that bound."""
    model = tiny_fem()
    ids = torch.randint(3, 97, (2, 30))
    lower_shift_by = 78.0
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        cache = StaticCache(config=model.config, max_cache_len=30) if static else None
        step = model(ids[:, :10], cache=cache, use_cache=True)
        cache = cache_of(step)
        layer = cache.layers[0]
        layer.exp_shift = layer.exp_shift - lower_shift_by
        half = layer.values.shape[-1] // 2
        layer.values[..., half:] *= torch.exp(torch.tensor(lower_shift_by))
        start = layer.exp_shift.clone()
        pieces = [step.logits]
        for t in range(10, 30):
            step = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            pieces.append(step.logits)
    assert torch.equal(layer.exp_shift, start)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prior", ["gla", "aft", "ssm"])
def test_recurrent_decoding_state_does_not_grow_with_the_sequence(prior):
    model = tiny_fem(prior=prior, max_position_embeddings=2048)

    def state_bytes(length):
        with torch.no_grad():
            cache = model(torch.randint(3, 97, (1, length)), use_cache=True).past_key_values
        assert cache.get_seq_length() == length
        tensors = [t for layer in cache.layers for t in (*layer.prior_state, layer.time_decay_state)]
        return sum(t.numel() * t.element_size() for t in tensors)

    assert state_bytes(16) == state_bytes(1024) > 0


def test_aft_layer_has_channel_logits_and_no_queries():
    config = FEMConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=1,
                       vocab_size=50, prior="aft", aft_decay=True)
    layer = FEMAttention(config, 0)
    assert layer.q_proj is None and "q_proj" not in dict(layer.named_modules())
    assert layer.k_proj.out_features == layer.v_proj.out_features == config.value_width
    assert layer.decay_proj.out_features == config.value_width
    assert FEMAttention(FEMConfig(**{**config.to_dict(), "aft_decay": False}), 0).decay_proj is None


def test_eager_attention_returns_the_softmax_priors_probabilities():
    """attn_implementation="eager" with output_attentions=True returns p_t(i) of FEM H.1, equal to an
    independent softmax of the layer's RoPE'd q.k over the visible keys (left-padded batch, float64, where
    transformers' own eager attention would turn padded rows into NaN); the outputs equal SDPA's."""
    model = tiny_fem().double()
    perturb_fem(model)
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        sdpa_logits = model(ids, attention_mask=mask).logits
    model.set_attn_implementation("eager")
    captured, _ = layer_inputs(model, ids, mask)
    with torch.no_grad():
        eager = model(ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    torch.testing.assert_close(eager.logits[real], sdpa_logits[real])
    for layer, (hidden, _), probabilities in zip(model.model.layers, captured, eager.attentions):
        attention = layer.self_attn
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        # the queries and keys, modulated by the conditioner (FEM eq. 34a), recomputed through the reference
        c = time_decay_features(attention.time_decay, hidden.double(), real) @ attention.time_decay.out_proj.double()
        widths = [getattr(attention, name).out_features for name in attention.projection_names]
        blocks = dict(zip(attention.projection_names, c.split(widths, dim=-1)))
        query, key = (rope((getattr(attention, name)(hidden) * (1 + blocks[name])).view(2, 9, 4, -1).transpose(1, 2),
                           positions, 10000.0) for name in ("q_proj", "k_proj"))
        expected = softmax_prior(query, key, real)[..., 0].permute(0, 3, 1, 2)  # (batch, heads, t, i)
        torch.testing.assert_close(probabilities[0, :, 3:], expected[0, :, 3:])
        torch.testing.assert_close(probabilities[1], expected[1])


def test_attention_outputs_and_implementations_are_refused_where_they_do_not_apply():
    ids = torch.randint(3, 97, (1, 6))
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        tiny_fem()(ids, output_attentions=True)  # sdpa never forms the probabilities
    gla = tiny_fem(prior="gla")
    with pytest.raises(ValueError, match="output_attentions=True needs FEM's softmax prior"):
        gla(ids, output_attentions=True)
    for refused in ("eager", "flash_attention_2"):
        with pytest.raises(ValueError, match="prior='gla'.*chunkwise recurrence"):
            gla.set_attn_implementation(refused)
    with pytest.raises(ValueError, match="prior='ssm'"):
        AutoModelForCausalLM.from_config(tiny_fem(prior="ssm").config, attn_implementation="eager")
    with pytest.raises(ImportError, match="FlashAttention2"):  # no flash-attn on this machine: said, not ignored
        tiny_fem().set_attn_implementation("flash_attention_2")


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("switches", SWITCHES[1:], ids=["no_T", "no_L", "no_G", "no_C"])
@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_padded_batches_are_exact_for_every_ablation_switch(prior, switches, side):
    """The contract's padding check (outputs and every parameter's gradient equal the sequence alone, ordinary
    tokens under the mask, perturbed conditioner, values at the cap) with each FEM switch off in turn (the
    contract itself runs every prior with all switches on)."""
    tester = test_fem_contract.TestFEMContract()
    tester.prior_fields = {"prior": prior, "prior_chunk_size": 4, "aft_decay": True, "ssm_state_size": 4, **switches}
    tester.test_padded_batch_gives_the_outputs_and_gradients_of_the_sequence_alone(side)


@pytest.mark.parametrize("prior", ["softmax", "gla"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_cached_decoding_keeps_the_exp_branch(prior, dtype):
    """Prefill + one-token steps in bf16 / fp16 give the logits of one forward in that dtype, and stay closer to
    fp32 than the LSE branch's own effect (values at the cap: exp(beta v - M) spans e^-80..1, which fp16 cannot
    hold, so its read and cache run in fp32)."""
    model = tiny_fem(prior=prior, prior_chunk_size=4, time_decay_chunk_size=4)
    perturb_fem(model)
    ids = torch.randint(3, 97, (2, 14), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        reference = model(ids, use_cache=False).logits
        collapsed = without_lse_branch(model)(ids, use_cache=False).logits
        low = model.to(dtype)
        full = low(ids, use_cache=False).logits
        step = low(ids[:, :6], use_cache=True)
        pieces, cache = [step.logits], cache_of(step)
        for t in range(6, 14):
            step = low(ids[:, t : t + 1], cache=cache, use_cache=True)
            pieces.append(step.logits)
    stepped = torch.cat(pieces, dim=1)
    assert torch.isfinite(stepped).all()
    torch.testing.assert_close(stepped.float(), full.float(), rtol=0.02, atol=0.02)
    lse_effect = (reference - collapsed).abs().mean()
    assert (stepped.float() - reference).abs().mean() < 0.1 * lse_effect
    if PRIORS[prior].attention_function and dtype == torch.float16:  # a cache of keys and values
        assert cache.layers[0].values.dtype == torch.float32  # fp16 cannot hold the cached exp values


@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_assisted_and_prompt_lookup_decoding_are_refused_before_anything_runs(prior):
    """FEM is stateful (`_is_stateful`): generate() refuses both modes with transformers' own message before the
    assistant runs, instead of failing later when it would crop the cache."""
    model, assistant = tiny_fem(prior=prior), tiny_fem(prior=prior, num_hidden_layers=1)
    calls = []
    assistant.register_forward_hook(lambda *args: calls.append(1))
    ids = torch.randint(3, 97, (1, 6))
    for options in ({"assistant_model": assistant}, {"prompt_lookup_num_tokens": 2}):
        with pytest.raises(ValueError, match="assisted generation is not supported with stateful models"):
            model.generate(ids, max_new_tokens=3, do_sample=False, **options)
    assert calls == []


def test_rope_parameters_without_queries_and_keys_are_warned_about_once():
    from transformers.testing_utils import CaptureLogger

    from energyzoo.modeling import configuration_fem

    custom = {"rope_type": "default", "rope_theta": 123456.0}
    with CaptureLogger(configuration_fem.logger) as captured:
        for prior in ("softmax", "gla", "aft"):  # RoPE rotates the softmax and GLA priors' queries and keys
            FEMConfig(prior=prior, rope_parameters=dict(custom))
        FEMConfig(prior="aft", rope_parameters=dict(custom))  # the same warning again: not repeated
        FEMConfig(prior="ssm")  # the default: nothing to say
    assert captured.out.count("have no effect with prior='aft'") == 1
    assert "softmax" not in captured.out and "gla" not in captured.out and "ssm" not in captured.out


@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_transformers_cache_utilities_on_fem_caches(prior):
    """What third-party code reads of a FEM cache: lengths and mask sizes count the tokens, `is_initialized` follows
    the state, a batch edit selects rows exactly as running those rows alone, crop is refused, a reset cache
    decodes as a fresh one, and the recurrent layers expose no keys / values (their state is `prior_state`)."""
    model = tiny_fem(prior=prior)
    ids = torch.randint(3, 97, (3, 7))
    with torch.no_grad():
        cache = cache_of(model(ids[:, :5], use_cache=True))
        model(ids[:, 5:6], cache=cache, use_cache=True)
        assert cache.get_seq_length() == 6 and cache.get_mask_sizes(1, 0) == (7, 0)
        layer, recurrent = cache.layers[0], PRIORS[prior].recurrent
        if recurrent:
            assert layer.is_initialized and layer.keys is None and layer.values is None
            with pytest.raises(ValueError, match=type(layer).__name__):
                cache.has_previous_state(0)
        with pytest.raises(NotImplementedError, match="cannot be rewound"):
            cache.crop(1)
        cache.batch_select_indices(torch.tensor([2, 0]))  # rows 2 and 0, as a batch of those two alone
        expected = model(ids[[2, 0]], use_cache=False).logits[:, -1]
        torch.testing.assert_close(model(ids[[2, 0], 6:7], cache=cache).logits[:, -1], expected,
                                   rtol=1e-5, atol=1e-5)
        cache.reset()
        assert not recurrent or not cache.layers[0].is_initialized
        if recurrent:  # a reset recurrent cache starts over (the softmax one keeps its zeroed tensors)
            assert cache.get_seq_length() == 0
            torch.testing.assert_close(model(ids, cache=cache).logits, model(ids).logits, rtol=1e-5,
                                       atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eager_softmax_prior_in_half_precision_with_padding_matches_sdpa(dtype):
    """transformers' half-precision masks reach the eager path as they are (fp32's minimum does not fit in them)."""
    model = tiny_fem().to(dtype)
    ids = torch.randint(3, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        sdpa = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("eager")
        eager = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(eager[real].float(), sdpa[real].float(), rtol=2e-2, atol=2e-2)


def test_an_unknown_attention_implementation_is_refused_in_transformers_words():
    for prior in ("softmax", "gla"):
        with pytest.raises(ValueError, match='Specified `attn_implementation="foo"` is not supported'):
            tiny_fem(prior=prior).set_attn_implementation("foo")


@pytest.mark.parametrize("prior", FEM_PRIORS)
@pytest.mark.parametrize("switches", [{}, {"aft_decay": False, "use_lse": False, "use_outer_gate": False}])
def test_each_priors_data_row_names_the_modules_and_parameters_its_code_builds(prior, switches):
    config = FEMConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=1,
                       vocab_size=50, prior=prior, **{"aft_decay": True, **switches})
    layer, spec = FEMAttention(config, 0), PRIORS[prior]
    modules = {name for name, _ in layer.named_children()} - {"v_proj", "o_proj", "time_decay", *GATES}
    assert modules == set(spec.layer_projections(config))
    assert {name for name, _ in layer.named_parameters(recurse=False)} == {
        *spec.parameters, *(["beta_max_raw"] if config.use_lse else [])}
    assert spec.name == prior and layer.prior is config.prior_spec is spec
    # what DynamicCache(config=...) and StaticCache(config=...) build
    assert all(config.layer_types[0] == cache_layer._layer_type for cache_layer in layer.prior.cache_layers)


def test_the_prior_table_lists_the_row_of_every_prior_file():
    """Each ``fem_prior_<name>.py`` exports its own row (``PRIOR``), under the name its file carries; the table lists
    every one, so a prior file the table forgot, or a row under another file's name, fails here."""
    files = sorted(Path(configuration_fem.__file__).parent.glob("fem_prior_*.py"))
    rows = {path.stem.removeprefix("fem_prior_"): importlib.import_module(
        f"energyzoo.modeling.{path.stem}").PRIOR for path in files}
    assert {name: row.name for name, row in rows.items()} == {name: name for name in rows}
    assert set(PRIORS) == set(rows) and all(PRIORS[name] is row for name, row in rows.items())


# The order post_init draws a layer's random weights in, as every FEM-LM saved since the decay priors came was drawn:
# the prior's own selection projections, values, output, the two gates, then the decay projection and the conditioner
# (whose output map starts at zero: no draw). A seed gives the same model only while this order holds.
SEEDED_ORDER = {
    "softmax": ["q_proj", "k_proj", "v_proj", "o_proj", "temperature_proj", "outer_gate_proj"],
    "gla": ["q_proj", "k_proj", "v_proj", "o_proj", "temperature_proj", "outer_gate_proj", "decay_proj"],
    "aft": ["k_proj", "v_proj", "o_proj", "temperature_proj", "outer_gate_proj", "decay_proj"],
    "ssm": ["dt_proj", "bc_proj", "v_proj", "o_proj", "temperature_proj", "outer_gate_proj"],
}


@pytest.mark.parametrize("prior", FEM_PRIORS)
def test_a_seed_draws_each_layers_weights_in_the_saved_order(prior, monkeypatch):
    from transformers import initialization

    drawn, normal = [], initialization.normal_

    def recording_normal(tensor, *args, **kwargs):
        drawn.append(tensor)
        return normal(tensor, *args, **kwargs)

    monkeypatch.setattr(initialization, "normal_", recording_normal)
    model = tiny_fem(prior=prior, aft_decay=True)
    names = {id(tensor): name for name, tensor in model.model.layers[0].self_attn.named_parameters()}
    order = [names[id(tensor)].removesuffix(".weight") for tensor in drawn if id(tensor) in names]
    assert order[:len(SEEDED_ORDER[prior])] == SEEDED_ORDER[prior]
    assert all(name.startswith("time_decay.") for name in order[len(SEEDED_ORDER[prior]):])
    # the draws are the seed's: the same seed again gives the same weights, another seed others
    again = tiny_fem(prior=prior, aft_decay=True).state_dict()
    assert all(torch.equal(tensor, again[name]) for name, tensor in model.state_dict().items())
