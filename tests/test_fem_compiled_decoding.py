"""FEM's compiled decoding step (`fem_compiled_decoding`) against the eager layer: the same logits and tokens for every
prior, padded batches and both cache kinds; one graph for every layer and step; which calls it takes; and the eager
fallback, in one warning, where compiling fails.

The rest of the suite decodes eagerly (tests/conftest.py sets ``ENERGYZOO_EAGER_DECODING``); the fixture here turns the
region on with a fresh compiled function, so that each test sees its own compiles."""

import pytest
import torch
from big_models import load_offloaded, offloaded_in_part
from test_fem_contract import perturb_fem
from torch._dynamo.exc import TorchDynamoException
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM
from transformers.testing_utils import CaptureLogger

from energyzoo import FEMConfig, FEMForCausalLM
from energyzoo.modeling import fem_compiled_decoding, modeling_fem
from energyzoo.modeling.configuration_fem import FEM_PRIORS
from energyzoo.modeling.fem_compiled_decoding import (
    COMPILE_AFTER_ENV,
    CPU_LAYER_STEPS_BEFORE_COMPILING,
    EAGER_DECODING_ENV,
    CompiledDecoding,
)

NEW_TOKENS = 5


@pytest.fixture
def region(monkeypatch) -> CompiledDecoding:
    """The region switched on for this test, compiling at the first step, with nothing compiled yet."""
    monkeypatch.setenv(EAGER_DECODING_ENV, "0")
    monkeypatch.setenv(COMPILE_AFTER_ENV, "0")
    fresh = CompiledDecoding(modeling_fem.decoder_block)
    monkeypatch.setattr(modeling_fem, "COMPILED_DECODING", fresh)
    torch._dynamo.reset()
    counters.clear()
    return fresh


def perturbed_fem(dtype=torch.float32, **overrides) -> FEMForCausalLM:
    """A tiny FEM-LM, every module acting: the conditioner's zero-initialised output map perturbed off zero."""
    fields = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  time_decay_rank=4, pad_token_id=0, max_position_embeddings=64)
    torch.manual_seed(0)
    model = FEMForCausalLM(FEMConfig(**{**fields, **overrides})).eval()
    perturb_fem(model)
    return model.to(dtype)


def padded_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts left-padded to 9 tokens, ordinary ids (not the pad id) under the mask."""
    ids = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :6] = 0
    return ids, mask


def greedy(model, **kwargs):
    ids, mask = padded_prompts()
    return model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True, **kwargs)


def eager_greedy(model, monkeypatch, **kwargs):
    with monkeypatch.context() as patch:
        patch.setenv(EAGER_DECODING_ENV, "1")
        return greedy(model, **kwargs)


@pytest.mark.slow
# the recurrent priors' cache layers are the same class in both caches: their static runs would repeat the dynamic
@pytest.mark.parametrize(("prior", "cache_implementation"), [*((prior, None) for prior in FEM_PRIORS),
                                                            ("softmax", "static")])
def test_compiled_steps_decode_as_the_eager_layers_in_one_graph(region, monkeypatch, prior, cache_implementation):
    """float64, padded batch: every step's logits equal the eager model's to 1e-6 and the tokens are the same; the
    region compiled exactly one graph for all layers and steps, and nothing fell back. (Not to 1e-15: Llama's RMSNorm
    rounds its input to float32 and back, a round trip the compiler leaves out; with float64 norms the block agrees to
    1e-15.)"""
    model = perturbed_fem(torch.float64, prior=prior)
    expected = eager_greedy(model, monkeypatch, cache_implementation=cache_implementation)
    assert counters["stats"]["unique_graphs"] == 0
    decoded = greedy(model, cache_implementation=cache_implementation)
    assert region.unavailable is None
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["recompiles"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(torch.stack(decoded.logits), torch.stack(expected.logits), rtol=0, atol=1e-6)
    assert torch.equal(decoded.sequences, expected.sequences)


def recording_region(region: CompiledDecoding) -> list[int]:
    """Stand the eager block in for the compiled one (nothing compiles) and record each call's token count."""
    calls = []

    def recorded(layer, hidden_states, **kwargs):
        calls.append(hidden_states.shape[1])
        return modeling_fem.decoder_block(layer, hidden_states, **kwargs)

    region.compiled = recorded
    return calls


def test_the_region_takes_single_token_steps_without_autograd_only(region, monkeypatch):
    """generate: every layer of every step after the prompt, and the same tokens; a forward under autograd, a config
    with the switch off, one process of several and a process with it off: none (energies and attentions: below)."""
    model = perturbed_fem(attn_implementation="eager")
    calls = recording_region(region)
    expected = eager_greedy(model, monkeypatch)
    assert calls == []
    decoded = greedy(model)
    layers = model.config.num_hidden_layers
    assert calls == [1] * (NEW_TOKENS - 1) * layers
    assert torch.equal(decoded.sequences, expected.sequences)

    ids, mask = padded_prompts()
    with torch.no_grad():
        cache = model(ids, attention_mask=mask).past_key_values
    step = dict(input_ids=ids[:, -1:], attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], 1))
    calls.clear()
    with torch.enable_grad():
        model(cache=cache, **step)
    assert calls == []
    model.config.compile_decoding = False
    with torch.no_grad():
        model(**step, cache=model(ids, attention_mask=mask).past_key_values)
    assert calls == []
    model.config.compile_decoding = True
    with monkeypatch.context() as patch:
        patch.setattr(torch.distributed, "is_initialized", lambda: True)
        with torch.no_grad():
            model(**step, cache=model(ids, attention_mask=mask).past_key_values)
    assert calls == []
    with torch.no_grad():  # the region again, as a control
        model(**step, cache=model(ids, attention_mask=mask).past_key_values)
    assert calls == [1] * layers
    calls.clear()
    monkeypatch.setenv(EAGER_DECODING_ENV, "1")
    with torch.no_grad():
        model(**step, cache=model(ids, attention_mask=mask).past_key_values)
    assert calls == []


