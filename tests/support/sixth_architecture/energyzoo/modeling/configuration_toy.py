"""Configuration of the toy architecture (tests/support/sixth_architecture): Llama's, under its own model type."""

from transformers import LlamaConfig


class ToyConfig(LlamaConfig):
    model_type = "toy"
