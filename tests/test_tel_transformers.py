"""transformers' common model and generation tests on TEL-GPT2, TEL-ViT and TEL-ResNet
(tests/support/transformers_common.py says how they run)."""

import unittest

import transformers_common as common

from energyzoo.modeling.configuration_tel import TELGPT2Config, TELResNetConfig, TELViTConfig

pytestmark = common.MARKS


class TELGPT2CommonTest(common.ModelTesterMixin, common.GenerationTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("tel-gpt2")

    def setUp(self):
        self.model_tester = common.TinyCausalLMTester(self, lambda tester: TELGPT2Config(
            vocab_size=tester.vocab_size, n_embd=tester.hidden_size, n_layer=tester.num_hidden_layers,
            n_head=tester.num_attention_heads, n_positions=64, tel_placement="full", bos_token_id=1, eos_token_id=2,
            pad_token_id=0))


@common.with_skips(common.VISION_SKIPS)
class TELViTCommonTest(common.ModelTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("tel-vit")
    test_resize_embeddings = False  # no vocabulary

    def setUp(self):
        patch_size = 2
        self.model_tester = common.TinyImageTester(self, lambda tester: TELViTConfig(
            image_size=tester.image_size, patch_size=patch_size, num_channels=tester.num_channels,
            hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
            num_attention_heads=tester.num_attention_heads, intermediate_size=37, num_labels=tester.num_labels,
            tel_placement="full"), seq_length=(8 // patch_size) ** 2 + 1)  # the patches and [CLS]


@common.with_skips({**common.VISION_SKIPS, **common.CONVOLUTIONAL_SKIPS})
class TELResNetCommonTest(common.ModelTesterMixin, unittest.TestCase):
    all_model_classes = common.model_classes("tel-resnet")
    has_attentions = False
    test_resize_embeddings = False  # no vocabulary

    def setUp(self):
        self.model_tester = common.TinyImageTester(self, lambda tester: TELResNetConfig(
            num_channels=tester.num_channels, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            layer_type="basic", num_labels=tester.num_labels, tel_placement="full"))
