"""FEM-LM through the shared model contract (tests/contract.py)."""

from transformers import AutoModel, AutoModelForCausalLM

from energyzoo import FEMConfig, FEMForCausalLM, FEMModel

from contract import CausalLMContract


class TestFEMContract(CausalLMContract):
    model_type = "fem"
    config_class = FEMConfig
    auto_classes = {AutoModel: FEMModel, AutoModelForCausalLM: FEMForCausalLM}
    head_class = FEMForCausalLM
    head_auto_class = AutoModelForCausalLM
    lora_target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    energy_names = {"inverse_temperature", "free_energy_gain", "temperature_gate"}
    invalid_config_values = [
        ("num_attention_heads", 5),  # does not divide the widths
        ("num_attention_heads", 0),
        ("value_ratio", 0.0),
        ("qk_ratio", -1.0),
        ("beta_max_init", 0.0),
        ("beta_max_init", float("inf")),
        ("prior", "cosine"),
        ("hidden_act", "not-an-activation"),
        ("time_decay_rank", 0),
    ]

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
        )
        fields.update(overrides)
        return FEMConfig(**fields)


class TestFEMGLAContract(TestFEMContract):
    """FEM-LM with the gated-linear-attention prior (FEM H.2): the same contract, recurrent cache."""

    invalid_config_values = TestFEMContract.invalid_config_values + [
        ("gla_decay", "token"),
        ("decay_normalizer", 0.0),
        ("prior_chunk_size", 0),
    ]

    def make_config(self, **overrides):
        return super().make_config(**{"prior": "gla", "prior_chunk_size": 4, **overrides})


class TestFEMAFTContract(TestFEMContract):
    """FEM-LM with the AFT prior (FEM H.3) and its input-conditioned decay: no queries, recurrent cache."""

    lora_target_modules = ["k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

    def make_config(self, **overrides):
        return super().make_config(**{"prior": "aft", "aft_decay": True, "prior_chunk_size": 4, **overrides})


class TestFEMSSMContract(TestFEMContract):
    """FEM-LM with the SSM prior (FEM H.4): Mamba-style nonnegative impulse response, recurrent cache."""

    lora_target_modules = ["dt_proj", "bc_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    invalid_config_values = TestFEMContract.invalid_config_values + [("ssm_state_size", 0)]

    def make_config(self, **overrides):
        return super().make_config(**{"prior": "ssm", "ssm_state_size": 4, "prior_chunk_size": 4, **overrides})
