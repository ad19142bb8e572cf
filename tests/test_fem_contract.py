"""FEM-LM (every prior) and FEMForSequenceClassification through the shared model contract (tests/support/contract.py).

Every model the contract builds is perturbed so FEM's own parts act: the time-decay conditioner's
zero-initialised output map gets random weights (modulators != 1) and the values are scaled so that
beta_max |v| reaches the exp cap of 40 (some below it, some clipped)."""

import torch
from contract import CausalLMContract, SequenceClassificationContract
from fem_reference import fem_layer_reference

from energyzoo import FEMConfig
from energyzoo.modeling.modeling_fem import FEMAttention

VALUE_SCALE = 60.0  # beta_max |v| of the tiny models then peaks at ~35-50 (test_fem.py checks the fixture)


def perturb_fem(model, seed: int = 0, value_scale: float = VALUE_SCALE) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, FEMAttention):
                if module.time_decay is not None:
                    module.time_decay.out_proj.normal_(0.0, 0.5, generator=generator)
                module.v_proj.weight.mul_(value_scale)


def without_lse_branch(model):
    """The same FEM model with ``use_lse=False`` (o = g * mu): every shared weight copied, the temperature
    projection, beta_max and the conditioner's temperature-gate block dropped. A read whose f_max collapsed
    to mu computes exactly this."""
    config = FEMConfig.from_dict({**model.config.to_dict(), "use_lse": False})
    twin = type(model)(config).to(next(model.parameters()).dtype)
    state = {}
    for key, value in model.state_dict().items():
        if "temperature_proj" in key or "beta_max_raw" in key:
            continue
        if key.endswith("time_decay.out_proj"):
            layer = model.get_submodule(key.removesuffix(".time_decay.out_proj"))
            blocks = value.split([getattr(layer, name).out_features for name in layer.projection_names], dim=-1)
            value = torch.cat([b for name, b in zip(layer.projection_names, blocks) if name != "temperature_proj"], -1)
        state[key] = value
    twin.load_state_dict(state)
    return twin.train(model.training)


class FEMTester:
    model_type = "fem"
    common_energy_keys = ("energy", "temperature")
    energy_names = {"inverse_temperature", "temperature_gate"}
    lora_target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    invalid_config_values = [
        ("num_attention_heads", 5),  # does not divide the widths
        ("num_attention_heads", 0),
        ("value_ratio", 0.0),
        ("qk_ratio", -1.0),
        ("beta_max_init", 0.0),
        ("public_reference_eps", -1e-6),
        ("beta_max_init", float("inf")),
        ("prior", "cosine"),
        ("hidden_act", "not-an-activation"),
        ("time_decay_rank", 0),
    ]
    prior_fields: dict = {}

    def make_config(self, **overrides):
        fields = dict(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
            time_decay_rank=4,
            time_decay_chunk_size=4,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            **self.prior_fields,
        )
        fields.update(overrides)
        return FEMConfig(**fields)

    def perturb(self, model):
        perturb_fem(model)

    def int8_model(self, seed: int):
        """The conditioner perturbed so that it acts, the values at their initial scale: `VALUE_SCALE`, which drives
        beta_max |v| to the exp cap for the precision checks, multiplies any error of v by up to 40 in the exp branch
        (FEM eq. 11): a stress test of the clipping, not of int8 (measured: 3x Llama's error with it, 0.8x without)."""
        torch.manual_seed(seed)
        model = self.head_class(self.make_config())
        perturb_fem(model, seed, value_scale=1.0)
        return model.eval()

    def without_distinctive_term(self, model):
        return without_lse_branch(model)

    def recomputed_energy(self, model, inputs):
        """Layer 0's ``energy`` (F(beta_max) - mu per token, FEM eq. 6) from the float64 layer reference."""
        base = model.model
        layer = base.layers[0]
        with torch.no_grad():
            hidden = layer.input_layernorm(base.embed_tokens(inputs["input_ids"]))
            _, mu, f = fem_layer_reference(layer.self_attn, hidden)
        return 0, "energy", (), (f - mu).mean(dim=(-2, -1))


class TestFEMContract(FEMTester, CausalLMContract):
    task = "causal-lm"


class RecurrentPriorTester:
    """Recurrent priors run their own chunkwise read: only the default attention implementation applies, and
    there are no softmax probabilities to return."""

    attention_implementations = ("sdpa",)
    has_attentions = False


class TestFEMGLAContract(RecurrentPriorTester, TestFEMContract):
    """FEM-LM with the gated-linear-attention prior (FEM H.2): the same contract, recurrent cache."""

    prior_fields = {"prior": "gla", "prior_chunk_size": 4}
    invalid_config_values = TestFEMContract.invalid_config_values + [
        ("gla_decay", "token"),
        ("decay_normalizer", 0.0),
        ("prior_chunk_size", 0),
    ]


class TestFEMAFTContract(RecurrentPriorTester, TestFEMContract):
    """FEM-LM with the AFT prior (FEM H.3) and its input-conditioned decay: no queries, recurrent cache."""

    prior_fields = {"prior": "aft", "aft_decay": True, "prior_chunk_size": 4}
    lora_target_modules = ["k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TestFEMSSMContract(RecurrentPriorTester, TestFEMContract):
    """FEM-LM with the SSM prior (FEM H.4): Mamba-style nonnegative impulse response, recurrent cache."""

    prior_fields = {"prior": "ssm", "ssm_state_size": 4, "prior_chunk_size": 4}
    lora_target_modules = ["dt_proj", "bc_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    invalid_config_values = TestFEMContract.invalid_config_values + [("ssm_state_size", 0)]


class TestFEMSequenceClassificationContract(FEMTester, SequenceClassificationContract):
    """FEMForSequenceClassification (softmax prior): pooled from the last real token, also when the padding
    holds ordinary tokens."""

    task = "sequence-classification"
    lora_target_modules = ["q_proj", "v_proj", "o_proj", "down_proj"]

    def make_config(self, **overrides):
        return super().make_config(**{"num_labels": self.num_labels, **overrides})


class TestFEMGLASequenceClassificationContract(RecurrentPriorTester, TestFEMSequenceClassificationContract):
    """The classifier over the GLA prior, the Mamba-like LM users ask a classification head of most."""

    prior_fields = {"prior": "gla", "prior_chunk_size": 4}
