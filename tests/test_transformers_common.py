"""transformers' own common model tests (`ModelTesterMixin`, `GenerationTesterMixin` from its repository's
``tests/``), run against zoo models the way transformers runs them for Llama and GPT-2. The test bodies are
transformers'; this file only wires model testers to them.

transformers' sdist does not ship its ``tests/`` folder and CI cannot download it, so this module reads the copy of
the installed release's ``tests/`` that ``ENERGYZOO_TRANSFORMERS_TESTS`` names (`.ci/run` names the one its machine
keeps for each end of the supported range). Without one it is skipped, the one skip of its kind in the suite. To use
transformers' own checkout::

    git clone --depth 1 --branch v$(python -c "import transformers; print(transformers.__version__)") \\
        https://github.com/huggingface/transformers ~/transformers
    ENERGYZOO_TRANSFORMERS_TESTS=~/transformers/tests python -m pytest -q tests/test_transformers_common.py

Covered: FEM (each prior), TEL-GPT2, TEL-ViT, TEL-ResNet, EqT-LLaMA, EER, and Hyper-SET's three heads (image
classification, Sudoku token classification, MaskGIT masked image modelling). Where a common test does not apply,
`SKIPS` says why.
"""

import functools
import os
import sys
import unittest
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version

pytestmark = pytest.mark.slow  # transformers' whole common suite per model class, compiled decoding included

RELEASE = ".".join(map(str, Version(transformers.__version__).release[:2]))
TRANSFORMERS_TESTS = os.environ.get("ENERGYZOO_TRANSFORMERS_TESTS")
if not TRANSFORMERS_TESTS:
    pytest.skip(f"no copy of transformers' tests/ for transformers {RELEASE}: set ENERGYZOO_TRANSFORMERS_TESTS (see "
                "this module's docstring)", allow_module_level=True)
sys.path.insert(0, str(Path(TRANSFORMERS_TESTS).resolve().parent))

from tests.generation.test_utils import GenerationTesterMixin  # noqa: E402
from tests.test_modeling_common import (  # noqa: E402
    ModelTesterMixin,
    floats_tensor,
    ids_tensor,
    random_attention_mask,
)
from transformers.models.auto import modeling_auto  # noqa: E402

from energyzoo.modeling.configuration_eer import EERConfig  # noqa: E402
from energyzoo.modeling.configuration_eqt import EqTLlamaConfig  # noqa: E402
from energyzoo.modeling.configuration_fem import FEM_PRIORS, FEMConfig  # noqa: E402
from energyzoo.modeling.configuration_hyperset import HyperSETConfig  # noqa: E402
from energyzoo.modeling.configuration_tel import TELGPT2Config, TELResNetConfig, TELViTConfig  # noqa: E402
from energyzoo.modeling.modeling_eer import EERForCausalLM, EERModel  # noqa: E402
from energyzoo.modeling.modeling_eqt import EqTLlamaForCausalLM, EqTLlamaModel  # noqa: E402
from energyzoo.modeling.modeling_fem import FEMForCausalLM, FEMForSequenceClassification, FEMModel  # noqa: E402
from energyzoo.modeling.modeling_hyperset import (  # noqa: E402
    HyperSETForImageClassification,
    HyperSETForMaskedImageModeling,
    HyperSETForTokenClassification,
    HyperSETModel,
)
from energyzoo.modeling.modeling_tel import (  # noqa: E402
    TELGPT2LMHeadModel,
    TELGPT2Model,
    TELResNetForImageClassification,
    TELResNetModel,
    TELViTForImageClassification,
    TELViTModel,
)
from energyzoo.registry import ARCHITECTURES  # noqa: E402

# transformers' tests find a class's task by its name in these tables, where transformers lists its own models; the
# zoo's entries come from the registry
MAPPING_OF_TASK = {"causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                   "sequence-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                   "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
                   "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
                   "masked-image-modeling": "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES"}
TASK_TABLES = {"MODEL_MAPPING_NAMES": {name: entry.base_model.__name__ for name, entry in ARCHITECTURES.items()}}
for _name, _entry in ARCHITECTURES.items():
    for _task, _head in _entry.heads.items():
        TASK_TABLES.setdefault(MAPPING_OF_TASK[_task], {})[_name] = _head.__name__
RECURRENT_ATTENTION = ("the GLA, AFT and SSM priors are recurrences, not softmax attention: FEM accepts only "
                       "attn_implementation='sdpa' for them and refuses 'eager' with a clear error")
ATTENTIONS_UNDER_SDPA = ("it asks for output_attentions=True under SDPA; FEM refuses that with a clear error (the "
                         "probabilities exist only under attn_implementation='eager') instead of returning none")
