"""The model contract on the toy architecture (tests/support/sixth_architecture)."""

from contract import CausalLMContract

from energyzoo.modeling.configuration_toy import ToyConfig


class TestToyContract(CausalLMContract):
    model_type = "toy"
    task = "causal-lm"
    lora_target_modules = ["q_proj", "v_proj"]
    energy_names: set[str] = set()
    common_energy_keys = ()
    invalid_config_values = [("num_attention_heads", 5)]

    def make_config(self, **overrides):
        return ToyConfig(**{"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                            **overrides})
