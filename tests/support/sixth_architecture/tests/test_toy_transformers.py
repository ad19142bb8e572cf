"""transformers' common model and generation tests on the toy architecture (tests/support/transformers_common.py
says how they run)."""

import unittest

import transformers_common as common

from energyzoo.modeling.configuration_toy import ToyConfig

pytestmark = common.MARKS


class ToyCommonTest(common.ModelTesterMixin, common.GenerationTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("toy")

    def setUp(self):
        self.model_tester = common.TinyCausalLMTester(self, lambda tester: ToyConfig(
            vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
            num_attention_heads=tester.num_attention_heads, intermediate_size=tester.intermediate_size,
            pad_token_id=0))