def test_a_dispatched_model_decodes_eagerly_the_tokens_of_the_model_in_memory(region, monkeypatch, tmp_path):
    """Loaded with ``device_map="auto"`` and part of it on disk, the model's layers carry accelerate's offload hooks:
    the region takes none of its steps (dynamo does not trace the hooks), and the tokens are the model's in memory."""
    model = perturbed_fem()
    calls = recording_region(region)
    model.save_pretrained(tmp_path)
    offloaded = load_offloaded(AutoModelForCausalLM, tmp_path, "device_map")
    assert offloaded_in_part(offloaded)
    decoded = greedy(offloaded)
    assert calls == []
    assert torch.equal(decoded.sequences, eager_greedy(model, monkeypatch).sequences)
    greedy(model)  # the region on the model in memory, as a control
    assert calls


def test_energies_and_attentions_of_a_step_are_the_eager_layers(region, monkeypatch):
    """A step that records an energy trace or returns attentions runs eagerly and returns them: equal to the
    process-wide eager run's."""
    model = perturbed_fem(attn_implementation="eager")
    calls = recording_region(region)
    ids, mask = padded_prompts()
    step = dict(input_ids=ids[:, -1:], attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], 1),
                output_energies=True, output_attentions=True)

    def step_outputs():
        with torch.no_grad():
            return model(**step, cache=model(ids, attention_mask=mask).past_key_values)

    outputs = step_outputs()
    assert calls == []
    monkeypatch.setenv(EAGER_DECODING_ENV, "1")
    expected = step_outputs()
    assert len(outputs.energies.layers) == model.config.num_hidden_layers
    for got, want in zip(outputs.energies.layers, expected.energies.layers, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(outputs.attentions, expected.attentions, rtol=0, atol=0)


def test_a_failed_compile_warns_once_and_decodes_eagerly(region, monkeypatch):
    """Where compiling fails (here: no C++ compiler), one warning names why, the step runs eagerly with the same
    tokens, and the process does not try again."""
    attempts = []

    def failing_compile(fn, **kwargs):
        def compiled(*args, **kwargs):
            attempts.append(1)
            raise TorchDynamoException("InvalidCxxCompiler: No working C++ compiler found\nmore detail")
        return compiled

    monkeypatch.setattr(fem_compiled_decoding.torch, "compile", failing_compile)
    model = perturbed_fem()
    expected = eager_greedy(model, monkeypatch)
    logger = fem_compiled_decoding.logger
    with CaptureLogger(logger) as captured:
        decoded = greedy(model)
        again = greedy(model)
    assert attempts == [1]
    assert captured.out.strip().splitlines() == [
        "FEM: compiling the decoding step once for this process (seconds; after 0 eager layer-steps, it pays from here "
        "on: energyzoo's fem_compiled_decoding)",
        "FEM: compiled decoding is unavailable (InvalidCxxCompiler: No working C++ compiler found); decoding eagerly. "
        "FEMConfig(compile_decoding=False) skips the attempt."
    ]
    assert torch.equal(decoded.sequences, expected.sequences) and torch.equal(again.sequences, expected.sequences)


def recorded_compiles(monkeypatch) -> list[int]:
    """torch.compile replaced by a recorder whose "compiled" function is the eager block: which steps would compile."""
    compiled_calls = []

    def recording_compile(fn, **kwargs):
        def compiled(*args, **kwargs):
            compiled_calls.append(1)
            return fn(*args, **kwargs)
        return compiled

    monkeypatch.setattr(fem_compiled_decoding.torch, "compile", recording_compile)
    return compiled_calls


def test_on_a_cpu_the_first_generate_decodes_eagerly_and_compiling_starts_once_it_pays(region, monkeypatch):
    """A fresh process's first generate on a CPU compiles nothing (a compile costs seconds, a step saves a fraction of
    a millisecond); after the set count of eager layer-steps the region takes over, saying so in one line."""
    compiled_calls = recorded_compiles(monkeypatch)
    monkeypatch.delenv(COMPILE_AFTER_ENV)
    model = perturbed_fem()
    layer_steps = NEW_TOKENS - 1  # the prompt's step is no decoding step: each later token is one step of each layer
    with CaptureLogger(fem_compiled_decoding.logger) as captured:
        greedy(model)
    assert compiled_calls == [] and captured.out == ""
    assert region.eager_steps == layer_steps * model.config.num_hidden_layers < CPU_LAYER_STEPS_BEFORE_COMPILING

    monkeypatch.setenv(COMPILE_AFTER_ENV, str(region.eager_steps + 2))  # two more eager layer-steps, then compiled
    with CaptureLogger(fem_compiled_decoding.logger) as captured:
        decoded = greedy(model)
    assert len(compiled_calls) == layer_steps * model.config.num_hidden_layers - 2
    assert captured.out.count("FEM: compiling the decoding step once for this process") == 1
    assert torch.equal(decoded.sequences, eager_greedy(model, monkeypatch).sequences)


def test_on_an_accelerator_the_region_compiles_at_the_first_step(region, monkeypatch):
    monkeypatch.delenv(COMPILE_AFTER_ENV)
    assert region.pays(torch.device("cuda")) and region.eager_steps == 0
    assert not region.pays(torch.device("cpu")) and region.eager_steps == 1
