"""The model contract every energyzoo architecture passes (docs/contributing.md, "A new architecture").

A new architecture adds a small tester: subclass `ModelContract` (vision), `CausalLMContract` or
`SequenceClassificationContract` (token models, which add padding items 3/6 and, for causal LMs, item 7)
in a `test_*.py` file, name its `model_type` and `task` (the classes under test come from the registry), set
the other class attributes and implement `make_config`, `without_distinctive_term` and `recomputed_energy`
(and `make_inputs` for non-token models; `perturb` where a module is zero-initialised). Kernel-level float64
checks (item 8, second half) live in each architecture's own test files.
"""

import copy
import inspect
import os
import pickle
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers
from big_models import (
    LOADINGS,
    QUANTIZATIONS,
    adapters_on_the_cpu,
    load_offloaded,
    offloaded_in_part,
    quantized,
    relative_error,
    same_size_baseline,
)
from transformers import AutoConfig, AutoModel, Trainer, TrainingArguments

from energyzoo.export import export_model
from energyzoo.modeling.fem_compiled_decoding import EAGER_DECODING_ENV
from energyzoo.modeling.outputs import COMMON_ENERGY_KEYS, EnergyTrace
from energyzoo.modeling.transformers_compat import cache_of
from energyzoo.registry import ARCHITECTURES, TASKS

REMOTE_LOAD_SCRIPT = Path(__file__).with_name("remote_load_check.py")
# Exported folders load in a fresh process of this environment, and of one at the other end of the supported
# transformers range when ENERGYZOO_OTHER_END_PYTHON names its python (.ci/run sets it both ways).
OTHER_END_PYTHON = os.environ.get("ENERGYZOO_OTHER_END_PYTHON")
RUNTIMES = {"this-release": sys.executable, **({"other-end-of-range": OTHER_END_PYTHON} if OTHER_END_PYTHON else {})}


def fresh_process_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a process that loads exported folders as a new user would: offline, its own remote-code
    module cache, nothing of this one's but the decoding switch the suite runs with (`fem_compiled_decoding`: compiled
    decoding has tests of its own, and the wheel check loads an export with it on)."""
    return {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin",
            EAGER_DECODING_ENV: os.environ.get(EAGER_DECODING_ENV, "0")}


def output_tensor(outputs) -> torch.Tensor:
    return outputs.logits if getattr(outputs, "logits", None) is not None else outputs.last_hidden_state


def distinct_weights(model) -> set[str]:
    """The names of ``model``'s state dict, a tied weight (an LM head's) once, under its first name."""
    seen, names = set(), set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            names.add(name)
    return names


def loss_and_gradients(model, inputs, forward=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and parameter gradients of ``model``; ``forward`` (e.g. its compiled wrapper) runs it if given."""
    model.zero_grad()
    loss = (model if forward is None else forward)(**inputs).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


