"""transformers' common model and generation tests on the EER looped transformer
(tests/support/transformers_common.py says how they run)."""

import unittest

import transformers_common as common

from energyzoo.modeling.configuration_eer import EERConfig

pytestmark = common.MARKS

SKIPS = {
    "test_retain_grad_hidden_states_attentions": (
        "the first hidden state is Z_0 = 0 (eer.txt §5.1), a constant with no gradient to retain"),
    "test_sdpa_can_dispatch_non_composite_models": (
        "EER loads with eager attention unless asked otherwise: every training forward reads the attention "
        "probabilities (eq. 3-5), which eager computes with the output; SDPA is available on request"),
}


@common.with_skips(SKIPS)
class EERCommonTest(common.ModelTesterMixin, common.GenerationTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("eer-looped")

    def setUp(self):  # EER's single head (eer.txt §5.1); num_hidden_layers is the loop count T
        self.model_tester = common.TinyCausalLMTester(
            self, lambda tester: EERConfig(
                vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_attention_heads=1,
                intermediate_size=tester.intermediate_size, num_loops=tester.num_hidden_layers, pad_token_id=0,
                bos_token_id=1, eos_token_id=2),
            hidden_size=16, num_attention_heads=1, intermediate_size=32)
