"""TEL-GPT2 / TEL-ViT / TEL-ResNet beyond the contract: vanilla checkpoints, placements, presets."""

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    ResNetConfig,
    ResNetForImageClassification,
    ResNetModel,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
)
from transformers.testing_utils import CaptureLogger

from energyzoo import (
    TELGPT2LMHeadModel,
    TELGPT2Model,
    TELResNetConfig,
    TELResNetForImageClassification,
    TELResNetModel,
    TELViTForImageClassification,
    TELViTModel,
    ThermodynamicRefinement,
    config_from_preset,
    model_from_preset,
    preset_card,
)
from energyzoo.modeling import modeling_tel

GPT2_FIELDS = dict(vocab_size=97, n_positions=64, n_embd=32, n_layer=3, n_head=4, bos_token_id=1, eos_token_id=2)
VIT_FIELDS = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, image_size=32,
                  patch_size=8, num_labels=3)
RESNET_FIELDS = dict(embedding_size=8, hidden_sizes=[8, 16], depths=[2, 1], layer_type="bottleneck", num_labels=3)
FAMILIES = {
    "gpt2": (GPT2LMHeadModel, GPT2Config(**GPT2_FIELDS), TELGPT2LMHeadModel, 3,
             {"input_ids": torch.randint(3, 97, (2, 12))}),
    "vit": (ViTForImageClassification, ViTConfig(**VIT_FIELDS), TELViTForImageClassification, 3,
            {"pixel_values": torch.randn(2, 3, 32, 32)}),
    "resnet": (ResNetForImageClassification, ResNetConfig(**RESNET_FIELDS), TELResNetForImageClassification, 3,
               {"pixel_values": torch.randn(2, 3, 32, 32)}),
}


BASES = {"gpt2": (GPT2Model, TELGPT2Model), "vit": (ViTModel, TELViTModel), "resnet": (ResNetModel, TELResNetModel)}


@pytest.mark.parametrize("family", FAMILIES)
def test_tel_base_models_load_a_vanilla_heads_folder_as_transformers_base_model_does(family, tmp_path):
    """The TEL base model (TEL-ViT's included, whose folder names are ViT's legacy ones) on a vanilla classifier's or
    LM's folder: with no TEL layer it is transformers' own base model on that folder, the same weights loaded and the
    same left out (ViT's pooler, which a classifier lacks)."""
    vanilla_class, vanilla_config, _, _, inputs = FAMILIES[family]
    vanilla_base_class, tel_base_class = BASES[family]
    torch.manual_seed(0)
    vanilla_class(vanilla_config).save_pretrained(tmp_path)
    torch.manual_seed(1)
    expected, expected_info = vanilla_base_class.from_pretrained(tmp_path, output_loading_info=True)
    torch.manual_seed(1)
    tel, info = tel_base_class.from_pretrained(tmp_path, tel_placement=[], output_loading_info=True)
    assert set(info["missing_keys"]) == set(expected_info["missing_keys"])
    with torch.no_grad():
        assert torch.equal(tel.eval()(**inputs)[0], expected.eval()(**inputs)[0])


def tel_blocks_of(model) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, ThermodynamicRefinement)]


@pytest.mark.parametrize("family", FAMILIES)
def test_vanilla_checkpoints_load_and_empty_placement_is_the_vanilla_model(family, tmp_path):
    vanilla_class, vanilla_config, tel_class, blocks, inputs = FAMILIES[family]
    torch.manual_seed(0)
    vanilla = vanilla_class(vanilla_config).eval()
    vanilla.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = vanilla(**inputs).logits

    empty = tel_class.from_pretrained(tmp_path, tel_placement=[]).eval()
    assert tel_blocks_of(empty) == []
    with torch.no_grad():
        assert torch.equal(empty(**inputs).logits, expected)

    with CaptureLogger(modeling_tel.logger) as captured:
        head = tel_class.from_pretrained(tmp_path).eval()
    assert "the checkpoint has no parameters for 1 of the TEL layers" in captured.out
    assert captured.out.count("\n") == 1
    assert head.config.model_type.startswith("tel-") and head.config.tel_placement == "head"
    (layer_name,) = tel_blocks_of(head)
    assert layer_name in captured.out
    layer = head.get_submodule(layer_name)
    torch.testing.assert_close(layer.step_sizes(), torch.full((5,), 0.5))
    torch.testing.assert_close(layer.tel_log_temperature.exp(), torch.tensor([0.5]))
    vanilla_state = vanilla.state_dict()
    for name, value in head.state_dict().items():
        if ".tel_" not in name:
            assert torch.equal(value, vanilla_state[name]), name
    with torch.no_grad():
        assert not torch.allclose(head(**inputs).logits, expected)

    full = tel_class.from_pretrained(tmp_path, tel_placement="full")
    assert len(tel_blocks_of(full)) == blocks
    chosen = tel_class.from_pretrained(tmp_path, tel_placement=[2, 1])
    assert len(tel_blocks_of(chosen)) == 2 and chosen.config.tel_blocks() == [1, 2]