class ModelContract:
    model_type: str  # a `registry.ARCHITECTURES` key
    task: str  # the head under test: a task of the architecture's `heads`
    causal_lm: bool = False
    lora_target_modules: list[str]
    energy_names: set[str]  # the family's own keys every trace has
    common_energy_keys: tuple[str, ...]  # the shared keys (`COMMON_ENERGY_KEYS`) the family records
    configured_steps: int | None = None  # K of an iterative model's tiny config; None: not iterative
    invalid_config_values: list[tuple[str, object]]
    tolerance: float = 1e-5
    supports_activation_checkpointing: bool = True
    checkpointed_block: str | None = None  # class name of the checkpointed block; None: first `_no_split_modules`
    attention_implementations: tuple[str, ...] = ("eager", "sdpa")  # accepted; "flash_attention_2" is refused on CPU
    has_attentions: bool = True  # eager attention returns probabilities with output_attentions=True
    half_precision_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
    # Trainer with gradient accumulation (tests/test_trainer_accumulation.py): the config overrides under which an
    # accumulated step is the whole batch's, or why none is (a forward pooling statistics over the batch)
    trainer_overrides: dict = {}
    takes_any_image_size: bool = False  # a vision model that pools whatever size it is given (ResNet)
    accumulation_left_out: str | None = None

    @property
    def config_class(self) -> type:
        return ARCHITECTURES[self.model_type].config_class

    @property
    def head_class(self) -> type:
        """The class under test (it takes `labels`)."""
        return ARCHITECTURES[self.model_type].heads[self.task]

    @property
    def head_auto_class(self) -> type:
        return TASKS[self.task].auto_class

    @property
    def auto_classes(self) -> dict[type, type]:
        return {AutoModel: ARCHITECTURES[self.model_type].base_model, self.head_auto_class: self.head_class}

    def make_config(self, **overrides):
        raise NotImplementedError

    def make_inputs(self, config, batch_size: int = 2, seed: int = 0) -> dict:
        """Model inputs with `labels`."""
        raise NotImplementedError

    def perturb(self, model) -> None:
        """Move zero-initialised parts away from zero (in place), so the checks see them act."""

    def without_distinctive_term(self, model):
        """A model computing ``model`` without the architecture's own term (same weights otherwise): what a
        precision bug that collapsed the term would compute."""
        raise NotImplementedError

    # helpers ---------------------------------------------------------------------------------------
    def build(self, model_class=None, seed: int = 0, **overrides):
        torch.manual_seed(seed)
        model = (model_class or self.head_class)(self.make_config(**overrides))
        self.perturb(model)
        return model.eval()

    @staticmethod
    def without_labels(inputs: dict) -> dict:
        return {k: v for k, v in inputs.items() if k != "labels"}

    @staticmethod
    def cast_inputs(inputs: dict, dtype: torch.dtype) -> dict:
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}

    # 1. registration and round trip ----------------------------------------------------------------
    def test_auto_classes_build_registered_models(self):
        config = self.make_config()
        assert isinstance(AutoConfig.for_model(self.model_type), self.config_class)
        for auto_class, model_class in self.auto_classes.items():
            assert type(auto_class.from_config(config)) is model_class

    def test_save_and_load_round_trip_is_identical(self, tmp_path):
        model = self.build()
        inputs = self.without_labels(self.make_inputs(model.config))
        model.save_pretrained(tmp_path)
        assert (tmp_path / "model.safetensors").exists()
        reloaded, info = self.head_auto_class.from_pretrained(tmp_path, output_loading_info=True)
        reloaded.eval()
        assert type(reloaded) is self.head_class and not info["missing_keys"] and not info["unexpected_keys"]
        with torch.no_grad():
            assert torch.equal(output_tensor(model(**inputs)), output_tensor(reloaded(**inputs)))

    @pytest.mark.parametrize("saved", ["head", "base"])
    def test_base_model_and_head_load_each_others_folders(self, tmp_path, saved):
        """`AutoModel` on the head's folder (and the head's Auto class on the base model's) loads every weight the
        folder holds: newly initialised are exactly the parameters the saved class lacks (the head's classifier, a
        pooler), and the base outputs are the saved model's own."""
        base_class = ARCHITECTURES[self.model_type].base_model
        source = self.build(self.head_class if saved == "head" else base_class)
        inputs = self.without_labels(self.make_inputs(source.config))
        source.save_pretrained(tmp_path)
        loader = AutoModel if saved == "head" else self.head_auto_class
        loaded, info = loader.from_pretrained(tmp_path, output_loading_info=True)
        loaded.eval()
        head, base = (source, loaded) if saved == "head" else (loaded, source)
        prefix = head.base_model_prefix
        base_names = {f"{prefix}.{name}" for name in distinct_weights(base)}
        source_names = distinct_weights(source) if saved == "head" else base_names
        loaded_names = base_names if saved == "head" else distinct_weights(head)
        lacked = {name.removeprefix(f"{prefix}.") if saved == "head" else name for name in loaded_names - source_names}
        assert set(info["missing_keys"]) == lacked
        accepted = set(inspect.signature(base.forward).parameters)
        base_inputs = {key: value for key, value in inputs.items() if key in accepted}
        with torch.no_grad():
            expected = getattr(head, prefix)(**base_inputs)[0]
            assert torch.equal(base(**base_inputs)[0], expected)

    # 2. remote code in a fresh process ---------------------------------------------------------------
    @pytest.mark.slow
    @pytest.mark.parametrize("runtime", RUNTIMES)
    def test_exported_folder_loads_as_remote_code_without_energyzoo(self, tmp_path, runtime):
        model = self.build()
        inputs = self.without_labels(self.make_inputs(model.config))
        folder = export_model(model, tmp_path / "export")
        payload = {"auto_class": self.head_auto_class.__name__, "inputs": inputs}
        with torch.no_grad():
            payload["expected"] = output_tensor(model(**inputs))
        if self.causal_lm:
            generation = dict(max_new_tokens=6, do_sample=False, pad_token_id=model.config.pad_token_id)
            payload["generation"] = generation
            payload["generated"] = model.generate(**inputs, **generation)
        torch.save(payload, tmp_path / "payload.pt")
        result = subprocess.run(
            [RUNTIMES[runtime], str(REMOTE_LOAD_SCRIPT), str(folder), str(tmp_path / "payload.pt")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=fresh_process_env(tmp_path),
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "REMOTE_OK transformers_modules" in result.stdout
        release = result.stdout.split("REMOTE_OK transformers_modules")[1].split()[-1]
        assert (release == transformers.__version__) == (runtime == "this-release"), release

    # 3. loss and gradients ---------------------------------------------------------------------------
    def test_labels_give_loss_and_finite_gradients_everywhere(self):
        model = self.build().train()
        outputs = model(**self.make_inputs(model.config))
        assert outputs.loss.dim() == 0 and torch.isfinite(outputs.loss)
        outputs.loss.backward()
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                assert parameter.grad is not None, f"no gradient reaches {name}"
                assert torch.isfinite(parameter.grad).all(), f"non-finite gradient in {name}"

    # 4. Trainer and activation checkpointing ---------------------------------------------------------
    def test_trainer_lowers_loss_on_a_fixed_batch(self, tmp_path):
        model = self.build().train()
        batch = self.make_inputs(model.config, batch_size=4)
        rows = [{k: v[i] for k, v in batch.items()} for i in range(4)]
        with torch.no_grad():
            before = model(**batch).loss.item()
        args = TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=12,
            per_device_train_batch_size=4,
            learning_rate=3e-3,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        )
        Trainer(model=model, args=args, train_dataset=rows).train()
        model.eval()
        with torch.no_grad():
            after = model(**batch).loss.item()
        assert after < 0.9 * before, (before, after)

    def test_activation_checkpointing_keeps_loss_and_gradients(self):
        model = self.build().train()
        if not self.supports_activation_checkpointing:
            assert not model.supports_gradient_checkpointing
            with pytest.raises(ValueError, match="does not support"):
                model.activation_checkpointing_enable()
            return
        inputs = self.make_inputs(model.config)
        block_names = [self.checkpointed_block] if self.checkpointed_block else model._no_split_modules
        block = next(m for m in model.modules() if m.__class__.__name__ in block_names)
        # Checkpointing wraps the block's forward, so the modules its forward runs run again during backward: twice as
        # often as without checkpointing (a recurrent block runs them several times per forward). Modules of the block
        # also used outside its forward (e.g. for keys computed once) do not double, so some module doubling is asked.
        calls = []
        handles = [leaf.register_forward_hook(lambda module, *args: calls.append(module))
                   for leaf in block.modules() if not list(leaf.children())]
        plain_loss, plain_grads = loss_and_gradients(model, inputs)
        plain_calls = Counter(calls)
        calls.clear()
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        checkpointed_loss, checkpointed_grads = loss_and_gradients(model, inputs)
        for handle in handles:
            handle.remove()
        checkpointed_calls = Counter(calls)
        assert any(checkpointed_calls[module] == 2 * count for module, count in plain_calls.items()), \
            "the block's forward should run again in backward when checkpointed"
        torch.testing.assert_close(checkpointed_loss, plain_loss)
        assert plain_grads.keys() == checkpointed_grads.keys()
        for name in plain_grads:
            torch.testing.assert_close(checkpointed_grads[name], plain_grads[name], rtol=1e-5, atol=1e-6)

    # 5. peft LoRA ------------------------------------------------------------------------------------
    def test_lora_attaches_trains_saves_reloads_and_merges(self, tmp_path):
        from peft import LoraConfig, PeftModel, get_peft_model

        base = self.build()
        base.save_pretrained(tmp_path / "base")
        inputs = self.make_inputs(base.config)
        plain = self.without_labels(inputs)
        with torch.no_grad():
            base_output = output_tensor(base(**plain))
        lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=self.lora_target_modules))
        trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        for target in self.lora_target_modules:
            assert any(f".{target}.lora_A" in n for n in trainable), f"LoRA missed {target}"
        optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
        lora.train()
        for module in lora.modules():  # running statistics are buffers, not adapter weights: keep them frozen
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()
        for _ in range(3):
            optimizer.zero_grad()
            lora(**inputs).loss.backward()
            optimizer.step()
        lora.eval()
        with torch.no_grad():
            tuned_output = output_tensor(lora(**plain))
        assert not torch.allclose(tuned_output, base_output)
        lora.save_pretrained(tmp_path / "adapter")

        base = self.head_auto_class.from_pretrained(tmp_path / "base")
        reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
        reloaded.eval()
        with torch.no_grad():
            torch.testing.assert_close(output_tensor(reloaded(**plain)), tuned_output)
            merged = reloaded.merge_and_unload()
            assert type(merged) is self.head_class
            torch.testing.assert_close(output_tensor(merged(**plain)), tuned_output, rtol=1e-4, atol=1e-4)

    # 8. precision ------------------------------------------------------------------------------------
    @pytest.mark.parametrize("mode", ["cast", "autocast"])
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
    def test_half_precision_tracks_fp32_closer_than_the_distinctive_term(self, dtype, mode):
        """Outputs in eval and training mode, and gradients, of the model in ``dtype`` (``mode`` "cast": its
        weights cast; "autocast": fp32 weights under torch.autocast, as accelerate's mixed precision runs it)
        against fp32, at a tolerance well below the size of the architecture's own term (fp32 with vs without
        it): a collapsed term fails. (Not the loss: at random initialisation it is ~log(classes), second-order
        in the outputs.)"""
        assert dtype in self.half_precision_dtypes, f"{dtype} is not claimed: it must be refused, not tested"
        model = self.build()
        inputs = self.make_inputs(model.config)
        low = copy.deepcopy(model).to(dtype) if mode == "cast" else copy.deepcopy(model)
        models = {"fp32": model, "collapsed": self.without_distinctive_term(model), "low": low}
        low_inputs = self.cast_inputs(inputs, dtype) if mode == "cast" else inputs
        feeds = {"fp32": inputs, "collapsed": inputs, "low": low_inputs}
        for training in (False, True):
            outputs, grads = {}, {}
            for key, network in models.items():
                network.train(training)
                network.zero_grad()
                with torch.autocast("cpu", dtype=dtype, enabled=mode == "autocast" and key == "low"):
                    result = network(**feeds[key])
                outputs[key] = output_tensor(result).detach().float()
                if training:
                    result.loss.backward()
                    grads[key] = {name: p.grad.float() for name, p in network.named_parameters() if p.grad is not None}
            assert torch.isfinite(outputs["low"]).all()
            effect = (outputs["fp32"] - outputs["collapsed"]).abs().mean()
            assert effect > 0.05 * outputs["fp32"].abs().mean(), "the fixture's own term is too small to test against"
            assert (outputs["low"] - outputs["fp32"]).abs().mean() < 0.1 * effect, (training, effect)
        shared = [name for name in grads["fp32"].keys() & grads["collapsed"].keys()
                  if grads["fp32"][name].shape == grads["collapsed"][name].shape]

        def flat(key):
            return torch.cat([grads[key][name].flatten() for name in sorted(shared)])

        effect_on_grads = (flat("fp32") - flat("collapsed")).norm()
        assert (flat("low") - flat("fp32")).norm() < 0.25 * effect_on_grads, effect_on_grads

    # 9. energies and refinement steps --------------------------------------------------------------
    def recomputed_energy(self, model, inputs) -> tuple[int, str, tuple, torch.Tensor]:
        """``(layer index, key, index into the value, value)`` of one traced quantity, recomputed independently
        of the model's code."""
        raise NotImplementedError

    def test_output_energies_returns_the_models_energy_trace(self):
        model = self.build()
        inputs = self.without_labels(self.make_inputs(model.config))
        with torch.no_grad():
            plain = model(**inputs)
            traced = model(**inputs, output_energies=True)
        assert plain.energies is None
        trace = traced.energies
        assert isinstance(trace, EnergyTrace) and trace.architecture == self.model_type
        assert self.common_energy_keys and set(self.common_energy_keys) <= set(COMMON_ENERGY_KEYS)
        assert set(self.common_energy_keys) | self.energy_names <= set(trace.names()), trace.names()
        for layer in trace.layers:
            for name, value in layer.items():
                assert torch.isfinite(value).all(), name
        assert torch.equal(output_tensor(plain), output_tensor(traced))
        layer, key, item, expected = self.recomputed_energy(model, inputs)
        torch.testing.assert_close(trace.layers[layer][key][item].double(), expected.double(), rtol=1e-4, atol=1e-6)
        restored = pickle.loads(pickle.dumps(traced))  # an explicit output class, not one made at runtime
        assert type(restored) is type(traced) and torch.equal(output_tensor(restored), output_tensor(traced))
        self.assert_same_trace(restored.energies, trace)

    @pytest.mark.slow
    def test_energy_trace_is_the_same_under_activation_checkpointing_and_compile(self):
        """The trace of a training-mode forward: recomputation in backward records nothing more, and a
        fullgraph-compiled forward records what eager does."""
        model = self.build().train()
        inputs = self.make_inputs(model.config)
        reference = model(**inputs, output_energies=True).energies
        if self.supports_activation_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            outputs = model(**inputs, output_energies=True)
            outputs.loss.backward()
            self.assert_same_trace(outputs.energies, reference)
            model.activation_checkpointing_disable()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        self.assert_same_trace(compiled(**inputs, output_energies=True).energies, reference)

    @staticmethod
    def assert_same_trace(trace, reference):
        assert len(trace.layers) == len(reference.layers)
        for ours, theirs in zip(trace.layers, reference.layers):
            assert ours.keys() == theirs.keys()
            for name in ours:
                torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)

    def test_iterative_models_take_refinement_steps_at_run_time(self):
        """``refinement_steps``: K = the configured one changes nothing, another K changes the outputs and the
        traced iterations; `generate` passes it on. Models without iterations refuse it."""
        model = self.build()
        inputs = self.without_labels(self.make_inputs(model.config))
        if self.configured_steps is None:
            with pytest.raises(TypeError):
                model(**inputs, refinement_steps=2)
            return
        with torch.no_grad():
            default = model(**inputs, output_energies=True)
            same = model(**inputs, refinement_steps=self.configured_steps)
            fewer = model(**inputs, refinement_steps=1, output_energies=True)
        assert torch.equal(output_tensor(same), output_tensor(default))
        assert not torch.allclose(output_tensor(fewer), output_tensor(default))
        assert (fewer.energies.stack("iterations") == 1).all()
        assert (default.energies.stack("iterations") == self.configured_steps).all()
        if self.causal_lm:
            settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=model.config.pad_token_id)
            one = model.generate(**inputs, refinement_steps=1, **settings)
            with torch.no_grad():
                first = model(**inputs, refinement_steps=1).logits[:, -1].argmax(-1)
            assert torch.equal(one[:, inputs["input_ids"].shape[1]], first)

    # 10. invalid configs -----------------------------------------------------------------------------
    def test_invalid_config_values_raise_value_error_naming_the_field(self):
        for field, value in self.invalid_config_values:
            with pytest.raises(ValueError, match=field):
                self.make_config(**{field: value})

    # 11. the transformers model-class surface --------------------------------------------------------
    def test_return_dict_false_gives_the_dict_outputs_as_a_tuple(self):
        """Every registered class (base models too): the tuple holds the dict's non-None fields, in order."""
        for model_class in self.auto_classes.values():
            model = self.build(model_class)
            inputs = self.make_inputs(model.config)
            if model_class is not self.head_class:
                inputs = self.without_labels(inputs)
            with torch.no_grad():
                as_dict = model(**inputs)
                as_tuple = model(**inputs, return_dict=False)
            expected = as_dict.to_tuple()
            assert isinstance(as_tuple, tuple) and len(as_tuple) == len(expected), model_class.__name__
            for ours, theirs in zip(as_tuple, expected):
                assert type(ours) is type(theirs)
                if isinstance(ours, torch.Tensor):
                    assert torch.equal(ours, theirs)

    def compile_inputs(self, config) -> dict:
        """Inputs for the compile check: the hardest ones the model takes (token models add padding)."""
        return self.make_inputs(config)

    @pytest.mark.slow
    @pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
    def test_fullgraph_compile_matches_eager(self, training):
        """torch.compile(fullgraph=True) traces the whole forward (and backward) without a graph break and
        computes what eager does (aot_eager backend: the traced graph, run by eager kernels)."""
        torch._dynamo.reset()
        model = self.build().train(training)
        inputs = self.compile_inputs(model.config)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        if not training:
            with torch.no_grad():
                torch.testing.assert_close(output_tensor(compiled(**inputs)), output_tensor(model(**inputs)),
                                           rtol=1e-5, atol=1e-5)
            return
        eager_loss, eager_grads = loss_and_gradients(model, inputs)
        compiled_loss, compiled_grads = loss_and_gradients(model, inputs, forward=compiled)
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
        assert compiled_grads.keys() == eager_grads.keys()
        for name in eager_grads:
            torch.testing.assert_close(compiled_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)

    def test_attn_implementation_is_honoured_or_refused(self):
        """Each accepted attention implementation computes the same outputs; eager returns probabilities (rows
        summing to 1) with output_attentions=True; flash-attn (absent on CPU) and unknown names are refused."""
        model = self.build()
        inputs = self.without_labels(self.make_inputs(model.config))
        outputs = {}
        for implementation in self.attention_implementations:
            model.set_attn_implementation(implementation)
            assert model.config._attn_implementation == implementation
            with torch.no_grad():
                outputs[implementation] = output_tensor(model(**inputs))
        for output in outputs.values():
            torch.testing.assert_close(output, outputs[self.attention_implementations[0]], rtol=1e-5, atol=1e-5)
        if self.has_attentions:
            model.set_attn_implementation("eager")
            with torch.no_grad():
                attentions = model(**inputs, output_attentions=True).attentions
            assert attentions is not None and len(attentions) == model.config.num_hidden_layers
            for probabilities in attentions:
                torch.testing.assert_close(probabilities.sum(-1), torch.ones(probabilities.shape[:-1]))
                if self.causal_lm:
                    assert (probabilities.triu(diagonal=1) == 0).all()
        for refused in ("flash_attention_2", "no_such_attention"):
            with pytest.raises((ValueError, ImportError)):
                model.set_attn_implementation(refused)

    # 12. big models on small machines (docs/big-models.md) ------------------------------------------------
    int8_refused: dict[str, str] = {}  # quantization -> why this head's transformers baseline cannot take it either
    int8_error_ratio: float = 2.0  # the bound on int8's output error against the same-size baseline's
    dispatch_refused: str | None = None  # why accelerate's load_checkpoint_and_dispatch cannot load the baseline either

    @pytest.mark.parametrize("loading", LOADINGS)
    def test_offloaded_model_computes_and_trains_as_the_model_in_memory(self, tmp_path, loading):
        """Loaded with part of it in CPU memory and the rest offloaded to disk (``from_pretrained(device_map=
        "auto")``, or accelerate's ``init_empty_weights`` + ``load_checkpoint_and_dispatch``), the model gives the
        in-memory model's outputs, hidden states and energies, greedy tokens (language models) and a LoRA step's
        loss and adapter gradients (the adapters, which peft puts on the meta device beside an offloaded layer, moved
        to the CPU as docs/big-models.md shows)."""
        from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

        if loading == "dispatch" and self.dispatch_refused:
            pytest.skip(self.dispatch_refused)
        model = self.build()
        inputs = self.make_inputs(model.config)
        plain = self.without_labels(inputs)
        model.save_pretrained(tmp_path)
        offloaded = load_offloaded(self.head_auto_class, tmp_path, loading)
        assert offloaded_in_part(offloaded), getattr(offloaded, "hf_device_map", None)
        traced = dict(output_hidden_states=True, output_energies=True)
        with torch.no_grad():
            expected, got = model(**plain, **traced), offloaded(**plain, **traced)
        tolerance = dict(rtol=self.tolerance, atol=self.tolerance)
        torch.testing.assert_close(output_tensor(got), output_tensor(expected), **tolerance)
        for state, expected_state in zip(got.hidden_states, expected.hidden_states, strict=True):
            torch.testing.assert_close(state, expected_state, **tolerance)
        assert expected.energies.layers
        self.assert_same_trace(got.energies, expected.energies)
        if self.causal_lm:
            settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=model.config.pad_token_id)
            assert torch.equal(offloaded.generate(**plain, **settings), model.generate(**plain, **settings))
        adapters = LoraConfig(r=4, lora_alpha=8, target_modules=self.lora_target_modules)
        in_memory, tuned = get_peft_model(model, adapters), get_peft_model(offloaded, adapters)
        adapters_on_the_cpu(tuned)
        assert not set_peft_model_state_dict(tuned, get_peft_model_state_dict(in_memory)).unexpected_keys
        steps = []
        for lora in (in_memory, tuned):
            loss = lora(**inputs).loss
            loss.backward()
            steps.append((loss.detach(), {name: parameter.grad for name, parameter in lora.named_parameters()
                                          if parameter.requires_grad}))
        (expected_loss, expected_grads), (loss, grads) = steps
        torch.testing.assert_close(loss, expected_loss, **tolerance)
        assert grads.keys() == expected_grads.keys() and all(grad is not None for grad in grads.values())
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-5)

    @pytest.mark.parametrize("quantization", QUANTIZATIONS)
    def test_int8_model_errs_at_most_twice_its_transformers_baseline(self, tmp_path, quantization):
        """Quantized to int8 (torchao weight-only on loading; torch.ao's dynamic quantization after it), the model
        runs and generates (language models), and over three seeds its outputs move from the float32 model's by at
        most `int8_error_ratio` (2) times what the same quantization moves the vanilla transformers model of its size
        by (`same_size_baseline`)."""
        if quantization in self.int8_refused:
            pytest.skip(self.int8_refused[quantization])
        errors = {"model": [], "baseline": []}
        for seed in range(3):
            model = self.int8_model(seed)
            plain = self.without_labels(self.make_inputs(model.config, seed=seed))
            torch.manual_seed(seed)
            baseline = same_size_baseline(model.config, self.task).eval()
            for name, network in (("model", model), ("baseline", baseline)):
                network.save_pretrained(tmp_path / f"{name}-{seed}")
                int8 = quantized(type(network), tmp_path / f"{name}-{seed}", quantization)
                with torch.no_grad():
                    output = output_tensor(int8(**plain))
                    errors[name].append(relative_error(output, output_tensor(network(**plain))))
                assert torch.isfinite(output).all()
                if self.causal_lm and name == "model":
                    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=model.config.pad_token_id)
                    generated = int8.generate(**plain, **settings)
                    assert generated.shape[1] > plain["input_ids"].shape[1]
                    assert torch.equal(generated[:, :plain["input_ids"].shape[1]], plain["input_ids"])
        assert 0 < sum(errors["model"]) <= self.int8_error_ratio * sum(errors["baseline"]), errors

    def int8_model(self, seed: int):
        """The model the int8 comparison quantizes (default: the contract's perturbed model)."""
        return self.build(seed=seed)

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
    def test_half_precision_loading_runs_without_nan(self, tmp_path, dtype):
        """``from_pretrained(dtype=...)`` gives a model in that dtype (but the parameters its class keeps in float32)
        whose outputs are finite and (language models) whose greedy generation's every step's scores have no NaN."""
        model = self.build()
        model.save_pretrained(tmp_path)
        loaded = self.head_auto_class.from_pretrained(tmp_path, dtype=dtype).eval()
        kept = [*(loaded._keep_in_fp32_modules or ()), *(loaded._keep_in_fp32_modules_strict or ())]
        for name, parameter in loaded.named_parameters():  # float32 only where the class keeps it so
            assert parameter.dtype == (torch.float32 if any(key in name for key in kept) else dtype), name
        plain = self.cast_inputs(self.without_labels(self.make_inputs(model.config)), dtype)
        with torch.no_grad():
            assert torch.isfinite(output_tensor(loaded(**plain))).all()
        if self.causal_lm:
            generated = loaded.generate(**plain, max_new_tokens=6, do_sample=False, output_scores=True,
                                        return_dict_in_generate=True, pad_token_id=model.config.pad_token_id)
            assert len(generated.scores) == 6 and all(torch.isfinite(score).any(-1).all() and not score.isnan().any()
                                                      for score in generated.scores)


