"""transformers' common model tests on Hyper-SET's three heads: image classification, Sudoku token classification,
MaskGIT masked image modelling (tests/support/transformers_common.py says how they run)."""

import functools
import unittest

import pytest
from transformers_common import (
    VISION_SKIPS,
    ModelTesterMixin,
    TinyImageTester,
    TinyTokenGridTester,
    model_classes,
    with_skips,
    zoo_classes_in_transformers_task_tables,  # noqa: F401 (autouse: the zoo's classes in transformers' task tables)
)

from energyzoo.modeling.configuration_hyperset import HyperSETConfig

pytestmark = pytest.mark.slow  # transformers' whole common suite per model class, compiled decoding included


def hyperset_config(tester, **inputs):
    """A two-layer Hyper-SET of two iterations per layer with the tester's sizes."""
    return HyperSETConfig(hidden_size=tester.hidden_size, num_attention_heads=tester.num_attention_heads,
                          intermediate_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
                          num_iterations=HYPERSET_ITERATIONS, time_embed_dim=16, **inputs)


HYPERSET_ITERATIONS = 2
# its hidden states are the embedding and the state after every iteration of every layer
HYPERSET_HIDDEN_STATES = TinyImageTester.num_hidden_layers * HYPERSET_ITERATIONS + 1


@functools.partial(with_skips, skips=VISION_SKIPS)
class HyperSETImageClassificationCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = model_classes("hyperset", "image-classification")
    has_attentions = False
    test_resize_embeddings = False  # no vocabulary

    def setUp(self):
        patch_size = 2
        self.model_tester = TinyImageTester(self, lambda tester: hyperset_config(
            tester, image_size=tester.image_size, patch_size=patch_size, num_channels=tester.num_channels,
            num_labels=tester.num_labels), seq_length=(8 // patch_size) ** 2 + 1)  # the patches and CLS
        self.model_tester.expected_num_hidden_layers = HYPERSET_HIDDEN_STATES


class HyperSETSudokuCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = model_classes("hyperset", "token-classification")
    has_attentions = False

    def setUp(self):
        self.model_tester = TinyTokenGridTester(
            self, lambda tester: hyperset_config(
                tester, input_type="tokens", vocab_size=tester.vocab_size, num_labels=9, use_cls_token=False,
                position_embedding_type="learned", max_position_embeddings=tester.seq_length),
            seq_length=16, expected_num_hidden_layers=HYPERSET_HIDDEN_STATES)  # a vocabulary the resize test can shrink


class HyperSETMaskGITCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = model_classes("hyperset", "masked-image-modeling")
    has_attentions = False

    def setUp(self):
        codebook = 16
        self.model_tester = TinyTokenGridTester(
            self, lambda tester: hyperset_config(
                tester, input_type="tokens", vocab_size=codebook + 1, codebook_size=codebook, mask_token_id=codebook,
                use_cls_token=False, position_embedding_type="sincos2d", max_position_embeddings=tester.seq_length),
            vocab_size=codebook, seq_length=16, image_size=4, patch_size=1,
            expected_num_hidden_layers=HYPERSET_HIDDEN_STATES)
