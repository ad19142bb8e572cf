"""Every zoo config refuses what its model cannot honour, in one line naming the config, the field, the value and the
allowed range: the fields inherited from transformers (which checks none of these ranges) and names it does not have
(which transformers keeps as stray attributes), through the Python API and typed by their annotation on the command
line."""

import json
import math
from pathlib import Path

import pytest

import energyzoo
from energyzoo import config_from_preset, model_from_preset
from energyzoo.training.recipe import load_recipe

NAN = float("nan")


@pytest.mark.parametrize(("preset", "field", "value", "message"), [
    ("tel-vit-tiny", "layer_norm_eps", NAN, "TELViTConfig.layer_norm_eps must be a finite number float32 holds"),
    ("tel-gpt2-tiny", "layer_norm_epsilon", NAN, "TELGPT2Config.layer_norm_epsilon must be a finite number float32"),
    ("tel-gpt2-tiny", "layer_norm_epsilon", 0.0, "TELGPT2Config.layer_norm_epsilon must be > 0, got 0.0"),
    ("fem-lm-tiny", "rope_parameters", {"rope_type": "default", "rope_theta": NAN},
     "FEMConfig.rope_parameters must be numbers with rope_theta > 0 and factor > 0"),
    ("eqt-llama-tiny", "rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": -2.0},
     "EqTLlamaConfig.rope_parameters must be numbers with rope_theta > 0 and factor > 0"),
    ("tel-vit-tiny", "hidden_size", -4, "TELViTConfig.hidden_size must be a positive integer, got -4"),
    ("fem-lm-tiny", "num_labels", 0, "FEMConfig.num_labels must be >= 1 (the size of id2label), got 0"),
    ("tel-vit-tiny", "patch_size", 3, "TELViTConfig.patch_size must be a divisor of image_size (8) on each side"),
    ("tel-vit-tiny", "num_attention_heads", 3, "TELViTConfig.num_attention_heads must be a divisor of hidden_size"),
    ("tel-gpt2-tiny", "n_head", 3, "TELGPT2Config.n_head must be a divisor of n_embd (128), got 3"),
    ("tel-gpt2-tiny", "resid_pdrop", 1.5, "TELGPT2Config.resid_pdrop must be a probability in [0, 1), got 1.5"),
    ("tel-gpt2-tiny", "activation_function", "gelu_newer", "TELGPT2Config.activation_function must be an activation"),
    ("tel-gpt2-tiny", "pad_token_id", 4096, "TELGPT2Config.pad_token_id must be None or an id in [0, vocab_size"),
    ("eqt-llama-tiny", "num_key_value_heads", 3, "EqTLlamaConfig.num_key_value_heads must be a divisor of "
                                                 "num_attention_heads (4), got 3"),
    ("eqt-llama-tiny", "pad_token_id", 4096, "EqTLlamaConfig.pad_token_id must be None or an id in [0, vocab_size"),
    ("tel-resnet-tiny", "depths", [1], "TELResNetConfig.depths must be one entry per stage of hidden_sizes"),
    ("tel-resnet-tiny", "layer_type", "wide", "TELResNetConfig.layer_type must be one of ['basic', 'bottleneck']"),
    ("hyperset-digits-tiny", "initializer_range", math.inf, "HyperSETConfig.initializer_range must be a finite number"),
    ("eer-induction", "attention_temperature", 1e-290,  # 0 in float32: the attention would divide by it
     "EERConfig.attention_temperature must be a finite number float32 holds (0, or of size in [1.18e-38, 3.4e+38]), "
     "got 1e-290"),
    ("fem-lm-tiny", "beta_max_init", 1e39, "FEMConfig.beta_max_init must be a finite number float32 holds"),
    ("eqt-llama-tiny", "head_dim", 3, "EqTLlamaConfig.head_dim must be even (RoPE rotates pairs of channels"),
    ("eqt-llama-tiny", "erm_rev_hidden_size", 10, "EqTLlamaConfig.erm_rev_hidden_size must be a positive multiple of "
                                                  "2 x erm_rev_num_heads (8)"),
    ("eqt-llama-tiny", "attention_dropout", None, "EqTLlamaConfig.attention_dropout must be a probability in [0, 1)"),
    ("fem-lm-tiny", "time_decay_chunk_size", 1, "FEMConfig.time_decay_chunk_size must be an integer >= 2"),
    ("fem-lm-tiny", "problem_type", "ranking", "FEMConfig.problem_type must be one of (None, 'regression'"),
    ("fem-lm-tiny", "id2label", {"first": "a"}, "FEMConfig.id2label must be None or a dict of class ids to names"),
    ("tel-vit-tiny", "pooler_act", "softmax", "TELViTConfig.pooler_act must be an activation of transformers' ACT2FN"),
    ("fem-lm-tiny", "rope_parameters", {"rope_type": "linear", "rope_theta": 1e4}, "FEMConfig: Missing required keys "
                                                                                   "in `rope_parameters`"),
    ("fem-lm-tiny", "rope_parameters", {"rope_type": "spiral", "rope_theta": 1e4}, "FEMConfig.rope_parameters must "
                                                                                   "be a rope_type of"),
    ("eer-induction", "layer_norm_eps", -1e-5, "EERConfig.layer_norm_eps must be > 0, got -1e-05"),
    ("fem-gla-tiny", "layer_types", ["fem_softmax"] * 2,
     "FEMConfig.layer_types must be None or ['fem_gla', 'fem_gla', 'fem_gla', 'fem_gla'] (every FEM layer reads"),
])
def test_inherited_fields_are_refused_out_of_range_in_one_line(preset, field, value, message):
    with pytest.raises(ValueError) as refused:
        config_from_preset(preset, **{field: value})
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("preset", "field", "value", "message"), [
    ("fem-lm-tiny", "hidden_size", "32", "FEMConfig.hidden_size: Field 'hidden_size' expected int, got str"),
    ("fem-lm-tiny", "num_hidden_layers", True, "FEMConfig.num_hidden_layers: Field 'num_hidden_layers' expected int, "
                                               "got bool"),
    ("tel-vit-tiny", "layer_norm_eps", "1e-5", "TELViTConfig.layer_norm_eps: Field 'layer_norm_eps' expected float"),
])
def test_wrong_types_are_one_line_type_errors_naming_the_field(preset, field, value, message):
    """huggingface_hub's ``@strict`` raises its own exception over two lines; the zoo's configs raise the TypeError it
    wraps, on one line."""
    with pytest.raises(TypeError) as refused:
        config_from_preset(preset, **{field: value})
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    config = config_from_preset(preset)
    with pytest.raises(TypeError, match=message):
        setattr(config, field, value)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: config_from_preset("fem-lm-tiny", hidden_sise=32), "FEMConfig has no field 'hidden_sise'; did you mean "
                                                                "'hidden_size'?"),
    (lambda: model_from_preset("tel-gpt2-tiny", n_embed=64), "TELGPT2Config has no field 'n_embed'; did you mean "
                                                             "'n_embd'?"),
    (lambda: config_from_preset("eer-induction", num_loop=3), "EERConfig has no field 'num_loop'; did you mean "
                                                              "'num_loops'?"),
])
def test_unknown_names_through_the_python_api_are_refused_with_the_closest_field(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_properties_aliases_and_transformers_keywords_pass_as_overrides():
    assert config_from_preset("fem-lm-tiny", num_labels=3).num_labels == 3
    assert config_from_preset("eer-induction", num_hidden_layers=4).num_loops == 4  # attribute_map alias
    assert config_from_preset("fem-lm-tiny", attn_implementation="eager")._attn_implementation == "eager"


def test_every_preset_builds_the_config_its_file_states():
    """Each preset's config carries every field of its JSON file (read here, not through the preset reader)."""
    folder = Path(energyzoo.__file__).parent / "presets"
    for name in energyzoo.preset_names():
        stated = json.loads((folder / f"{name}.json").read_text())["config"]
        config = config_from_preset(name)
        assert {key: getattr(config, key, None) for key in stated} == stated, name


def test_command_line_overrides_are_read_as_the_fields_annotation():
    """YAML 1.1 reads ``1e-5`` (no dot) as a string; a float field takes it as the number, a word it refuses."""
    recipe = load_recipe("fem-lm-tiny", ["model.overrides.rms_norm_eps=1e-5", "training.learning_rate=3e-3",
                                         "training.weight_decay=1e-1"])
    assert recipe.model.overrides["rms_norm_eps"] == 1e-5 and recipe.model.build_config().rms_norm_eps == 1e-5
    assert (recipe.training.learning_rate, recipe.training.weight_decay) == (3e-3, 0.1)
    refused = "recipe training.learning_rate: Value 'fast' of type 'str' could not be converted to Float"
    with pytest.raises(ValueError, match=refused):
        load_recipe("fem-lm-tiny", ["training.learning_rate=fast"])


@pytest.mark.parametrize(("fields", "message"), [
    ({"hidden_size": 100}, "FEMConfig: hidden_size 100, value_ratio 0.5 and num_attention_heads 4 give a value width "
                           "of 50, which 4 heads cannot split evenly"),
    ({"hidden_size": 66}, "FEMConfig: hidden_size 66, qk_ratio 1.0 and num_attention_heads 4 give a Q/K width of 66, "
                          "which 4 heads cannot split evenly"),
    ({"hidden_size": 36, "value_ratio": 1.0}, "FEMConfig: hidden_size 36, qk_ratio 1.0 and num_attention_heads 4 give "
                                              "a per-head Q/K width of 9, which is odd (RoPE rotates pairs"),
])
def test_a_size_rule_names_every_field_it_joins_with_its_value_and_what_they_give(fields, message):
    """The user set hidden_size; the rule joins it with fields left at their defaults, so every one is named."""
    with pytest.raises(ValueError) as refused:
        config_from_preset("fem-lm-tiny", **fields)
    assert str(refused.value).startswith(message), refused.value
