"""FEM-LM beyond the shared contract: Llama equivalence, presets, initialisation, ablations, bad input."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from energyzoo import FEMConfig, FEMForCausalLM, config_from_preset, model_from_preset, preset_names

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


def test_temperature_gate_off_reads_the_fixed_temperature_free_energy():
    model = tiny_fem(use_temperature_gate=False, use_outer_gate=False, use_time_decay=False)
    attention = model.model.layers[0].self_attn
    assert not hasattr(attention, "temperature_proj") and not hasattr(attention, "outer_gate_proj")
    ids = torch.randint(3, 97, (1, 10))
    with torch.no_grad():
        trace = model(ids, output_energies=True).energies
    assert "temperature_gate" not in trace.names() and (trace.stack("free_energy_gain") >= 0).all()


def test_energy_trace_gains_are_nonnegative_and_temperatures_are_beta_max():
    model = tiny_fem()
    with torch.no_grad():
        trace = model(torch.randint(3, 97, (2, 11)), output_energies=True).energies
    assert len(trace.layers) == 2
    assert (trace.stack("free_energy_gain") >= 0).all()  # Jensen: F(beta) >= mu
    gate = trace.stack("temperature_gate")
    assert gate.shape == (2, 2, 11) and ((gate > 0) & (gate < 1)).all()
    torch.testing.assert_close(trace.stack("inverse_temperature")[0], model.model.layers[0].self_attn.beta_max())
    assert "free_energy_gain/layer_1" in trace.summary()


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


def test_cache_from_a_plain_dynamic_cache_is_refused_with_advice():
    from transformers import DynamicCache

    with pytest.raises(TypeError, match="DynamicCache\\(config=model.config\\)"):
        tiny_fem()(torch.randint(3, 97, (1, 4)), past_key_values=DynamicCache(), use_cache=True)


def test_cached_exp_shift_moves_only_past_its_headroom_and_rescales_exactly():
    model = tiny_fem()
    ids = torch.randint(3, 97, (2, 30))

    def decode(lower_shift_by: float):
        step = model(ids[:, :10], use_cache=True)
        cache = step.past_key_values
        layer = cache.layers[0]
        # An equivalent cache state with a lower shift: the exp half scaled up to match it.
        layer.exp_shift = layer.exp_shift - lower_shift_by
        half = layer.values.shape[-1] // 2
        layer.values[..., half:] *= torch.exp(torch.tensor(lower_shift_by))
        start = layer.exp_shift.clone()
        pieces = [step.logits]
        for t in range(10, 30):
            step = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            pieces.append(step.logits)
        return torch.cat(pieces, dim=1), start, layer.exp_shift

    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        kept_logits, kept_start, kept_end = decode(0.0)
        moved_logits, moved_start, moved_end = decode(25.0)  # now new values exceed it by more than 20
    assert torch.equal(kept_start, kept_end)
    assert (moved_end > moved_start).any()
    torch.testing.assert_close(kept_logits, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(moved_logits, full, rtol=1e-4, atol=1e-4)


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
