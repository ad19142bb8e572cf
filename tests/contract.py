"""The model contract every energyzoo architecture passes (DESIGN.md, "The model contract", items 1-10).

A new architecture adds a small tester: subclass `ModelContract` (or `CausalLMContract` for causal LMs,
which adds items 6-7 and random token inputs) in a `test_*.py` file, set the class attributes and implement
`make_config` (and `make_inputs` for non-LMs). Kernel-level float64 checks (item 8, second half)
live in each architecture's own test file.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, Trainer, TrainingArguments

from energyzoo.hub_cards import export_model
from energyzoo.modeling.outputs import EnergyTrace

REMOTE_LOAD_SCRIPT = Path(__file__).with_name("remote_load_check.py")


def output_tensor(outputs) -> torch.Tensor:
    return outputs.logits if getattr(outputs, "logits", None) is not None else outputs.last_hidden_state


class ModelContract:
    model_type: str
    config_class: type
    auto_classes: dict  # {AutoModel: ModelClass, AutoModelForX: XClass}
    head_class: type  # the class that takes `labels`
    head_auto_class: type
    causal_lm: bool = False
    lora_target_modules: list[str]
    energy_names: set[str]
    invalid_config_values: list[tuple[str, object]]
    tolerance: float = 1e-5
    supports_activation_checkpointing: bool = True
    checkpointed_block: str | None = None  # class name of the checkpointed block; None: first `_no_split_modules`

    def make_config(self, **overrides):
        raise NotImplementedError

    def make_inputs(self, config, batch_size: int = 2, seed: int = 0) -> dict:
        """Model inputs with `labels`."""
        raise NotImplementedError

    # helpers ---------------------------------------------------------------------------------------
    def build(self, model_class=None, seed: int = 0, **overrides):
        torch.manual_seed(seed)
        return (model_class or self.head_class)(self.make_config(**overrides)).eval()

    @staticmethod
    def without_labels(inputs: dict) -> dict:
        return {k: v for k, v in inputs.items() if k != "labels"}

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
        reloaded = self.head_auto_class.from_pretrained(tmp_path).eval()
        assert type(reloaded) is self.head_class
        with torch.no_grad():
            assert torch.equal(output_tensor(model(**inputs)), output_tensor(reloaded(**inputs)))

    # 2. remote code in a fresh process ---------------------------------------------------------------
    def test_exported_folder_loads_as_remote_code_without_energyzoo(self, tmp_path):
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
            [sys.executable, str(REMOTE_LOAD_SCRIPT), str(folder), str(tmp_path / "payload.pt")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin"},
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "REMOTE_OK transformers_modules" in result.stdout

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

        def loss_and_grads():
            model.zero_grad()
            loss = model(**inputs).loss
            loss.backward()
            return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

        plain_loss, plain_grads = loss_and_grads()
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        calls = []
        block_names = [self.checkpointed_block] if self.checkpointed_block else model._no_split_modules
        block = next(m for m in model.modules() if m.__class__.__name__ in block_names)
        # Checkpointing wraps the block's forward, so a child of the block runs again during backward.
        handle = next(block.children()).register_forward_hook(lambda *args: calls.append(1))
        checkpointed_loss, checkpointed_grads = loss_and_grads()
        handle.remove()
        assert len(calls) == 2, "the block's forward should run again in backward when checkpointed"
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

        reloaded = PeftModel.from_pretrained(self.head_auto_class.from_pretrained(tmp_path / "base"), tmp_path / "adapter")
        reloaded.eval()
        with torch.no_grad():
            torch.testing.assert_close(output_tensor(reloaded(**plain)), tuned_output)
            merged = reloaded.merge_and_unload()
            assert type(merged) is self.head_class
            torch.testing.assert_close(output_tensor(merged(**plain)), tuned_output, rtol=1e-4, atol=1e-4)

    # 8. bf16 -----------------------------------------------------------------------------------------
    def test_bf16_forward_and_loss_are_finite(self):
        model = self.build().to(torch.bfloat16)
        inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in self.make_inputs(model.config).items()}
        with torch.no_grad():
            outputs = model(**inputs)
        assert output_tensor(outputs).dtype == torch.bfloat16
        assert torch.isfinite(output_tensor(outputs)).all() and torch.isfinite(outputs.loss)

    # 9. energies -------------------------------------------------------------------------------------
    def test_output_energies_returns_the_models_energy_trace(self):
        model = self.build()
        inputs = self.without_labels(self.make_inputs(model.config))
        with torch.no_grad():
            plain = model(**inputs)
            traced = model(**inputs, output_energies=True)
        assert plain.energies is None
        trace = traced.energies
        assert isinstance(trace, EnergyTrace) and trace.architecture == self.model_type
        assert self.energy_names <= set(trace.names()), trace.names()
        for layer in trace.layers:
            for name, value in layer.items():
                assert torch.isfinite(value).all(), name
        assert torch.equal(output_tensor(plain), output_tensor(traced))

    # 10. invalid configs -----------------------------------------------------------------------------
    def test_invalid_config_values_raise_value_error_naming_the_field(self):
        for field, value in self.invalid_config_values:
            with pytest.raises(ValueError, match=field):
                self.make_config(**{field: value})


class CausalLMContract(ModelContract):
    """The contract of causal language models: `ModelContract` plus items 6 (left padding) and 7 (cached
    generation, prefill + steps, beam search). Inputs are random token ids."""

    causal_lm = True

    def make_inputs(self, config, batch_size=2, seed=0):
        """Token ids (avoiding the special ids 0-2) as inputs and labels."""
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, config.vocab_size, (batch_size, 16), generator=generator)
        return {"input_ids": ids, "labels": ids.clone()}

    # 6. padding --------------------------------------------------------------------------------------
    def test_left_padding_keeps_real_token_outputs(self):
        model = self.build()
        pad = model.config.pad_token_id
        long_ids = self.make_inputs(model.config, batch_size=1, seed=1)["input_ids"]
        short_ids = self.make_inputs(model.config, batch_size=1, seed=2)["input_ids"][:, : long_ids.shape[1] - 5]
        padded = torch.cat([torch.full((1, 5), pad), short_ids], dim=1)
        batch_ids = torch.cat([padded, long_ids])
        mask = torch.ones_like(batch_ids)
        mask[0, :5] = 0
        with torch.no_grad():
            alone = output_tensor(model(input_ids=short_ids))
            batched = output_tensor(model(input_ids=batch_ids, attention_mask=mask))
            long_alone = output_tensor(model(input_ids=long_ids))
        torch.testing.assert_close(batched[0, 5:], alone[0], rtol=self.tolerance, atol=self.tolerance)
        torch.testing.assert_close(batched[1], long_alone[0], rtol=self.tolerance, atol=self.tolerance)

    # 7. generation -----------------------------------------------------------------------------------
    def _left_padded_prompts(self, model):
        ids = self.make_inputs(model.config, batch_size=2, seed=3)["input_ids"][:, :8]
        mask = torch.ones_like(ids)
        ids[0, :3] = model.config.pad_token_id
        mask[0, :3] = 0
        return {"input_ids": ids, "attention_mask": mask}

    def test_greedy_generate_with_cache_equals_without_on_left_padded_batch(self):
        model = self.build()
        prompts = self._left_padded_prompts(model)
        settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=model.config.pad_token_id)
        cached = model.generate(**prompts, use_cache=True, **settings)
        uncached = model.generate(**prompts, use_cache=False, **settings)
        assert cached.shape == (2, 20)
        assert torch.equal(cached, uncached)

    def test_prefill_then_single_token_steps_match_full_forward(self):
        model = self.build()
        ids = self.make_inputs(model.config, batch_size=2, seed=4)["input_ids"][:, :12]
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits
            step = model(input_ids=ids[:, :5], use_cache=True)
            pieces, cache = [step.logits], step.past_key_values
            for t in range(5, ids.shape[1]):
                step = model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                pieces.append(step.logits)
                cache = step.past_key_values
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-4)

    def test_beam_search_with_cache_equals_without(self):
        model = self.build()
        prompts = self._left_padded_prompts(model)
        settings = dict(max_new_tokens=6, num_beams=3, num_return_sequences=2, do_sample=False,
                        pad_token_id=model.config.pad_token_id)
        cached = model.generate(**prompts, use_cache=True, **settings)
        uncached = model.generate(**prompts, use_cache=False, **settings)
        assert cached.shape[0] == 4 and torch.equal(cached[:, :8], prompts["input_ids"].repeat_interleave(2, dim=0))
        assert torch.equal(cached, uncached)
