"""EER through the shared model contract (tests/support/contract.py): the paper's block and loss (every lambda at the
paper's value, so the contract's loss and gradient checks see the regularisers), at a width where two heads fit."""

import copy
import math

import torch
from contract import CausalLMContract

from energyzoo.modeling.configuration_eer import EERConfig


def tiny_eer_config(**overrides) -> EERConfig:
    fields = dict(vocab_size=16, hidden_size=16, num_attention_heads=2, intermediate_size=32, num_loops=3,
                  pad_token_id=0, bos_token_id=1)
    fields.update(overrides)
    return EERConfig(**fields)


def looped_once(model):
    """The same weights run for one loop instead of T: what a collapsed recurrence would compute."""
    twin = copy.deepcopy(model)
    twin.config.num_loops = 1
    return twin


def first_loop_entropy(model, input_ids: torch.Tensor, q: float) -> torch.Tensor:
    """Mean Tsallis entropy (eq. 5) of loop 1's attention rows, in float64 from the weights, with X = E[x] + 0.15
    PE(pos). Residual dynamics: Z_0 = 0, so the block reads U = X and the attention is softmax(causal(LN_1(X) W_Q
    (LN_1(X) W_K)^T / sqrt(d_h))); Hamiltonian (eq. 1): Z_0 = X attends to X without a norm."""
    config = model.config
    block = model.model.block
    length, width = input_ids.shape[1], config.hidden_size
    position = torch.arange(length, dtype=torch.float64)[:, None]
    frequency = 10000.0 ** (-torch.arange(0, width, 2, dtype=torch.float64) / width)
    angles = position * frequency
    encoding = torch.stack([torch.sin(angles), torch.cos(angles)], -1).reshape(length, width)
    inputs = model.model.embed_tokens.weight.double()[input_ids] + config.position_embedding_scale * encoding
    normed = inputs
    if config.loop_dynamics == "residual":
        norm = block.input_layernorm
        normed = torch.nn.functional.layer_norm(inputs, (width,), norm.weight.double(), norm.bias.double(),
                                                config.layer_norm_eps)
    heads, head_dim = config.num_attention_heads, config.head_dim

    def split(weight):
        return (normed @ weight.double().T).view(*input_ids.shape, heads, head_dim).transpose(1, 2)

    query, key = split(block.self_attn.q_proj.weight), split(block.self_attn.k_proj.weight)
    logits = query @ key.transpose(-1, -2) / math.sqrt(head_dim)
    logits = logits.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), -math.inf)
    probabilities = logits.softmax(-1)
    return ((1 - probabilities.pow(q).sum(-1)) / (q - 1)).mean()


class TestEERContract(CausalLMContract):
    model_type = "eer-looped"
    task = "causal-lm"
    common_energy_keys = ("energy", "temperature", "iterations", "residual")
    energy_names = {"kinetic", "potential", "entropy", "contraction_bound"}
    configured_steps = 3
    lora_target_modules = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]
    attention_implementations = ("eager", "sdpa")
    half_precision_dtypes = (torch.bfloat16, torch.float16)
    invalid_config_values = [
        ("tsallis_q", 1.0),
        ("tsallis_q", 2.5),
        ("num_loops", -1),
        ("num_loops_range", [5, 2]),
        ("num_attention_heads", 3),
        ("lambda_kinetic", -0.1),
        ("entropy_target", -1.0),
        ("loop_dynamics", "symplectic"),
        ("label_alignment", "left"),
        ("hamiltonian_momentum", 1.0),
        ("attention_temperature", 0.0),
        ("pad_token_id", 16),
        ("hidden_act", "swishy"),
        ("initializer_range", 0.0),
    ]

    def make_config(self, **overrides):
        return tiny_eer_config(**overrides)

    def without_distinctive_term(self, model):
        return looped_once(model)

    def recomputed_energy(self, model, inputs):
        return 0, "entropy", 0, first_loop_entropy(model, inputs["input_ids"], model.config.tsallis_q)


class TestEERHamiltonianContract(TestEERContract):
    """The same contract for the latent dynamics of eq. 1 (``loop_dynamics="hamiltonian"``): its own block, X's keys
    and values cached once (it has no MLP)."""

    lora_target_modules = ["q_proj", "k_proj", "v_proj"]

    def make_config(self, **overrides):
        return tiny_eer_config(**{"loop_dynamics": "hamiltonian", **overrides})
