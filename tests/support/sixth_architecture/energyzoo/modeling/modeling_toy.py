"""The toy architecture (tests/support/sixth_architecture): Llama's base model and language-model head."""

from transformers import LlamaForCausalLM, LlamaModel

from .configuration_toy import ToyConfig


class ToyModel(LlamaModel):
    config_class = ToyConfig


class ToyForCausalLM(LlamaForCausalLM):
    config_class = ToyConfig
