"""transformers' common model tests on Hyper-SET's three heads: image classification, Sudoku token classification,
MaskGIT masked image modelling (tests/support/transformers_common.py says how they run)."""

import unittest

import transformers_common as common

from energyzoo.modeling.configuration_hyperset import HyperSETConfig

pytestmark = common.MARKS


def hyperset_config(tester, **inputs):
    """A two-layer Hyper-SET of two iterations per layer with the tester's sizes."""
    return HyperSETConfig(hidden_size=tester.hidden_size, num_attention_heads=tester.num_attention_heads,
                          intermediate_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
                          num_iterations=HYPERSET_ITERATIONS, time_embed_dim=16, **inputs)


HYPERSET_ITERATIONS = 2
# its hidden states are the embedding and the state after every iteration of every layer
HYPERSET_HIDDEN_STATES = common.TinyImageTester.num_hidden_layers * HYPERSET_ITERATIONS + 1


@common.with_skips(common.VISION_SKIPS)
class HyperSETImageClassificationCommonTest(common.ModelTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("hyperset", "image-classification")
    has_attentions = False
    test_resize_embeddings = False  # no vocabulary

    def setUp(self):
        patch_size = 2
        self.model_tester = common.TinyImageTester(self, lambda tester: hyperset_config(
            tester, image_size=tester.image_size, patch_size=patch_size, num_channels=tester.num_channels,
            num_labels=tester.num_labels), seq_length=(8 // patch_size) ** 2 + 1)  # the patches and CLS
        self.model_tester.expected_num_hidden_layers = HYPERSET_HIDDEN_STATES


class HyperSETSudokuCommonTest(common.ModelTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("hyperset", "token-classification")
    has_attentions = False

    def setUp(self):
        self.model_tester = common.TinyTokenGridTester(
            self, lambda tester: hyperset_config(
                tester, input_type="tokens", vocab_size=tester.vocab_size, num_labels=9, use_cls_token=False,
                position_embedding_type="learned", max_position_embeddings=tester.seq_length),
            seq_length=16, expected_num_hidden_layers=HYPERSET_HIDDEN_STATES)  # a vocabulary the resize test can shrink


class HyperSETMaskGITCommonTest(common.ModelTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("hyperset", "masked-image-modeling")
    has_attentions = False

    def setUp(self):
        codebook = 16
        self.model_tester = common.TinyTokenGridTester(
            self, lambda tester: hyperset_config(
                tester, input_type="tokens", vocab_size=codebook + 1, codebook_size=codebook, mask_token_id=codebook,
                use_cls_token=False, position_embedding_type="sincos2d", max_position_embeddings=tester.seq_length),
            vocab_size=codebook, seq_length=16, image_size=4, patch_size=1,
            expected_num_hidden_layers=HYPERSET_HIDDEN_STATES)
