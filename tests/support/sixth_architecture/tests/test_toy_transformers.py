"""transformers' common model and generation tests on the toy architecture (tests/support/transformers_common.py
says how they run)."""

import unittest

import pytest
from transformers_common import (
    GenerationTesterMixin,
    ModelTesterMixin,
    TinyCausalLMTester,
    model_classes,
    zoo_classes_in_transformers_task_tables,  # noqa: F401 (autouse)
)

from energyzoo.modeling.configuration_toy import ToyConfig

pytestmark = pytest.mark.slow


class ToyCommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = model_classes("toy")

    def setUp(self):
        self.model_tester = TinyCausalLMTester(self, lambda tester: ToyConfig(
            vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
            num_attention_heads=tester.num_attention_heads, intermediate_size=tester.intermediate_size,
            pad_token_id=0))
