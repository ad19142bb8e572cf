"""TEL-GPT2, TEL-ViT and TEL-ResNet through the shared model contract (tests/support/contract.py)."""

import copy
import math

import torch
from contract import CausalLMContract, ModelContract

from energyzoo import TELGPT2Config, TELResNetConfig, TELViTConfig, ThermodynamicRefinement

INVALID_TEL_VALUES = [
    ("tel_steps", 0),
    ("tel_activation", "swish"),
    ("tel_placement", [0, 0]),
    ("tel_placement", "tail"),
    ("tel_temperature", "layer"),
    ("tel_temperature_max", 5.0),  # T_max L_phi > 1 breaks eq. 13
    ("tel_initial_temperature", 0.01),  # below T_min
    ("tel_initial_step_size", 2.0),
    ("tel_estimator", "entropy"),
    ("tel_dual_step", -0.1),
    ("tel_exit_patience", 0),
]


def anchored_only(model):
    """The same model with every TEL layer's step sizes at their minimum eta_min = 1e-4: y^(K) = Wx up to
    ~5e-4 T phi, i.e. the TEL refinement (TEL's own term) collapsed to its anchor."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for module in twin.modules():
            if isinstance(module, ThermodynamicRefinement):
                module.tel_log_step_sizes.fill_(math.log(module.settings.tel_step_size_min))
    return twin


class TELTester:
    common_energy_keys = ("temperature", "step_size", "iterations", "residual")
    energy_names = {"enthalpy_entropy_ratio", "gradient_alignment"}
    configured_steps = 5  # tel_steps' default (tel.txt G.2)

    def perturb(self, model):
        """Temperature and step sizes at 95% of their design maxima (eq. 13, 32): a strong refinement, far
        from the anchor, so that precision checks have a term to lose."""
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, ThermodynamicRefinement):
                    settings = module.settings
                    module.tel_log_temperature.fill_(math.log(0.95 * settings.tel_resolved_temperature_max))
                    module.tel_log_step_sizes.fill_(math.log(0.95 * settings.tel_step_size_max))

    def without_distinctive_term(self, model):
        return anchored_only(model)

    def recomputed_energy(self, model, inputs):
        """The first TEL layer's step-0 ``residual`` ||g_G|| = T_0 ||phi(Wx)|| (Algorithm 1 line 8 at y = Wx),
        from the anchor it receives and the fixture's T_0 = 0.95 T_max; phi = silu."""
        layer = next(m for m in model.modules() if isinstance(m, ThermodynamicRefinement))
        anchors = []
        handle = layer.register_forward_pre_hook(lambda module, args: anchors.append(args[0]))
        with torch.no_grad():
            model(**inputs)
        handle.remove()
        temperature = 0.95 * layer.settings.tel_resolved_temperature_max
        norms = torch.linalg.vector_norm(temperature * torch.nn.functional.silu(anchors[0].double()),
                                         dim=layer.channel_dim)
        return 0, "residual", 0, norms.mean()


class TestTELGPT2Contract(TELTester, CausalLMContract):
    model_type = "tel-gpt2"
    task = "causal-lm"
    lora_target_modules = ["c_attn", "c_proj", "c_fc"]
    invalid_config_values = INVALID_TEL_VALUES + [("tel_placement", [2]), ("tel_entropy_pooling", "sequence")]
    int8_refused = {"torchao-int8-weight-only": "torchao's config quantizes nn.Linear layers and GPT-2's are Conv1D: "
                    "GPT-2 itself loads unchanged (output error 0), so there is no error to compare with"}

    def make_config(self, **overrides):
        fields = dict(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, tel_placement="full")
        fields.update(overrides)
        return TELGPT2Config(**fields)


class VisionContract(TELTester, ModelContract):
    def make_inputs(self, config, batch_size=2, seed=0):
        generator = torch.Generator().manual_seed(seed)
        pixels = torch.randn(batch_size, 3, 32, 32, generator=generator)
        return {"pixel_values": pixels, "labels": torch.randint(0, 3, (batch_size,), generator=generator)}


class TestTELViTContract(VisionContract):
    model_type = "tel-vit"
    task = "image-classification"
    dispatch_refused = ("transformers' ViT renames its checkpoint's names onto its modules when it loads (5.24: "
                        "vit.encoder.layer.N -> vit.layers.N), which accelerate's load_checkpoint_and_dispatch does "
                        "not: ViT itself fails there (KeyError: 'vit.layers.0.layernorm_before.weight')")
    checkpointed_block = "ViTLayer"
    lora_target_modules = ["q_proj", "v_proj", "fc1", "fc2"]
    invalid_config_values = INVALID_TEL_VALUES + [("tel_placement", [2])]
    trainer_overrides = {"tel_placement": "full", "tel_entropy_pooling": "token"}  # "batch" pools over micro-batches

    def make_config(self, **overrides):
        fields = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
                      patch_size=8, num_labels=3, tel_placement="head")
        fields.update(overrides)
        return TELViTConfig(**fields)


class TestTELResNetContract(VisionContract):
    model_type = "tel-resnet"
    task = "image-classification"
    supports_activation_checkpointing = False  # transformers' ResNet has no checkpointable blocks
    attention_implementations = ("eager",)  # no attention: transformers refuses sdpa and flash for ResNet
    has_attentions = False
    lora_target_modules = ["convolution"]
    takes_any_image_size = True  # its pooler takes any size
    int8_refused = {"torchao-int8-weight-only": "transformers' ResNet itself fails to load with TorchAoConfig (5.24: "
                    "the quantizer asks ResNetModel for get_input_embeddings, which it does not implement)"}
    accumulation_left_out = "ResNet's BatchNorm pools statistics over the batch, so each micro-batch has its own"
    invalid_config_values = INVALID_TEL_VALUES + [("tel_placement", [4])]

    def make_config(self, **overrides):
        fields = dict(embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2], layer_type="basic", num_labels=3,
                      tel_placement="full")
        fields.update(overrides)
        return TELResNetConfig(**fields)
