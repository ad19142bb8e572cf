"""The inputs the fuzzer missed, checked from one table (`inputs.INPUT_KINDS`): images of every float dtype are the
model's images (cast, as transformers' ViT casts them), float class labels, wrong-shape masks and short boards are
refused in one line that names the input."""

import pytest
import torch

from energyzoo import UserError
from energyzoo.modeling.inputs import FLOAT_DTYPES, INPUT_KINDS
from energyzoo.presets import model_from_preset

IMAGE_CLASSIFIERS = ["tel-vit-tiny", "tel-resnet-tiny", "hyperset-digits-tiny"]


def images(model, dtype=torch.float32) -> torch.Tensor:
    config = model.config
    side = getattr(config, "image_size", None) or 32
    return torch.randn(2, config.num_channels, side, side, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("preset", IMAGE_CLASSIFIERS)
@pytest.mark.parametrize("dtype", [dtype for dtype in FLOAT_DTYPES if dtype != torch.float32])
def test_images_of_every_float_dtype_are_the_models_images(preset, dtype):
    """float64 images (which TEL-ResNet and Hyper-SET failed on deep in a conv / LayerNorm) give the logits of the
    same images cast to float32 first."""
    torch.manual_seed(0)
    model = model_from_preset(preset).eval()
    pixels = images(model, dtype)
    with torch.no_grad():
        expected = model(pixel_values=pixels.float()).logits
        assert torch.equal(model(pixel_values=pixels).logits, expected)
    integers = (images(model) * 10).long()
    assert torch.int64 not in INPUT_KINDS["pixel_values"].dtypes
    with pytest.raises(UserError, match=r"pixel_values must be a float tensor of shape .* torch.int64"):
        model(pixel_values=integers)


@pytest.mark.parametrize("preset", [*IMAGE_CLASSIFIERS, "fem-lm-tiny"])
def test_float_class_labels_are_refused_by_every_classifier(preset):
    torch.manual_seed(0)
    if preset == "fem-lm-tiny":
        from transformers import AutoModelForSequenceClassification

        model = model_from_preset(preset, AutoModelForSequenceClassification, num_labels=3)
        inputs = {"input_ids": torch.randint(3, 100, (2, 8))}
    else:
        model = model_from_preset(preset)
        inputs = {"pixel_values": images(model)}
    with pytest.raises(UserError, match=r"labels must be integer class ids of shape \(2,\), or multi-label float"):
        model(**inputs, labels=torch.tensor([1.0, 0.0]))
    labels = torch.tensor([1, 0])
    assert torch.isfinite(model(**inputs, labels=labels).loss)


ALL_DTYPES = [torch.bool, torch.uint8, torch.int16, torch.int32, torch.int64, *FLOAT_DTYPES]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_input_of_the_table_takes_exactly_its_dtypes(dtype):
    """Each `INPUT_KINDS` entry against every dtype class: accepted (finite outputs) where the table lists the dtype,
    refused in one line naming the input elsewhere, never an error from inside torch."""
    torch.manual_seed(0)
    classifier = model_from_preset("tel-resnet-tiny").eval()
    pixels, labels = images(classifier), torch.tensor([1, 0])
    maskgit = model_from_preset("hyperset-mim-tiny").eval()
    codes = torch.randint(0, maskgit.config.codebook_size, (2, maskgit.model.embeddings.positions))
    mask = torch.rand(codes.shape) < 0.5
    language_model = model_from_preset("fem-lm-tiny").eval()
    ids = torch.randint(3, 100, (2, 6))
    cases = {
        "pixel_values": lambda: classifier(pixel_values=pixels.to(dtype), labels=labels).loss,
        "labels": lambda: classifier(pixel_values=pixels, labels=labels.to(dtype)).loss,
        "bool_masked_pos": lambda: maskgit(input_ids=codes, bool_masked_pos=mask.to(dtype)).loss,
        "input_ids": lambda: language_model(input_ids=ids.to(dtype)).logits,
    }
    assert set(cases) == set(INPUT_KINDS)
    for name, call in cases.items():
        if dtype in INPUT_KINDS[name].dtypes:
            assert torch.isfinite(call()).all(), name
        elif name == "labels" and dtype.is_floating_point:  # float class ids: refused as labels of the wrong shape
            with pytest.raises(UserError, match=r"labels must be integer class ids .*of shape \(2,\)"):
                call()
        else:
            with pytest.raises(UserError, match=rf"{name} must be "):
                call()


def test_maskgit_refuses_a_mask_of_another_shape_and_sudoku_a_short_board():
    torch.manual_seed(0)
    maskgit = model_from_preset("hyperset-mim-tiny").eval()
    cells = maskgit.model.embeddings.positions
    codes = torch.randint(0, maskgit.config.codebook_size, (2, cells))
    with pytest.raises(UserError, match=rf"bool_masked_pos must be a \(batch, cells\) tensor .* of shape \(2, {cells}\)"
                                        ):
        maskgit(input_ids=codes, bool_masked_pos=torch.ones(2, cells - 1, dtype=torch.bool))
    assert torch.isfinite(maskgit(input_ids=codes, bool_masked_pos=torch.rand(2, cells) < 0.5).loss)
    sudoku = model_from_preset("hyperset-sudoku-tiny").eval()
    board = torch.randint(0, sudoku.config.vocab_size, (1, 81))
    with pytest.raises(UserError, match=r"input_ids must be \(batch, 81\): one id per cell, got shape \(1, 80\)"):
        sudoku(input_ids=board[:, :80])
    assert sudoku(input_ids=board).logits.shape[:2] == (1, 81)
