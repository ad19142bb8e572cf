"""The wiring of transformers' own common model tests (`ModelTesterMixin`, `GenerationTesterMixin` from its
repository's ``tests/``) to zoo models, the way transformers runs them for Llama and GPT-2: each family's
``tests/test_<family>_transformers.py`` holds its test classes (transformers' test bodies, a model tester and the
skips that do not apply, each with its reason); `tests/test_transformers_common.py` checks that every registered
class runs them.

transformers' sdist does not ship its ``tests/`` folder and CI cannot download it, so these modules read the copy of
the installed release's ``tests/`` that ``ENERGYZOO_TRANSFORMERS_TESTS`` names (`.ci/run` names the one its machine
keeps for each end of the supported range). Without one, importing this module skips the importing test module, the
one skip of its kind in the suite. To use transformers' own checkout::

    git clone --depth 1 --branch v$(python -c "import transformers; print(transformers.__version__)") \\
        https://github.com/huggingface/transformers ~/transformers
    ENERGYZOO_TRANSFORMERS_TESTS=~/transformers/tests python -m pytest -q tests/test_*_transformers.py
"""

import copy
import os
import sys
import tempfile
import unittest
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import set_seed
from transformers.exporters import ExportedModel

RELEASE = ".".join(map(str, Version(transformers.__version__).release[:2]))
TRANSFORMERS_TESTS = os.environ.get("ENERGYZOO_TRANSFORMERS_TESTS")
if not TRANSFORMERS_TESTS:
    pytest.skip(f"no copy of transformers' tests/ for transformers {RELEASE}: set ENERGYZOO_TRANSFORMERS_TESTS (see "
                "tests/support/transformers_common.py)", allow_module_level=True)
if not (Path(TRANSFORMERS_TESTS) / "test_modeling_common.py").is_file():  # a wrong path would import ours as `tests`
    raise FileNotFoundError(f"ENERGYZOO_TRANSFORMERS_TESTS={TRANSFORMERS_TESTS} is not a copy of transformers' tests/ "
                            "(it has no test_modeling_common.py)")
sys.path.insert(0, str(Path(TRANSFORMERS_TESTS).resolve().parent))

from tests.generation.test_utils import GenerationTesterMixin  # noqa: E402
from tests.test_modeling_common import ModelTesterMixin as TransformersModelTesterMixin  # noqa: E402
from tests.test_modeling_common import (  # noqa: E402
    floats_tensor,
    ids_tensor,
    random_attention_mask,
)

from energyzoo.registry import ARCHITECTURES, TASKS  # noqa: E402

__all__ = ["GenerationTesterMixin", "ModelTesterMixin", "TinyCausalLMTester", "TinyImageTester", "TinyTokenGridTester",
           "VISION_SKIPS", "CONVOLUTIONAL_SKIPS", "MARKS", "model_classes", "with_skips"]

# every family's module: transformers' whole common suite per model class (compiled decoding included) is slow, and
# transformers' tests find a class's task in its task tables (the fixture, in tests/conftest.py)
MARKS = [pytest.mark.slow, pytest.mark.usefixtures("zoo_classes_in_transformers_task_tables")]

# transformers' tests find a class's task by its name in these tables, where transformers lists its own models; the
# zoo's entries come from the registry (the fixture `zoo_classes_in_transformers_task_tables` puts them there)
TASK_TABLES = {"MODEL_MAPPING_NAMES": {name: entry.base_model.__name__ for name, entry in ARCHITECTURES.items()}}
for _name, _entry in ARCHITECTURES.items():
    for _task, _head in _entry.heads.items():
        TASK_TABLES.setdefault(TASKS[_task].transformers_mapping, {})[_name] = _head.__name__
