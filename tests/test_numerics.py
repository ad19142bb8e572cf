"""The shared numerical plumbing (`energyzoo.modeling.numerics`, `positions`) against closed forms."""

import pytest
import torch
from accelerate import disk_offload
from peft import LoraConfig, get_peft_model
from torch import nn

from energyzoo.modeling.numerics import applied_bias, applied_weight, own_parameter, widened
from energyzoo.modeling.positions import positions_from_mask


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 4, bias=True)

    def forward(self, x):
        return self.proj(x)


def test_applied_weight_of_a_lora_wrapped_linear_is_its_merged_matrix():
    torch.manual_seed(0)
    model = get_peft_model(Holder().double(), LoraConfig(target_modules=["proj"], r=2, lora_alpha=4))
    wrapped = model.base_model.model.proj
    with torch.no_grad():
        wrapped.lora_B["default"].weight.normal_()  # zero at initialisation: perturbed so the update acts
    lora_a, lora_b = wrapped.lora_A["default"].weight, wrapped.lora_B["default"].weight
    expected = wrapped.base_layer.weight + (4 / 2) * lora_b @ lora_a  # W + (alpha / r) B A, bias excluded
    torch.testing.assert_close(applied_weight(wrapped), expected)
    plain = nn.Linear(3, 2)
    assert applied_weight(plain) is plain.weight


def test_an_offloaded_modules_weights_are_read_through_its_hook(tmp_path):
    """accelerate's disk offload keeps a module's weights on the meta device between its calls: `own_parameter` and
    `applied_weight` load them through the module's hook (the saved values), and leave the module offloaded."""
    torch.manual_seed(0)
    model = Holder()
    model.register_buffer("scale", torch.randn(4))
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    disk_offload(model, str(tmp_path), offload_buffers=True)
    linear = model.proj
    assert linear.weight.is_meta and model.scale.is_meta
    torch.testing.assert_close(applied_weight(linear), expected["proj.weight"], rtol=0, atol=0)
    torch.testing.assert_close(applied_bias(linear), expected["proj.bias"], rtol=0, atol=0)
    torch.testing.assert_close(own_parameter(model, "scale"), expected["scale"], rtol=0, atol=0)
    assert linear.weight.is_meta and model.scale.is_meta


@pytest.mark.parametrize("quantization", ["torchao-int8-weight-only", "dynamic-int8"])
def test_an_int8_linears_matrix_and_bias_are_what_its_forward_applies(quantization):
    """A quantized linear map holds no float weight a product outside its forward could take: `applied_weight` and
    `applied_bias` give the matrix and bias its forward applies (the dequantized weight), and with them x W^T + b is
    its output (up to the dynamic quantization of x, which weight-only int8 does not do)."""
    torch.manual_seed(0)
    model = Holder()
    original = model.proj.weight.detach().clone()
    if quantization == "dynamic-int8":
        model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        weight, bias = model.proj.weight().dequantize(), model.proj.bias()
    else:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(model, Int8WeightOnlyConfig())
        weight, bias = model.proj.weight.dequantize(), model.proj.bias
    assert not torch.equal(weight, original)  # rounded to int8: what a read of the float weight would have missed
    torch.testing.assert_close(applied_weight(model.proj), weight, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(applied_bias(model.proj), bias, rtol=1e-6, atol=1e-6)
    x = torch.randn(5, 6)
    exact = quantization == "torchao-int8-weight-only"
    torch.testing.assert_close(x @ applied_weight(model.proj).T + applied_bias(model.proj), model(x),
                               rtol=1e-5 if exact else 0.05, atol=1e-5 if exact else 0.05)


def test_widened_keeps_wide_floats_and_lifts_half_precision():
    assert widened(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert widened(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    assert widened(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


def test_positions_count_the_real_tokens_of_each_row():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 1]])
    assert positions_from_mask(mask, 5).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 3]]
    assert positions_from_mask(mask, 2).tolist() == [[1, 2], [2, 3]]  # the last tokens of a cached step