READS_TOKEN_IDS = ("the reverse and masked energies (eqt.txt eq. 12-13) read the token ids: EqT-LLaMA refuses "
                   "inputs_embeds alone (generate() passes only them for the prompt) with a clear error unless "
                   "lambda_rev = lambda_mask = 0")
SKIPS = {  # (family, test name or its parameterized prefix) -> why it does not apply
    ("fem", "test_model_outputs_equivalence"): ATTENTIONS_UNDER_SDPA,
    ("fem", "test_capture_outputs_decorator"): ATTENTIONS_UNDER_SDPA,
    ("fem-recurrent", "test_can_set_attention_dynamically"): RECURRENT_ATTENTION,
    ("fem-recurrent", "test_retain_grad_hidden_states_attentions"): RECURRENT_ATTENTION,
    ("vision", "test_model_get_set_embeddings"): (
        "images enter through a patch or stem convolution, not a token embedding (transformers' ViT and ResNet tests "
        "replace or skip it too)"),
    ("convolutional", "test_hidden_states_output"): (
        "its hidden states are feature maps (batch, channels, height, width), not the (batch, sequence, hidden) the "
        "common test reads (transformers' ResNet test replaces it too)"),
    ("vision", "test_inputs_embeds"): (
        "the common test builds inputs_embeds from input_ids, which an image model does not take (transformers' ViT "
        "test skips it too)"),
    **{("eqt", name): READS_TOKEN_IDS for name in (
        "test_inputs_embeds", "test_generate_from_inputs_embeds", "test_generate_continue_from_inputs_embeds",
        "test_generate_from_random_inputs_embeds")},
    ("eqt", "test_init_weights_can_init_buffers"): (
        "the memory banks (eq. 15-16) are N(0, 1) prototypes by design, so two initialisations differ; "
        "`_init_weights` draws them (the test expects deterministic buffers)"),
    ("eer", "test_retain_grad_hidden_states_attentions"): (
        "the first hidden state is Z_0 = 0 (eer.txt §5.1), a constant with no gradient to retain"),
    ("eer", "test_sdpa_can_dispatch_non_composite_models"): (
        "EER loads with eager attention unless asked otherwise: every training forward reads the attention "
        "probabilities (eq. 3-5), which eager computes with the output; SDPA is available on request"),
    ("fem-without-queries", "test_model_rope_scaling_from_config"): (
        "the AFT and SSM priors have no queries or keys for RoPE to rotate, so RoPE scaling changes nothing (a "
        "non-default rope_parameters is warned about once)"),
}


@pytest.fixture(autouse=True)
def zoo_classes_in_transformers_task_tables(monkeypatch):
    for table, entries in TASK_TABLES.items():
        for model_type, class_name in entries.items():
            monkeypatch.setitem(getattr(modeling_auto, table), model_type, class_name)


class TinyCausalLMTester:
    """What transformers' common tests read of a model tester, for a causal LM on token ids."""

    batch_size, seq_length, vocab_size = 3, 7, 99
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    is_training = True

    def __init__(self, parent, make_config, **sizes):
        self.parent, self.make_config = parent, make_config
        self.__dict__.update(sizes)  # a model's own sizes in place of the class defaults

    def get_config(self):
        return self.make_config(self)

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        return self.get_config(), {"input_ids": input_ids,
                                   "attention_mask": random_attention_mask([self.batch_size, self.seq_length])}


class TinyTokenGridTester(TinyCausalLMTester):
    """Token ids on a fixed grid without padding (Sudoku cells, MaskGIT codes): no attention mask. ``image_size``
    and ``patch_size`` are the code grid's side and 1, which the masked-image-modelling tests read."""

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), {"input_ids": ids_tensor([self.batch_size, self.seq_length], self.vocab_size)}


def with_skips(test_class, families):
    """Replace each common test that `SKIPS` names for ``families`` (each parameterized variant) by a skip that says
    why."""
    for (family, prefix), reason in SKIPS.items():
        if family in families:
            for name in [name for name in dir(test_class) if name == prefix or name.startswith(f"{prefix}_")]:
                setattr(test_class, name, unittest.skip(reason)(lambda self: None))
    return test_class


