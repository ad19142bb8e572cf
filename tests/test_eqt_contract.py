"""EqT-LLaMA through the shared model contract (tests/support/contract.py), every energy on.

The tiny model is made to refine strongly, so that the contract's checks see the refinement act: a larger step
(alpha = 0.5) and energy weights (all 1) than the paper's, the memory frozen (EMA decay 1: the contract compares
consecutive training forwards, which the EMA of eq. 16 would move apart; `test_eqt.py` checks the EMA itself)."""

import copy

import torch
from contract import CausalLMContract

from energyzoo.modeling.configuration_eqt import EqTLlamaConfig


def tiny_eqt_config(**overrides) -> EqTLlamaConfig:
    fields = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=True, erm_rev_window=4, erm_rev_num_heads=2, erm_memory_size=16,
                  erm_memory_topk=4, erm_memory_ema_decay=1.0, erm_num_steps=4, erm_step_size=0.5,
                  lambda_rev=1.0, lambda_mask=1.0, lambda_conf=1.0, lambda_mem=1.0)
    fields.update(overrides)
    return EqTLlamaConfig(**fields)


def without_refinement(model):
    """The same weights with K = 0: the plain Llama a collapsed refinement would compute."""
    twin = copy.deepcopy(model)
    twin.config.erm_num_steps = twin.config.erm_num_steps_train = 0
    return twin


class TestEqTLlamaContract(CausalLMContract):
    model_type = "eqt-llama"
    task = "causal-lm"
    common_energy_keys = ("energy", "step_size", "iterations", "residual")
    energy_names = {"reverse_energy", "masked_energy", "confidence_energy", "memory_energy", "proximal_energy"}
    configured_steps = 4
    lora_target_modules = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    attention_implementations = ("eager", "sdpa")
    half_precision_dtypes = (torch.bfloat16, torch.float16)
    # Measured over the three seeds: 4.3x Llama's error (torchao), 1.9x (dynamic); with K = 0, 0.9x. The refinement
    # amplifies int8's error of the proposal: eq. 15's relevant prototypes are the proposal's top-k, a choice a
    # perturbed proposal changes (seed 0 alone: 10x). Past the 2x target: issue 64's note says so.
    int8_error_ratio = 6.0
    invalid_config_values = [
        ("erm_layers", [2]),
        ("erm_layers", [0, 0]),
        ("erm_num_steps", -1),
        ("erm_step_size", 0.0),
        ("erm_step_size", 2.5),  # alpha / gamma >= 2: the proximal step alone diverges
        ("erm_gamma", -1.0),
        ("lambda_rev", -0.1),
        ("erm_mask_ratio", 1.0),
        ("erm_memory_topk", 0),
        ("erm_memory_size", 2),
        ("erm_memory_ema_decay", 1.5),
        ("erm_tol", 0.0),
        ("erm_backprop", "neumann"),
        ("erm_head_vocabulary", "bag"),
        ("erm_confidence_topk", 1000),
        ("erm_rev_hidden_size", 7),  # not a multiple of erm_rev_num_heads = 2
        ("erm_rev_window", 0),
    ]

    def make_config(self, **overrides):
        return tiny_eqt_config(**overrides)

    def without_distinctive_term(self, model):
        return without_refinement(model)

    def recomputed_energy(self, model, inputs):
        """Step 0's ``confidence_energy``: the mean over positions of H[p] - log max p (eq. 14) with p =
        softmax(lm_head(norm(f))) in float64, f the last decoder layer's output (h_0 = f)."""
        proposals = []
        handle = model.model.layers[-1].register_forward_hook(lambda module, args, output: proposals.append(output))
        with torch.no_grad():
            model(**inputs)
        handle.remove()
        hidden = proposals[0].double()
        normalised = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + model.config.rms_norm_eps)
        logits = (model.model.norm.weight.double() * normalised) @ model.lm_head.weight.double().T
        log_probs = logits.log_softmax(-1)
        energy = -(log_probs.exp() * log_probs).sum(-1) - log_probs.max(-1).values
        return 0, "confidence_energy", 0, energy.mean()