VISION_SKIPS = {
    "test_model_get_set_embeddings": (
        "images enter through a patch or stem convolution, not a token embedding (transformers' ViT and ResNet tests "
        "replace or skip it too)"),
    "test_inputs_embeds": (
        "the common test builds inputs_embeds from input_ids, which an image model does not take (transformers' ViT "
        "test skips it too)"),
}
CONVOLUTIONAL_SKIPS = {
    "test_hidden_states_output": (
        "its hidden states are feature maps (batch, channels, height, width), not the (batch, sequence, hidden) the "
        "common test reads (transformers' ResNet test replaces it too)"),
}


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


# The copies of tests/exporters this machine keeps are a 5.16.0.dev0 checkout's (the sdists ship none): their
# torch.export tests call `ExportedModel.module()`, which the exporters of 5.23 and 5.24 no longer have, so they fail
# for every model, transformers' own Llama included. The releases' own copies cannot be fetched here (the repository's
# snapshot is past the fetch tool's size limit); a copy that does not call it runs them.
STALE_EXPORT_TESTS = (not hasattr(ExportedModel, "module")
                      and "exported_program.module()" in (Path(TRANSFORMERS_TESTS) / "exporters" / "test_export.py")
                      .read_text())


class ModelTesterMixin(TransformersModelTesterMixin):
    """transformers' common model tests, plus the two offload tests it runs only on an accelerator
    (``test_disk_offload_safetensors``, ``test_cpu_offload``) carried to a CPU and a disk: their loading, device-map
    check and assertions, with the CPU as the main device and the disk as the offload."""

    def _skip_if_not_exportable(self):
        """transformers' check, then the export tests of a copy written for another exporters API skipped with why
        (`STALE_EXPORT_TESTS`): the RUN_SLOW=1 export tests, model and generate."""
        super()._skip_if_not_exportable()
        if STALE_EXPORT_TESTS:
            self.skipTest(reason="this copy of transformers' export tests calls ExportedModel.module(), which this "
                                 "transformers' exporters do not have (transformers' own Llama fails them alike)")

    def test_disk_offload_safetensors_on_the_cpu(self):
        """``test_disk_offload_safetensors``'s and ``test_disk_offload_bin``'s splits of the model (70 % and 50 % of
        its size in memory): loaded with ``device_map="auto"``, part of it on disk, the parameters where the device map
        puts them (on disk: the meta device), the outputs those of the model in memory."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            if model_class._no_split_modules is None:
                continue
            inputs = self._prepare_for_class(inputs_dict, model_class)
            model = model_class(copy.deepcopy(config)).eval()
            set_seed(42)
            base_output = model(**inputs)
            model_size = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                for share in self.model_split_percents[:2]:
                    new_model = model_class.from_pretrained(folder, device_map="auto", offload_folder=folder,
                                                            max_memory={"cpu": int(share * model_size)})
                    self.assertIn("disk", set(new_model.hf_device_map.values()))
                    for name, parameter in new_model.named_parameters():
                        place = name
                        while place and place not in new_model.hf_device_map:
                            place = place.rpartition(".")[0]
                        expected = "meta" if new_model.hf_device_map[place] == "disk" else "cpu"
                        self.assertEqual(parameter.device.type, expected, name)
                    set_seed(42)
                    new_output = new_model(**inputs)
                    torch.testing.assert_close(new_output[0], base_output[0], rtol=1e-5, atol=1e-5)


def with_skips(skips: dict[str, str]):
    """A class decorator replacing each common test that ``skips`` names (a test name or its parameterized prefix ->
    why it does not apply; each parameterized variant) by a skip that says why."""
    def decorate(test_class):
        for prefix, reason in skips.items():
            for name in [name for name in dir(test_class) if name == prefix or name.startswith(f"{prefix}_")]:
                setattr(test_class, name, unittest.skip(reason)(lambda self: None))
        return test_class

    return decorate


def model_classes(model_type: str, *tasks: str) -> tuple[type, ...]:
    """The registered base model and heads of an architecture (those of ``tasks`` only, where given): a common
    test's ``all_model_classes``."""
    entry = ARCHITECTURES[model_type]
    return (entry.base_model, *(entry.heads[task] for task in tasks or entry.heads))
