"""transformers' common model and generation tests on the EER looped transformer
(tests/support/transformers_common.py says how they run)."""

import functools
import unittest

import pytest
from transformers_common import (
    GenerationTesterMixin,
    ModelTesterMixin,
    TinyCausalLMTester,
    model_classes,
    with_skips,
    zoo_classes_in_transformers_task_tables,  # noqa: F401 (autouse: the zoo's classes in transformers' task tables)
)

from energyzoo.modeling.configuration_eer import EERConfig

pytestmark = pytest.mark.slow  # transformers' whole common suite per model class, compiled decoding included

SKIPS = {
    "test_retain_grad_hidden_states_attentions": (
        "the first hidden state is Z_0 = 0 (eer.txt §5.1), a constant with no gradient to retain"),
    "test_sdpa_can_dispatch_non_composite_models": (
        "EER loads with eager attention unless asked otherwise: every training forward reads the attention "
        "probabilities (eq. 3-5), which eager computes with the output; SDPA is available on request"),
}


@functools.partial(with_skips, skips=SKIPS)
class EERCommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = model_classes("eer-looped")

    def setUp(self):  # EER's single head (eer.txt §5.1); num_hidden_layers is the loop count T
        self.model_tester = TinyCausalLMTester(
            self, lambda tester: EERConfig(
                vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_attention_heads=1,
                intermediate_size=tester.intermediate_size, num_loops=tester.num_hidden_layers, pad_token_id=0,
                bos_token_id=1, eos_token_id=2),
            hidden_size=16, num_attention_heads=1, intermediate_size=32)