def test_tel_sits_where_tel_txt_g4_puts_it():
    gpt2 = TELGPT2LMHeadModel(TELGPT2LMHeadModel.config_class(**GPT2_FIELDS, tel_placement=[1]))
    assert tel_blocks_of(gpt2) == ["transformer.h.1.mlp.act"]
    assert gpt2.get_submodule("transformer.h.1.mlp.act").width == gpt2.transformer.h[1].mlp.c_fc.nf
    vit = TELViTForImageClassification(TELViTForImageClassification.config_class(**VIT_FIELDS))
    assert tel_blocks_of(vit) == ["vit.layers.0.mlp.activation_fn"]
    resnet = TELResNetForImageClassification(TELResNetForImageClassification.config_class(**RESNET_FIELDS,
                                                                                           tel_placement="full"))
    assert tel_blocks_of(resnet) == ["resnet.encoder.stages.0.layers.0.layer.0.activation",
                                     "resnet.encoder.stages.0.layers.1.layer.0.activation",
                                     "resnet.encoder.stages.1.layers.0.layer.0.activation"]
    assert resnet.get_submodule(tel_blocks_of(resnet)[0]).channel_dim == 1


def test_energy_trace_has_one_entry_per_tel_layer_in_block_order():
    config = TELGPT2LMHeadModel.config_class(**GPT2_FIELDS, tel_placement="full", tel_steps=3, tel_activation="tanh")
    model = TELGPT2LMHeadModel(config).eval()
    with torch.no_grad():
        model.transformer.h[2].mlp.act.tel_log_temperature.fill_(-2.0)
        trace = model(input_ids=torch.randint(3, 97, (1, 8)), output_energies=True).energies
    assert len(trace.layers) == 3 and trace.stack("temperature").shape == (3, 3)
    torch.testing.assert_close(trace.stack("temperature")[2], torch.full((3,), torch.tensor(-2.0).exp().item()))
    assert {"energy", "free_energy_change"} <= set(trace.names())  # tanh: S = log cosh has a closed form
    assert torch.all(trace.stack("iterations") == 3)


HEAD_PRESETS = ["tel-gpt2-head", "tel-vit-base-patch32-head", "tel-resnet18-head", "tel-resnet50-head"]


def parameter_count(name: str) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in model_from_preset(name).parameters())


@pytest.mark.parametrize("name", HEAD_PRESETS)
def test_tel_head_presets_add_under_half_a_percent_of_parameters(name):
    baseline = preset_card(name)["baseline"]
    full = name.replace("-head", "-full")
    assert config_from_preset(name).model_type.startswith("tel-")
    tel, vanilla, tel_full = parameter_count(name), parameter_count(baseline), parameter_count(full)
    assert 0 < tel - vanilla < 0.005 * vanilla
    assert tel_full > tel


def test_presets_have_their_nominal_shapes():
    assert 123e6 < parameter_count("gpt2-124m") < 125e6
    assert 11e6 < parameter_count("resnet18") < 12e6
    assert 25e6 < parameter_count("resnet50") < 26e6
    assert 87e6 < parameter_count("vit-base-patch32") < 89e6
    for name in ("tel-gpt2-tiny", "tel-vit-tiny", "tel-resnet-tiny"):
        assert parameter_count(name) < 2e6


@pytest.mark.parametrize("shape", [(2, 3, 16, 1), (2, 3, 1, 16), (2, 3, 24, 2)], ids=str)
def test_tel_resnet_in_bfloat16_on_narrow_images_matches_float32(shape):
    """torch's oneDNN bfloat16 convolutions on the CPU return wrong values for images with a side narrower than the
    network's stride (pytorch/pytorch#163347; a 16 x 1 image came out NaN): TEL-ResNet matches its float32 self there,
    at bfloat16's precision."""
    torch.manual_seed(0)
    model = TELResNetForImageClassification(TELResNetConfig(**{**RESNET_FIELDS, "layer_type": "basic"})).eval()
    images = torch.randn(*shape)
    with torch.no_grad():
        expected = model(pixel_values=images).logits
        narrow = model.to(torch.bfloat16)(pixel_values=images.to(torch.bfloat16)).logits.float()
    torch.testing.assert_close(narrow, expected, rtol=0.05, atol=0.05 * expected.abs().max().item())
