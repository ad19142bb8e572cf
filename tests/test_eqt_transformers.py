"""transformers' common model and generation tests on EqT-LLaMA (tests/support/transformers_common.py says how they
run)."""

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

from energyzoo.modeling.configuration_eqt import EqTLlamaConfig

pytestmark = pytest.mark.slow  # transformers' whole common suite per model class, compiled decoding included

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


@functools.partial(with_skips, skips=SKIPS)
class EqTLlamaCommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = model_classes("eqt-llama")

    def setUp(self):
        self.model_tester = TinyCausalLMTester(self, lambda tester: EqTLlamaConfig(
            vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
            num_attention_heads=tester.num_attention_heads, num_key_value_heads=2,
            intermediate_size=tester.intermediate_size, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, erm_num_steps=2, erm_num_steps_train=1, erm_rev_window=4, erm_rev_num_layers=1,
            erm_rev_num_heads=2, erm_memory_size=16, erm_memory_topk=2))
