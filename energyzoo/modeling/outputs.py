"""Output records shared by every energyzoo architecture.

`EnergyTrace` is the one diagnostics record of the zoo: each model fills it with its own thermodynamic
quantities when called with `output_energies=True`. Quantities are stored per layer (or per refinement
step) under documented names, so that callbacks and plots work across architectures:

- ``temperature`` / ``inverse_temperature``: T or beta (FEM: beta_max per channel, FEM eq. 9);
- ``energy``: the energy or free-energy term the layer optimises (FEM: the free-energy gain
  f_max - mu = KL(p || q) / beta, FEM eq. 6);
- ``step_size``: gradient step sizes of iterative layers;
- ``iterations``: refinement steps actually used.
Architectures add their own keys (FEM adds ``temperature_gate``, the lambda of eq. 10).
"""

from dataclasses import dataclass, field

import torch
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    BaseModelOutputWithPastAndCrossAttentions,
    BaseModelOutputWithPooling,
    BaseModelOutputWithPoolingAndNoAttention,
    CausalLMOutputWithCrossAttentions,
    CausalLMOutputWithPast,
    ImageClassifierOutput,
    ImageClassifierOutputWithNoAttention,
    SequenceClassifierOutputWithPast,
)


@dataclass
class EnergyTrace:
    """Per-layer thermodynamic diagnostics of one forward pass.

    Attributes:
        architecture: the `model_type` that produced the trace.
        layers: one dict per layer (or step), mapping a quantity name to a detached tensor.
    """

    architecture: str
    layers: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def names(self) -> list[str]:
        """Quantity names present in every layer."""
        if not self.layers:
            return []
        common = set(self.layers[0])
        for layer in self.layers[1:]:
            common &= set(layer)
        return sorted(common)

    def stack(self, name: str) -> torch.Tensor:
        """One quantity across layers, stacked on a new leading dimension."""
        if name not in self.names():
            raise KeyError(f"EnergyTrace has no quantity {name!r}; available: {self.names()}")
        return torch.stack([layer[name] for layer in self.layers])

    def summary(self) -> dict[str, float]:
        """Mean of every quantity per layer, as plain floats (for logging): ``{"energy/layer_0": ...}``."""
        return {
            f"{name}/layer_{index}": float(value.float().mean())
            for index, layer in enumerate(self.layers)
            for name, value in layer.items()
        }


@dataclass
class BaseModelOutputWithEnergies(BaseModelOutputWithPast):
    """`BaseModelOutputWithPast` plus the model's `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class CausalLMOutputWithEnergies(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the model's `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class SequenceClassifierOutputWithEnergies(SequenceClassifierOutputWithPast):
    """`SequenceClassifierOutputWithPast` plus the model's `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class BaseModelOutputWithPastAndCrossAttentionsAndEnergies(BaseModelOutputWithPastAndCrossAttentions):
    """GPT-2's base output plus the `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class CausalLMOutputWithCrossAttentionsAndEnergies(CausalLMOutputWithCrossAttentions):
    """GPT-2's LM output plus the `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class BaseModelOutputWithPoolingAndEnergies(BaseModelOutputWithPooling):
    """ViT's base output plus the `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class ImageClassifierOutputAndEnergies(ImageClassifierOutput):
    """ViT's classifier output plus the `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class BaseModelOutputWithPoolingAndNoAttentionAndEnergies(BaseModelOutputWithPoolingAndNoAttention):
    """ResNet's base output plus the `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class ImageClassifierOutputWithNoAttentionAndEnergies(ImageClassifierOutputWithNoAttention):
    """ResNet's classifier output plus the `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


# The output class of a vanilla transformers model -> the same class with an `energies` field. Declared, not
# made at run time: picklable, and traceable by torch.compile.
WITH_ENERGIES = {
    base: extended
    for extended in (
        BaseModelOutputWithPastAndCrossAttentionsAndEnergies,
        CausalLMOutputWithCrossAttentionsAndEnergies,
        BaseModelOutputWithPoolingAndEnergies,
        ImageClassifierOutputAndEnergies,
        BaseModelOutputWithPoolingAndNoAttentionAndEnergies,
        ImageClassifierOutputWithNoAttentionAndEnergies,
    )
    for base in extended.__bases__
}


def attach_energies(outputs, energies: EnergyTrace | None):
    """Return `outputs` with its `EnergyTrace` attached (appended when `return_dict=False` gave a tuple)."""
    if isinstance(outputs, tuple):
        return outputs if energies is None else (*outputs, energies)
    return WITH_ENERGIES[type(outputs)](**outputs, energies=energies)
