"""The big-model front doors of transformers and accelerate, as a user on a small machine opens them
(docs/big-models.md): a saved folder loaded with ``device_map="auto"``, a ``max_memory`` below the model's size and an
``offload_folder``; the same through accelerate's ``init_empty_weights`` + ``load_checkpoint_and_dispatch``; int8 with
torchao's weight-only config or torch.ao's dynamic quantization. And the vanilla transformers model of a zoo config's
size, whose int8 error the zoo model's is held to."""

from pathlib import Path

import torch
from accelerate import infer_auto_device_map, init_empty_weights, load_checkpoint_and_dispatch
from torch import nn
from transformers import (
    AutoConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaForTokenClassification,
    ResNetConfig,
    ResNetForImageClassification,
    TorchAoConfig,
    ViTConfig,
    ViTForImageClassification,
)

LOADINGS = ("device_map", "dispatch")
QUANTIZATIONS = ("torchao-int8-weight-only", "dynamic-int8")
# the CPU budgets tried, as shares of the model's size: accelerate keeps room for the largest block beside a budget, so
# how much of a tiny model a share keeps in memory varies by model
MEMORY_SHARES = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def model_bytes(model: nn.Module) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())


def load_offloaded(auto_class, folder: Path, loading: str) -> nn.Module:
    """The model of ``folder`` with a CPU budget that keeps some of its blocks in memory and offloads the others to
    disk (`split_budget`): through ``from_pretrained(device_map="auto")`` ("device_map") or accelerate's
    empty-weights dispatch ("dispatch")."""
    with init_empty_weights():
        empty = auto_class.from_config(AutoConfig.from_pretrained(folder))
    empty.tie_weights()
    budget = split_budget(empty)
    offload = folder / f"offload-{loading}"
    if loading == "device_map":
        model = auto_class.from_pretrained(folder, device_map="auto", max_memory=budget, offload_folder=offload)
    else:
        # the model's blocks and the inputs it keeps where they are, as transformers' own dispatch passes them;
        # offloaded buffers: otherwise (accelerate 1.15) a block on disk keeps its buffers' initial values, not the
        # checkpoint's (EqT-LLaMA's memory banks)
        model = load_checkpoint_and_dispatch(empty, str(folder), device_map="auto", max_memory=budget,
                                             offload_folder=offload, no_split_module_classes=empty._no_split_modules,
                                             skip_keys=empty._skip_keys_device_placement, offload_buffers=True)
    return model.eval()


def split_budget(model: nn.Module) -> dict[str, int]:
    """The smallest CPU budget of `MEMORY_SHARES` under which accelerate's automatic device map puts blocks of the
    model both in memory and on disk. (A map of disk alone fails in accelerate 1.15's load_checkpoint_and_dispatch,
    which asks safetensors for tensors on the device "disk".)"""
    size = model_bytes(model)
    for share in MEMORY_SHARES:
        budget = {"cpu": int(share * size)}
        devices = infer_auto_device_map(model, max_memory=budget, no_split_module_classes=model._no_split_modules)
        if set(devices.values()) == {"cpu", "disk"}:
            return budget
    raise AssertionError(f"no budget of {MEMORY_SHARES} splits {type(model).__name__} between memory and disk")


def adapters_on_the_cpu(model: nn.Module) -> None:
    """peft's adapters of a dispatched model where peft left them without data: peft creates each adapter on its
    base layer's device, the meta device where accelerate offloads the layer, and no hook loads it there. On the
    CPU, empty: load their weights next (``set_peft_model_state_dict``, or a fresh initialisation)."""
    for name, module in model.named_modules():
        if "lora_" in name and any(parameter.is_meta for parameter in module.parameters(recurse=False)):
            module.to_empty(device="cpu")


def offloaded_in_part(model: nn.Module) -> bool:
    """Whether the model's dispatch keeps some blocks in CPU memory and offloads others to disk."""
    return set(getattr(model, "hf_device_map", {"": "cpu"}).values()) == {"cpu", "disk"}


def quantized(auto_class, folder: Path, quantization: str) -> nn.Module:
    if quantization == "torchao-int8-weight-only":
        from torchao.quantization import Int8WeightOnlyConfig

        config = TorchAoConfig(Int8WeightOnlyConfig())
        return auto_class.from_pretrained(folder, quantization_config=config).eval()
    model = auto_class.from_pretrained(folder).eval()
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def same_size_baseline(config, task: str) -> nn.Module:
    """The vanilla transformers model of ``config``'s width, depth (the layer passes an input makes: a looped or
    iterated layer counts once per pass) and vocabulary or image: TEL's own backbone (GPT-2, ViT, ResNet), ViT for
    Hyper-SET's images, Llama for the other token models."""
    model_type = config.model_type
    if model_type == "tel-gpt2":
        return GPT2LMHeadModel(GPT2Config(**config.to_dict()))
    if model_type == "tel-vit":
        return ViTForImageClassification(ViTConfig(**config.to_dict()))
    if model_type == "tel-resnet":
        return ResNetForImageClassification(ResNetConfig(**config.to_dict()))
    width = config.hidden_size
    depth = getattr(config, "num_layer_iterations", None) or config.num_hidden_layers  # EER's: its loops
    common = dict(hidden_size=width, num_attention_heads=config.num_attention_heads, num_hidden_layers=depth,
                  intermediate_size=config.intermediate_size, num_labels=getattr(config, "num_labels", 2))
    if task == "image-classification":
        return ViTForImageClassification(ViTConfig(image_size=config.image_size, patch_size=config.patch_size,
                                                   num_channels=config.num_channels, **common))
    llama = LlamaConfig(vocab_size=config.vocab_size, pad_token_id=getattr(config, "pad_token_id", None),
                        head_dim=width // config.num_attention_heads, **common)
    if task == "causal-lm":
        return LlamaForCausalLM(llama)
    if task == "sequence-classification":
        return LlamaForSequenceClassification(llama)
    # Hyper-SET's token heads: a label (or a visual-token code) per position
    return LlamaForTokenClassification(llama)


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    return ((output.float() - reference.float()).norm() / reference.float().norm()).item()