def fem_test_case(prior: str):
    def make_config(tester):
        return FEMConfig(vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, prior=prior,
                         num_hidden_layers=tester.num_hidden_layers, num_attention_heads=tester.num_attention_heads,
                         intermediate_size=tester.intermediate_size, time_decay_rank=4, pad_token_id=0,
                         max_position_embeddings=64)

    class FEMCommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
        all_model_classes = (FEMModel, FEMForCausalLM, FEMForSequenceClassification)
        has_attentions = prior == "softmax"

        def setUp(self):
            self.model_tester = TinyCausalLMTester(self, make_config)

        def _check_past_key_values_for_generate(self, batch_size, past_key_values, seq_length, config):
            """A recurrent prior's layers keep fixed-size states instead of keys and values (as transformers' Mamba
            tests check their own states): each state has the shape its read documents, whatever the length."""
            if prior == "softmax":
                return super()._check_past_key_values_for_generate(batch_size, past_key_values, seq_length, config)
            self.assertEqual(len(past_key_values), config.num_hidden_layers)
            expected = recurrent_state_shapes(config, batch_size)
            for layer in past_key_values.layers:
                self.assertIsNone(layer.keys)
                self.assertEqual([tuple(state.shape) for state in layer.prior_state], expected)
                self.assertEqual(tuple(layer.time_decay_state.shape), (batch_size, config.time_decay_rank))

        def _check_caches_are_equal(self, cache1, cache2):
            if prior == "softmax":
                return super()._check_caches_are_equal(cache1, cache2)
            self.assertEqual(len(cache1), len(cache2))
            for layer1, layer2 in zip(cache1.layers, cache2.layers):
                for state1, state2 in zip((*layer1.prior_state, layer1.time_decay_state),
                                          (*layer2.prior_state, layer2.time_decay_state), strict=True):
                    torch.testing.assert_close(state1, state2)

    FEMCommonTest.__name__ = FEMCommonTest.__qualname__ = f"FEM{prior.upper()}CommonTest"
    families = {"softmax": ("fem",), "gla": ("fem", "fem-recurrent"),
                "aft": ("fem", "fem-recurrent", "fem-without-queries"),
                "ssm": ("fem", "fem-recurrent", "fem-without-queries")}[prior]
    return with_skips(FEMCommonTest, families)


def recurrent_state_shapes(config, batch):
    """The state of a recurrent prior's read, as its docstring gives it (FEM App. H.2-H.4): GLA (S, M) with S
    (batch, heads, key_dim, 2 v_dim + 1) and M (batch, heads, 1, v_dim); AFT (N, mu, M) with N (batch, 3 channels)
    and mu, M (batch, channels); SSM (h, M) with h (batch, channels, N, 3) and M (batch, channels)."""
    heads, channels = config.num_attention_heads, config.value_width
    return {"gla": [(batch, heads, config.head_dim, 2 * config.value_head_dim + 1),
                    (batch, heads, 1, config.value_head_dim)],
            "aft": [(batch, 3 * channels), (batch, channels), (batch, channels)],
            "ssm": [(batch, channels, config.ssm_state_size, 3), (batch, channels)]}[config.prior]


for _prior in FEM_PRIORS:  # FEMSOFTMAXCommonTest, FEMGLACommonTest, ...: unittest collects module globals
    globals()[f"FEM{_prior.upper()}CommonTest"] = fem_test_case(_prior)


class TELGPT2CommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (TELGPT2Model, TELGPT2LMHeadModel)

    def setUp(self):
        self.model_tester = TinyCausalLMTester(self, lambda tester: TELGPT2Config(
            vocab_size=tester.vocab_size, n_embd=tester.hidden_size, n_layer=tester.num_hidden_layers,
            n_head=tester.num_attention_heads, n_positions=64, tel_placement="full", bos_token_id=1, eos_token_id=2,
            pad_token_id=0))


class TinyImageTester:
    """What transformers' common tests read of a model tester, for an image classifier on pixel values."""

    batch_size, image_size, num_channels, num_labels = 3, 8, 3, 3
    hidden_size, num_hidden_layers, num_attention_heads = 32, 2, 4
    is_training = True

    def __init__(self, parent, make_config, seq_length=None):
        self.parent, self.make_config, self.seq_length = parent, make_config, seq_length
        # read by the tests' masked-image-modeling branches (bool_masked_pos covers the patches, not [CLS])
        self.mask_length = (seq_length or 1) - 1
        self.num_masks = self.mask_length // 2

    def get_config(self):
        return self.make_config(self)

    def prepare_config_and_inputs_for_common(self):
        pixels = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        return self.get_config(), {"pixel_values": pixels}


