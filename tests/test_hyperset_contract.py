"""Hyper-SET's three heads through the shared model contract (tests/support/contract.py).

Every model the contract builds is perturbed so the step-size network acts: its zero-initialised Linears get
small random weights (alpha, gamma ~ 0.1-0.3 per token and channel), otherwise the model is the identity encoder
and precision or energy checks would see nothing."""

import copy
import math

import torch
from contract import ModelContract

from energyzoo import HyperSETConfig
from energyzoo.modeling.hyperset_layer import HyperSETLayer, HyperSETStepSizes


def perturb_hyperset(model, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, HyperSETStepSizes):
                for linear in module.modules():
                    if isinstance(linear, torch.nn.Linear):
                        linear.weight.normal_(0.0, 0.1, generator=generator)
                        linear.bias.uniform_(0.1, 0.3, generator=generator)


def float64_energy(x: torch.Tensor, w: torch.Tensor, d: torch.Tensor, heads: int, eps: float) -> torch.Tensor:
    """E_ATTN + E_FF per sample (hyperset.txt eq. 3-5, unit-gain RMSNorm with epsilon ``eps``), in float64."""
    x, w, d = x.double(), w.double(), d.double()
    batch, tokens, width = x.shape
    p = width // heads
    z = (x @ w.T).reshape(batch, tokens, heads, p).transpose(1, 2)
    z = z / (z.square().mean(-1, keepdim=True) + eps).sqrt()  # ||z_i^h|| = sqrt(p)
    e_attn = math.sqrt(p) * torch.logsumexp(z @ z.transpose(-1, -2) / math.sqrt(p), dim=-1).sum(dim=(1, 2))
    h = x @ d.T
    h = h / (h.square().mean(-1, keepdim=True) + eps).sqrt()
    e_ff = -0.5 * torch.relu(h).square().sum(dim=(1, 2))
    return e_attn + e_ff


class HyperSETTester(ModelContract):
    model_type = "hyperset"
    common_energy_keys = ("energy", "step_size", "iterations", "residual")
    energy_names = {"attention_energy", "feedforward_energy", "feedforward_step_size", "effective_rank",
                    "average_angle"}
    configured_steps = 3
    lora_target_modules = ["qkv_proj", "ff_proj"]
    checkpointed_block = "HyperSETLayer"
    attention_implementations = ("eager",)  # bi-softmax attention is materialised: no fused kernel computes it
    has_attentions = False
    invalid_config_values = [
        ("num_attention_heads", 5),  # does not divide hidden_size
        ("hidden_act", "swish"),
        ("step_condition", "output"),
        ("step_size_mode", "adaptive"),
        ("time_embed_dim", 3),
        ("lora_rank", -1),
        ("num_iterations", 0),
        ("patch_size", 3),  # does not divide image_size
    ]
    base_fields: dict = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_iterations=3,
                             time_embed_dim=16)
    task_fields: dict = {}

    def make_config(self, **overrides):
        return HyperSETConfig(**{**self.base_fields, **self.task_fields, **overrides})

    def perturb(self, model):
        perturb_hyperset(model)

    def without_distinctive_term(self, model):
        """The same model with alpha = gamma = 0 (the step-size network's output map zeroed): the iterations,
        Hyper-SET's own term, collapsed to the identity."""
        twin = copy.deepcopy(model)
        with torch.no_grad():
            twin.model.step_sizes.out_proj.weight.zero_()
            twin.model.step_sizes.out_proj.bias.zero_()
        return twin

    def recomputed_energy(self, model, inputs):
        """Layer 0's ``energy`` after its first iteration, from the state that iteration produced, in float64."""
        layer = next(m for m in model.modules() if isinstance(m, HyperSETLayer))
        states = []
        # output: (state, diagnostics)
        handle = layer.register_forward_hook(lambda module, args, output: states.append(output[0]))
        with torch.no_grad():
            model(**self.without_labels(inputs))
        handle.remove()
        w, d = layer.qkv_proj.weight, layer.ff_proj.weight
        lora = model.model.depthwise_lora
        if lora is not None:  # iteration 0's update W + s A_0 B_0, D + s A'_0 B'_0 (App. G.2)
            w, d = w + lora.scale * lora.qkv_up[0] @ lora.qkv_down[0], d + lora.scale * lora.ff_up[0] @ lora.ff_down[0]
        eps = torch.finfo(torch.float32).eps  # the float32 model's RMSNorm epsilon (rms_norm_eps=None)
        return 0, "energy", 0, float64_energy(states[0], w, d, layer.heads, eps)


class TestHyperSETImageClassificationContract(HyperSETTester):
    task = "image-classification"
    task_fields = dict(image_size=8, patch_size=4, num_channels=3, num_labels=3, step_condition="current",
                       step_net_rmsnorm=True, qkv_norm="separate", hidden_act="gelu")

    def make_inputs(self, config, batch_size=2, seed=0):
        generator = torch.Generator().manual_seed(seed)
        return {"pixel_values": torch.randn(batch_size, 3, 8, 8, generator=generator),
                "labels": torch.randint(0, 3, (batch_size,), generator=generator)}


class TestHyperSETTokenClassificationContract(HyperSETTester):
    """Sudoku's head on 4x4 boards: digits 0..4 (0 blank), labels digit - 1 on blanks."""

    task = "token-classification"
    task_fields = dict(input_type="tokens", vocab_size=5, max_position_embeddings=16, use_cls_token=False,
                       position_embedding_type="learned", num_labels=4)

    def make_inputs(self, config, batch_size=2, seed=0):
        generator = torch.Generator().manual_seed(seed)
        solution = torch.randint(1, 5, (batch_size, 16), generator=generator)
        blank = torch.rand(batch_size, 16, generator=generator) < 0.5
        return {"input_ids": solution.masked_fill(blank, 0), "labels": (solution - 1).masked_fill(~blank, -100)}


class TestHyperSETMaskedImageModelingContract(HyperSETTester):
    """MaskGIT's head on a 4x4 grid of 8 visual tokens (mask token 8), 2-D sin-cos positions, lora."""

    task = "masked-image-modeling"
    task_fields = dict(input_type="tokens", vocab_size=9, codebook_size=8, mask_token_id=8, max_position_embeddings=16,
                       use_cls_token=False, position_embedding_type="sincos2d", time_embed_dim=0,
                       step_head_rmsnorm=True, lora_rank=2)

    def make_inputs(self, config, batch_size=2, seed=0):
        generator = torch.Generator().manual_seed(seed)
        # a grid whose code mostly follows the position (learnable in a few steps), with random cells
        codes = (torch.arange(16) % 8).repeat(batch_size, 1)
        noisy = torch.rand(batch_size, 16, generator=generator) < 0.25
        codes = torch.where(noisy, torch.randint(0, 8, (batch_size, 16), generator=generator), codes)
        masked = torch.rand(batch_size, 16, generator=generator) < 0.4
        masked[:, 0] = True
        return {"input_ids": codes.masked_fill(masked, 8), "labels": codes.masked_fill(~masked, -100)}
