"""generate() with transformers' static cache for every zoo LM (FEM each prior, TEL-GPT2, EqT-LLaMA, EER): the tokens
and scores of the dynamic cache on a left-padded batch, greedy and beam; the cache has one layer per decoder layer
(per loop for EER), of the model's own classes where it keeps more than keys and values; offloaded and quantized
caches and EqT's assisted decoding are refused before anything runs; compiled static decoding of an unpadded and a
padded batch compiles once. (Compiled decoding is also checked by transformers' own generation tests,
`tests/test_*_transformers.py`.)"""

import pytest
import torch
import zoo
from transformers import StaticCache

from energyzoo.modeling.caches import CacheStatesMixin
from energyzoo.modeling.eqt_cache import EqTStaticWindowLayer
from energyzoo.modeling.fem_prior_softmax import FEMSoftmaxStaticCacheLayer
from energyzoo.modeling.transformers_compat import cache_of

# every zoo language model, FEM by prior, as its contract tester builds it (tests/zoo.py names them)
MODELS = {zoo.name_of(tester): tester for tester in zoo.causal_lm_testers(zoo.HEADS_AND_PRIORS)}


def build(name):
    return MODELS[name].build().eval()


def left_padded_batch(model):
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, :1] = 0
    ids[0, :4] = 3  # ordinary tokens under the mask: they must not count
    return ids, mask


@pytest.mark.parametrize("num_beams", [1, 2], ids=["greedy", "beam"])
@pytest.mark.parametrize("name", MODELS)
def test_static_cache_generates_the_dynamic_caches_tokens_and_scores(name, num_beams):
    model = build(name)
    ids, mask = left_padded_batch(model)
    settings = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, num_beams=num_beams,
                    return_dict_in_generate=True, output_scores=True, pad_token_id=0, eos_token_id=None)
    dynamic = model.generate(ids, **settings)
    static = model.generate(ids, cache_implementation="static", **settings)
    assert isinstance(cache_of(static), StaticCache)
    assert len(cache_of(static).layers) == model.config.num_hidden_layers
    assert torch.equal(static.sequences, dynamic.sequences)
    for ours, reference in zip(static.scores, dynamic.scores, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,own_layer", [("fem", FEMSoftmaxStaticCacheLayer),
                                            ("eqt-llama", EqTStaticWindowLayer)])
def test_static_cache_built_from_the_config_holds_the_models_own_layers(name, own_layer):
    """`StaticCache(config=...)` builds the layers that keep the states (every FEM layer; EqT's first, which keeps the
    token window), and a hand-written cached loop over it gives the logits of one forward."""
    model = build(name)
    ids, mask = left_padded_batch(model)
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1])
    assert isinstance(cache.layers[0], own_layer)
    assert all(isinstance(layer, CacheStatesMixin) == (name == "fem" or index == 0)
               for index, layer in enumerate(cache.layers))
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        first = model(ids[:, :6], attention_mask=mask[:, :6], cache=cache).logits
        steps = [model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache).logits
                 for t in range(6, 9)]
    real = mask.bool()
    torch.testing.assert_close(torch.cat([first, *steps], 1)[real], full[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["offloaded", "quantized", "offloaded_static"])
@pytest.mark.parametrize("name", ["fem", "fem-gla", "eqt-llama", "eer-looped"])
def test_other_cache_kinds_are_refused_before_generating(name, kind):
    model = build(name)
    with pytest.raises(ValueError, match=f"supports cache_implementation=None, 'dynamic' or 'static', got '{kind}'"):
        model.generate(torch.randint(3, model.config.vocab_size, (1, 4)), max_new_tokens=2, cache_implementation=kind,
                       pad_token_id=0)


def test_eqt_refuses_assisted_decoding_up_front_and_its_window_cannot_be_cropped():
    model = build("eqt-llama")
    ids = torch.randint(3, model.config.vocab_size, (1, 5))
    with pytest.raises(ValueError, match="assisted generation is not supported with stateful models"):
        model.generate(ids, max_new_tokens=3, assistant_model=build("eqt-llama"), pad_token_id=0)
    with pytest.raises(ValueError, match="assisted generation is not supported with stateful models"):
        model.generate(ids, max_new_tokens=3, prompt_lookup_num_tokens=2, pad_token_id=0)
    cache = cache_of(model(ids, use_cache=True))
    assert len(cache.layers) == model.config.num_hidden_layers and not cache.is_croppable
    with pytest.raises(NotImplementedError, match="cannot be rewound"):
        cache.crop(1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eqt-llama", "fem"])
def test_compiled_static_decoding_of_an_unpadded_then_a_padded_batch_compiles_once(name):
    """`generate()` drops an all-ones mask; the decoding steps must still make the call a padded batch makes, or the
    compiled forward recompiles (transformers' compile test saw it when one half of its batch had no padding). The
    tokens are the eager dynamic cache's."""
    from transformers.generation.configuration_utils import CompileConfig

    model = build(name)
    ids, padded = left_padded_batch(model)
    compile_config = CompileConfig(fullgraph=True, dynamic=False)
    compile_config._compile_all_devices = True  # compile on CPU too
    settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    torch.compiler.reset()
    outputs = []
    for index, mask in enumerate((torch.ones_like(padded), padded)):
        with torch.compiler.set_stance("fail_on_recompile" if index else "default"):
            outputs.append(model.generate(ids, attention_mask=mask, cache_implementation="static",
                                          compile_config=compile_config, **settings))
        assert hasattr(model, "_compiled_call")
        eager = model.generate(ids, attention_mask=mask, **settings)
        assert torch.equal(outputs[-1], eager)


def test_every_registered_language_model_and_prior_is_decoded_with_a_static_cache():
    assert zoo.missing_coverage(list(MODELS.values()), tasks={"causal-lm"}) == []
