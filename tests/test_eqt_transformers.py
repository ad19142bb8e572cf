"""transformers' common model and generation tests on EqT-LLaMA (tests/support/transformers_common.py says how they
run)."""

import unittest

import transformers_common as common

from energyzoo.modeling.configuration_eqt import EqTLlamaConfig

pytestmark = common.MARKS

READS_TOKEN_IDS = ("the reverse and masked energies (eqt.txt eq. 12-13) read the token ids: EqT-LLaMA refuses "
                   "inputs_embeds alone (generate() passes only them for the prompt) with a clear error unless "
                   "lambda_rev = lambda_mask = 0")
SKIPS = {
    **{name: READS_TOKEN_IDS for name in (
        "test_inputs_embeds", "test_generate_from_inputs_embeds", "test_generate_continue_from_inputs_embeds",
        "test_generate_from_random_inputs_embeds")},
    "test_init_weights_can_init_buffers": (
        "the memory banks (eq. 15-16) are N(0, 1) prototypes by design, so two initialisations differ; "
        "`_init_weights` draws them (the test expects deterministic buffers)"),
}


@common.with_skips(SKIPS)
class EqTLlamaCommonTest(common.ModelTesterMixin, common.GenerationTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("eqt-llama")

    def setUp(self):
        self.model_tester = common.TinyCausalLMTester(self, lambda tester: EqTLlamaConfig(
            vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
            num_attention_heads=tester.num_attention_heads, num_key_value_heads=2,
            intermediate_size=tester.intermediate_size, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, erm_num_steps=2, erm_num_steps_train=1, erm_rev_window=4, erm_rev_num_layers=1,
            erm_rev_num_heads=2, erm_memory_size=16, erm_memory_topk=2))
