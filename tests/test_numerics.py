"""The shared numerical plumbing (`energyzoo.modeling.numerics`, `positions`) against closed forms."""

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from energyzoo.modeling.numerics import applied_weight, widened
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


def test_widened_keeps_wide_floats_and_lifts_half_precision():
    assert widened(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert widened(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    assert widened(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


def test_positions_count_the_real_tokens_of_each_row():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 1]])
    assert positions_from_mask(mask, 5).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 3]]
    assert positions_from_mask(mask, 2).tolist() == [[1, 2], [2, 3]]  # the last tokens of a cached step