class TokenContract(ModelContract):
    """Token models: random token inputs, and padding (items 3 and 6) on both sides with ordinary tokens under
    the mask: the outputs and the gradients of a sequence are those it has alone."""

    def make_inputs(self, config, batch_size=2, seed=0):
        """Token ids (avoiding the special ids 0-2) as inputs and labels."""
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, config.vocab_size, (batch_size, 16), generator=generator)
        return {"input_ids": ids, "labels": self.labels_for(ids, config, generator)}

    def labels_for(self, ids, config, generator):
        """Labels of the kind the task's row says (`registry.Task.labels`): the ids themselves (next-token), one per
        sequence, or one per token."""
        row = TASKS[self.task]
        if row.labels == "next-token":
            return ids.clone()
        shape = ids.shape[:1] if row.labels == "sequence" else ids.shape
        return torch.randint(0, getattr(config, row.label_classes), shape, generator=generator)

    def real_outputs(self, outputs, row: int, real: slice) -> torch.Tensor:
        """The outputs of one sequence of a batch, restricted to its real tokens where outputs are per token."""
        return outputs.logits[row] if TASKS[self.task].labels == "sequence" else outputs.logits[row, real]

    def random_ids(self, config, length: int, seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(3, config.vocab_size, (1, length), generator=generator)

    def padded_batch(self, config, sequence: torch.Tensor, side: str, pad: int = 5):
        """``sequence`` as row 0 of a 2-row batch, padded on ``side`` by ``pad`` ordinary tokens under a zero
        mask, beside another full-length sequence; returns (ids, mask, real slice of row 0)."""
        length = sequence.shape[1]
        filler = self.random_ids(config, pad, seed=99)
        row = torch.cat([filler, sequence] if side == "left" else [sequence, filler], dim=1)
        ids = torch.cat([row, self.random_ids(config, length + pad, seed=98)])
        mask = torch.ones_like(ids)
        real = slice(pad, pad + length) if side == "left" else slice(0, length)
        mask[0] = 0
        mask[0, real] = 1
        return ids, mask, real

    def compile_inputs(self, config):
        sequence = self.random_ids(config, 11, seed=2)
        ids, mask, _ = self.padded_batch(config, sequence, "left")
        return {"input_ids": ids, "attention_mask": mask,
                "labels": self.labels_for(ids, config, torch.Generator().manual_seed(3))}

    @pytest.mark.parametrize("side", ["left", "right"])
    def test_padded_batch_gives_the_outputs_and_gradients_of_the_sequence_alone(self, side):
        """Items 3 and 6: outputs in eval and training mode, and the gradient of every parameter in training
        mode, of a sequence inside a padded batch equal those of the sequence alone."""
        model = self.build()
        sequence = self.random_ids(model.config, 11, seed=2)
        ids, mask, real = self.padded_batch(model.config, sequence, side)
        with torch.no_grad():
            alone = self.real_outputs(model(input_ids=sequence), 0, slice(None))
            batched = self.real_outputs(model(input_ids=ids, attention_mask=mask), 0, real)
        torch.testing.assert_close(batched, alone, rtol=self.tolerance, atol=self.tolerance)

        model.train()
        weights = torch.randn(alone.shape, generator=torch.Generator().manual_seed(4))

        def gradients(**inputs):
            model.zero_grad()
            outputs = self.real_outputs(model(**inputs), 0, real if "attention_mask" in inputs else slice(None))
            (outputs * weights).sum().backward()
            return outputs.detach(), {name: p.grad.clone() for name, p in model.named_parameters()
                                      if p.grad is not None}

        alone, alone_grads = gradients(input_ids=sequence)
        batched, batched_grads = gradients(input_ids=ids, attention_mask=mask)
        torch.testing.assert_close(batched, alone, rtol=self.tolerance, atol=self.tolerance)
        for name in alone_grads.keys() | batched_grads.keys():
            assert torch.isfinite(batched_grads[name]).all(), f"non-finite gradient in {name}"
            # fp32 rounding differs with chunk boundaries and batch size: 1e-4 of each tensor's own scale
            scale = alone_grads[name].abs().max().clamp_min(1e-12)
            torch.testing.assert_close(batched_grads[name], alone_grads[name], rtol=0, atol=1e-4 * scale, msg=name)


class CausalLMContract(TokenContract):
    """The contract of causal language models: `TokenContract` plus item 7 (causality in training mode, cached
    generation, prefill + chunks + steps, beam search), all on left-padded batches with ordinary tokens under
    the mask."""

    causal_lm = True

    def test_later_tokens_never_change_earlier_outputs_in_training_mode(self):
        model = self.build().train()
        ids = self.make_inputs(model.config, batch_size=2, seed=5)["input_ids"]
        changed = ids.clone()
        changed[:, 10:] = self.random_ids(model.config, ids.shape[1] - 10, seed=6)
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=changed).logits[:, :10], model(input_ids=ids).logits[:, :10],
                                       rtol=self.tolerance, atol=self.tolerance)

    def _left_padded_prompts(self, model):
        sequence = self.random_ids(model.config, 5, seed=3)
        ids, mask, _ = self.padded_batch(model.config, sequence, "left", pad=3)
        return {"input_ids": ids, "attention_mask": mask}

    def test_greedy_generate_with_cache_equals_without_on_left_padded_batch(self):
        model = self.build()
        prompts = self._left_padded_prompts(model)
        settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=model.config.pad_token_id)
        cached = model.generate(**prompts, use_cache=True, **settings)
        uncached = model.generate(**prompts, use_cache=False, **settings)
        assert cached.shape == (2, 20)
        assert torch.equal(cached, uncached)

    @pytest.mark.parametrize("padded", [False, True], ids=["one-sequence-no-mask", "left-padded"])
    def test_generate_decodes_each_step_from_one_new_token_and_the_cache_it_built(self, padded):
        """No silent fallback (a forward that ignored the cache generate() passes, as on a transformers release
        renaming it, would decode each step from one token without context): after the prompt every forward gets
        exactly one new token and a cache already holding every earlier token, and the tokens equal uncached
        decoding. Without an attention mask too, where nothing else would catch it."""
        model = self.build()
        if padded:
            prompts = self._left_padded_prompts(model)
        else:
            prompts = {"input_ids": self.random_ids(model.config, 6, seed=3)}
        prompt_length = prompts["input_ids"].shape[1]
        calls = []

        def record(module, args, kwargs):
            cache = next((kwargs[name] for name in ("cache", "past_key_values") if kwargs.get(name) is not None), None)
            calls.append((kwargs["input_ids"].shape[1], int(cache.get_seq_length()) if cache is not None else 0))

        settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=model.config.pad_token_id)
        handle = model.register_forward_pre_hook(record, with_kwargs=True)
        try:
            cached = model.generate(**prompts, use_cache=True, **settings)
        finally:
            handle.remove()
        assert calls == [(prompt_length, 0)] + [(1, prompt_length + step) for step in range(4)]
        assert torch.equal(cached, model.generate(**prompts, use_cache=False, **settings))

    def test_a_cache_under_a_name_the_model_does_not_read_is_refused(self):
        """A cache under 5.23's name reaches the model as 5.24's (with transformers' FutureWarning on 5.24, as its
        own models give); under any name the forward does not read it is refused, not dropped."""
        model = self.build()
        ids = self.random_ids(model.config, 6, seed=2)
        with torch.no_grad():
            expected = model(input_ids=ids, use_cache=False).logits[:, -1]
            for name in ("cache", "past_key_values"):
                cache = cache_of(model(input_ids=ids[:, :-1], use_cache=True))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    step = model(input_ids=ids[:, -1:], use_cache=True, **{name: cache})
                torch.testing.assert_close(step.logits[:, -1], expected, rtol=1e-4, atol=1e-4)
            for name in ("cache_params", "mems"):
                with pytest.raises(TypeError, match=f"got a cache as `{name}`, which it does not read"):
                    model(input_ids=ids[:, -1:], **{name: cache})

    def test_prefill_chunks_and_steps_match_one_forward_on_a_left_padded_batch(self):
        """Prefill, then a chunk of several tokens, then one-token steps, with a cache: the logits of one full
        forward (item 7)."""
        model = self.build()
        sequence = self.random_ids(model.config, 12, seed=4)
        ids, mask, real = self.padded_batch(model.config, sequence, "left", pad=3)
        with torch.no_grad():
            full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            pieces, cache = [], None
            for start, stop in [(0, 6), (6, 10), *((t, t + 1) for t in range(10, ids.shape[1]))]:
                step = model(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop], cache=cache,
                             use_cache=True)
                pieces.append(step.logits)
                cache = cache_of(step)
        stepped = torch.cat(pieces, dim=1)
        torch.testing.assert_close(stepped[0, real], full[0, real], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(stepped[1], full[1], rtol=1e-4, atol=1e-4)

    def test_beam_search_with_cache_equals_without(self):
        model = self.build()
        prompts = self._left_padded_prompts(model)
        settings = dict(max_new_tokens=6, num_beams=3, num_return_sequences=2, do_sample=False,
                        pad_token_id=model.config.pad_token_id)
        cached = model.generate(**prompts, use_cache=True, **settings)
        uncached = model.generate(**prompts, use_cache=False, **settings)
        assert cached.shape[0] == 4 and torch.equal(cached[:, :8], prompts["input_ids"].repeat_interleave(2, dim=0))
        assert torch.equal(cached, uncached)


class SequenceClassificationContract(TokenContract):
    """Sequence classifiers over token models: one label per sequence, pooled from its last real token."""

    num_labels = 3
