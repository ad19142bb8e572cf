"""transformers' common model and generation tests on FEM-LM, one test class per prior
(tests/support/transformers_common.py says how they run)."""

import unittest

import torch
import transformers_common as common
from fem_reference import PRIOR_CASES

from energyzoo.modeling.configuration_fem import FEM_PRIORS, PRIORS, FEMConfig

pytestmark = common.MARKS

RECURRENT_ATTENTION = ("the GLA, AFT and SSM priors are recurrences, not softmax attention: FEM accepts only "
                       "attn_implementation='sdpa' for them and refuses 'eager' with a clear error")
ATTENTIONS_UNDER_SDPA = ("it asks for output_attentions=True under SDPA; FEM refuses that with a clear error (the "
                         "probabilities exist only under attn_implementation='eager') instead of returning none")
SKIPS = {"test_model_outputs_equivalence": ATTENTIONS_UNDER_SDPA,
         "test_capture_outputs_decorator": ATTENTIONS_UNDER_SDPA}
RECURRENT_SKIPS = {"test_can_set_attention_dynamically": RECURRENT_ATTENTION,
                   "test_retain_grad_hidden_states_attentions": RECURRENT_ATTENTION,
                   "test_eager_matches_sdpa_generate": RECURRENT_ATTENTION}  # a RUN_SLOW=1 test
WITHOUT_QUERIES_SKIPS = {"test_model_rope_scaling_from_config": (
    "the AFT and SSM priors have no queries or keys for RoPE to rotate, so RoPE scaling changes nothing (a "
    "non-default rope_parameters is warned about once)")}


def fem_test_case(prior: str):
    spec = PRIORS[prior]

    def make_config(tester):
        return FEMConfig(vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, prior=prior,
                         num_hidden_layers=tester.num_hidden_layers, num_attention_heads=tester.num_attention_heads,
                         intermediate_size=tester.intermediate_size, time_decay_rank=4, pad_token_id=0,
                         max_position_embeddings=64)

    class FEMCommonTest(common.ModelTesterMixin, common.GenerationTesterMixin, unittest.TestCase):
        all_model_classes = common.model_classes("fem")
        has_attentions = spec.attention_function

        def setUp(self):
            self.model_tester = common.TinyCausalLMTester(self, make_config)

        def _check_past_key_values_for_generate(self, batch_size, past_key_values, seq_length, config):
            """A recurrent prior's layers keep fixed-size states instead of keys and values (as transformers' Mamba
            tests check their own states): each state has the shape its read documents, whatever the length."""
            if not spec.recurrent:
                return super()._check_past_key_values_for_generate(batch_size, past_key_values, seq_length, config)
            self.assertEqual(len(past_key_values), config.num_hidden_layers)
            expected = PRIOR_CASES[prior].state_shapes(config, batch_size)
            for layer in past_key_values.layers:
                self.assertIsNone(layer.keys)
                self.assertEqual([tuple(state.shape) for state in layer.prior_state], expected)
                self.assertEqual(tuple(layer.time_decay_state.shape), (batch_size, config.time_decay_rank))

        def _check_caches_are_equal(self, cache1, cache2):
            if not spec.recurrent:
                return super()._check_caches_are_equal(cache1, cache2)
            self.assertEqual(len(cache1), len(cache2))
            for layer1, layer2 in zip(cache1.layers, cache2.layers):
                for state1, state2 in zip((*layer1.prior_state, layer1.time_decay_state),
                                          (*layer2.prior_state, layer2.time_decay_state), strict=True):
                    torch.testing.assert_close(state1, state2)

    FEMCommonTest.__name__ = FEMCommonTest.__qualname__ = f"FEM{prior.upper()}CommonTest"
    skips = {**SKIPS, **(RECURRENT_SKIPS if spec.recurrent else {}),
             **({} if spec.queries_and_keys else WITHOUT_QUERIES_SKIPS)}
    return common.with_skips(skips)(FEMCommonTest)


for _prior in FEM_PRIORS:  # FEMSOFTMAXCommonTest, FEMGLACommonTest, ...: unittest collects module globals
    globals()[f"FEM{_prior.upper()}CommonTest"] = fem_test_case(_prior)