@functools.partial(with_skips, families=("vision",))
class TELViTCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (TELViTModel, TELViTForImageClassification)
    test_resize_embeddings = False  # no vocabulary

    def setUp(self):
        patch_size = 2
        self.model_tester = TinyImageTester(self, lambda tester: TELViTConfig(
            image_size=tester.image_size, patch_size=patch_size, num_channels=tester.num_channels,
            hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
            num_attention_heads=tester.num_attention_heads, intermediate_size=37, num_labels=tester.num_labels,
            tel_placement="full"), seq_length=(8 // patch_size) ** 2 + 1)  # the patches and [CLS]


@functools.partial(with_skips, families=("vision", "convolutional"))
class TELResNetCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (TELResNetModel, TELResNetForImageClassification)
    has_attentions = False
    test_resize_embeddings = False  # no vocabulary

    def setUp(self):
        self.model_tester = TinyImageTester(self, lambda tester: TELResNetConfig(
            num_channels=tester.num_channels, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            layer_type="basic", num_labels=tester.num_labels, tel_placement="full"))


@functools.partial(with_skips, families=("eqt",))
class EqTLlamaCommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (EqTLlamaModel, EqTLlamaForCausalLM)

    def setUp(self):
        self.model_tester = TinyCausalLMTester(self, lambda tester: EqTLlamaConfig(
            vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
            num_attention_heads=tester.num_attention_heads, num_key_value_heads=2,
            intermediate_size=tester.intermediate_size, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, erm_num_steps=2, erm_num_steps_train=1, erm_rev_window=4, erm_rev_num_layers=1,
            erm_rev_num_heads=2, erm_memory_size=16, erm_memory_topk=2))


@functools.partial(with_skips, families=("eer",))
class EERCommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (EERModel, EERForCausalLM)

    def setUp(self):  # EER's single head (eer.txt §5.1); num_hidden_layers is the loop count T
        self.model_tester = TinyCausalLMTester(
            self, lambda tester: EERConfig(
                vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_attention_heads=1,
                intermediate_size=tester.intermediate_size, num_loops=tester.num_hidden_layers, pad_token_id=0,
                bos_token_id=1, eos_token_id=2),
            hidden_size=16, num_attention_heads=1, intermediate_size=32)


def hyperset_config(tester, **inputs):
    """A two-layer Hyper-SET of two iterations per layer with the tester's sizes."""
    return HyperSETConfig(hidden_size=tester.hidden_size, num_attention_heads=tester.num_attention_heads,
                          intermediate_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
                          num_iterations=HYPERSET_ITERATIONS, time_embed_dim=16, **inputs)


HYPERSET_ITERATIONS = 2
# its hidden states are the embedding and the state after every iteration of every layer
HYPERSET_HIDDEN_STATES = TinyImageTester.num_hidden_layers * HYPERSET_ITERATIONS + 1


@functools.partial(with_skips, families=("vision",))
class HyperSETImageClassificationCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (HyperSETModel, HyperSETForImageClassification)
    has_attentions = False
    test_resize_embeddings = False  # no vocabulary

    def setUp(self):
        patch_size = 2
        self.model_tester = TinyImageTester(self, lambda tester: hyperset_config(
            tester, image_size=tester.image_size, patch_size=patch_size, num_channels=tester.num_channels,
            num_labels=tester.num_labels), seq_length=(8 // patch_size) ** 2 + 1)  # the patches and CLS
        self.model_tester.expected_num_hidden_layers = HYPERSET_HIDDEN_STATES


class HyperSETSudokuCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (HyperSETModel, HyperSETForTokenClassification)
    has_attentions = False

    def setUp(self):
        self.model_tester = TinyTokenGridTester(
            self, lambda tester: hyperset_config(
                tester, input_type="tokens", vocab_size=tester.vocab_size, num_labels=9, use_cls_token=False,
                position_embedding_type="learned", max_position_embeddings=tester.seq_length),
            seq_length=16, expected_num_hidden_layers=HYPERSET_HIDDEN_STATES)  # a vocabulary the resize test can shrink


class HyperSETMaskGITCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (HyperSETModel, HyperSETForMaskedImageModeling)
    has_attentions = False

    def setUp(self):
        codebook = 16
        self.model_tester = TinyTokenGridTester(
            self, lambda tester: hyperset_config(
                tester, input_type="tokens", vocab_size=codebook + 1, codebook_size=codebook, mask_token_id=codebook,
                use_cls_token=False, position_embedding_type="sincos2d", max_position_embeddings=tester.seq_length),
            vocab_size=codebook, seq_length=16, image_size=4, patch_size=1,
            expected_num_hidden_layers=HYPERSET_HIDDEN_STATES)


def test_every_registered_class_runs_transformers_common_tests():
    """Each architecture's base model and heads are among some common test's `all_model_classes`, and FEM runs them
    with every prior."""
    tested = {cls for case in globals().values() if isinstance(case, type) and issubclass(case, ModelTesterMixin)
              for cls in case.all_model_classes}
    declared = {cls for entry in ARCHITECTURES.values() for cls in (entry.base_model, *entry.heads.values())}
    assert declared - tested == set()
    assert all(f"FEM{prior.upper()}CommonTest" in globals() for prior in FEM_PRIORS)
