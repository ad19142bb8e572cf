"""Configuration of the toy architecture (tests/support/sixth_architecture): Llama's, under its own model type,
declared and checked as every zoo config is (docs/contributing.md, "A new architecture")."""

from transformers import LlamaConfig

from .checks import check_derived_fields, check_transformers_fields, require, strict_config

OWNER = "ToyConfig"


@strict_config
class ToyConfig(LlamaConfig):
    """Llama's fields; the toy's own check: an even head width (RoPE rotates pairs of channels)."""

    model_type = "toy"

    def __post_init__(self, **kwargs):
        check_transformers_fields(self)
        super().__post_init__(**kwargs)
        check_derived_fields(self)
        head_dim = self.hidden_size // self.num_attention_heads
        require(OWNER, head_dim % 2 == 0, "num_attention_heads", "a count that leaves an even head width", head_dim)
