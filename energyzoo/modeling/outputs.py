"""Output records shared by every energyzoo architecture, and the one energy mechanism of the zoo.

`EnergyTrace` is the zoo's diagnostics record: a model called with ``output_energies=True`` returns one, filled
by its layers with their thermodynamic quantities, one dict per layer in the order the layers ran. Every family
fills it the same way: the model's forward is wrapped by `records_energies`, which starts a trace for the
forward in progress, and layers call `record_energies(...)` (a no-op unless a trace is being recorded, so the
quantities cost nothing otherwise). Recomputation under activation checkpointing happens after the forward
returned and records nothing; under torch.compile the trace lives in a plain global while tracing.

Keys shared by the families (`COMMON_ENERGY_KEYS`; per-step quantities are stacked over the steps), where a
family has the quantity:

- ``energy``: the energy or free energy the layer computes or descends (FEM: the free-energy gain
  F(beta_max) - mu = KL(p* || p) / beta_max per token, FEM eq. 6; TEL: G(y) per step where the entropy S has a
  closed form, TEL eq. 2-3; Hyper-SET: E_ATTN + E_FF per sample after each iteration, eq. 3-5; EqT: the weighted
  energy L(h) of eq. 11 per step; EER: the attention energy -T log Z per loop);
- ``temperature``: T (FEM: 1 / beta_max per channel, eq. 9; TEL: T_i per step, eq. 7; EER: the attention
  temperature);
- ``step_size``: the step size of an iterative update (TEL: eta_i, eq. 8; Hyper-SET: mean alpha_t, eq. 12; EqT:
  alpha, eq. 8);
- ``iterations``: refinement steps actually taken (mean over positions);
- ``residual``: the size of the update, per step (TEL: ||g_G||, Algorithm 1 line 8; Hyper-SET: the mean
  ||x_{t+1} - x_t|| over tokens; EqT: ||h_{k+1} - h_k|| / ||h_k||; EER: ||z_{t+1} - z_t|| per loop).

Families add their own keys beside them (FEM: ``inverse_temperature``, ``temperature_gate``,
``temperature_gate_std``; TEL: ``free_energy_change``, ``enthalpy_entropy_ratio``, ``gradient_alignment``;
Hyper-SET: ``attention_energy``, ``feedforward_energy``, ``feedforward_step_size``, ``effective_rank``,
``average_angle``; EqT: ``reverse_energy``, ``masked_energy``, ``confidence_energy``, ``memory_energy``,
``proximal_energy``; EER: ``kinetic``, ``potential``, ``entropy`` (eq. 3-5) and ``contraction_bound``). TEL's ``energy``
and ``free_energy_change`` exist where S has a closed form (not under SiLU).
"""

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path

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
    MaskedLMOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.utils.output_capturing import CompileableContextVar

from .errors import UserError
from .transformers_compat import cache_of, with_cache

COMMON_ENERGY_KEYS = ("energy", "temperature", "step_size", "iterations", "residual")

class ForwardContextVar(CompileableContextVar):
    """transformers' compile-friendly context variable, for the zoo's per-forward settings (the energy trace, the
    refinement steps). Its methods are bound here, so that what is done to `CompileableContextVar`, which
    transformers' output capturing owns (its tests patch it, taking every value for a dict of captured outputs),
    does not reach the zoo's variables."""

    get, set, reset = CompileableContextVar.get, CompileableContextVar.set, CompileableContextVar.reset


class TraceSummary(dict):
    """`EnergyTrace.summary`: ``{"<quantity>/layer_<i>": mean}``, shown as a table of layers by quantities."""

    def __str__(self) -> str:
        rows: dict[str, dict[str, float]] = {}
        for key, value in self.items():
            name, layer = key.rsplit("/", 1)
            rows.setdefault(layer.replace("_", " "), {})[name] = value
        names = list(dict.fromkeys(name for row in rows.values() for name in row))
        width = max([len(name) for name in names] + [10])
        lines = ["layer    " + " ".join(f"{name:>{width}}" for name in names)]
        lines += [f"{layer:<8} " + " ".join(f"{row[name]:>{width}.4g}" if name in row else " " * width
                                            for name in names) for layer, row in rows.items()]
        return "\n".join(lines)


# The trace of the forward in progress (None: nothing is recorded).
_ACTIVE_TRACE = ForwardContextVar("energyzoo_energy_trace")


@dataclass
class EnergyTrace:
    """Per-layer thermodynamic diagnostics of one forward pass.

    Attributes:
        architecture: the `model_type` that produced the trace.
        layers: one dict per layer, in the order the layers ran, mapping a quantity name to a detached tensor
            (per-step quantities stacked over the steps on dim 0).
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

    def summary(self) -> "TraceSummary":
        """Mean of every quantity per layer, as plain floats (a dict for logging, ``{"energy/layer_0": ...}``, which
        prints as a table: one row per layer, one column per quantity)."""
        return TraceSummary({
            f"{name}/layer_{index}": float(value.float().mean())
            for index, layer in enumerate(self.layers)
            for name, value in layer.items()
        })

    def plot(self, path: str | Path | None = None, names: tuple[str, ...] = ("energy", "temperature", "residual")):
        """Draw each of ``names`` the trace has, one panel per quantity: for iterative families (their layers
        record ``iterations`` and stack per-step quantities on dim 0) one line per layer over the refinement
        steps, otherwise the per-layer mean over the layers. Saved as a PNG at ``path`` if given; returns the
        matplotlib figure."""
        try:  # no pyplot: the caller's backend and figure list stay untouched
            from matplotlib.figure import Figure
        except ModuleNotFoundError as error:
            message = "EnergyTrace.plot needs matplotlib (pip install matplotlib, or energyzoo[plots])"
            raise ImportError(message) from error

        present = [name for name in names if name in self.names()]
        if not present:
            raise UserError(f"the {self.architecture} trace has none of {names}; it has {self.names()}")
        per_step = "iterations" in self.names()
        figure = Figure(figsize=(4.2 * len(present), 3.4))
        axes = figure.subplots(1, len(present), squeeze=False)
        for axis, name in zip(axes[0], present):
            if per_step:
                for index, layer in enumerate(self.layers):
                    values = layer[name].float().reshape(layer[name].shape[0], -1).mean(-1)
                    axis.plot(range(len(values)), values.tolist(), marker="o", markersize=3, label=f"layer {index}")
                axis.set_xlabel("refinement step")
                axis.legend(fontsize=7)
            else:
                means = [float(layer[name].float().mean()) for layer in self.layers]
                axis.plot(range(len(means)), means, marker="o")
                axis.set_xlabel("layer")
            axis.xaxis.get_major_locator().set_params(integer=True)  # steps and layers are whole: no 0.5 ticks
            axis.set_title(name)
        figure.suptitle(f"{self.architecture} energy trace")
        figure.tight_layout()
        if path is not None:
            figure.savefig(path, dpi=110)
        return figure


def record_energies(values: dict[str, torch.Tensor]) -> None:
    """Add one layer's quantities (detached) to the trace of the forward in progress; nothing when none is
    being recorded. Check `recording_energies()` first where computing the values costs something."""
    trace = _ACTIVE_TRACE.get()
    if trace is not None:
        trace.layers.append({name: value.detach() for name, value in values.items()})


def recording_energies() -> bool:
    """Whether the forward in progress records an `EnergyTrace`."""
    return _ACTIVE_TRACE.get() is not None


@contextlib.contextmanager
def tracing_energies(architecture: str):
    """Record the `EnergyTrace` of whatever runs inside (zoo layers used outside a zoo model, e.g. a TEL layer in
    a plain module): ``with tracing_energies("tel") as trace: module(x)``. Zoo models use `records_energies`."""
    trace = EnergyTrace(architecture)
    token = _ACTIVE_TRACE.set(trace)
    try:
        yield trace
    finally:
        _ACTIVE_TRACE.reset(token)


def records_energies(forward):
    """Wrap a model's ``forward`` so that ``output_energies=True`` records an `EnergyTrace` of its layers and
    returns it in the output's ``energies`` field (after the other fields, in tuples). The one energy path of
    every family; the output class must have an ``energies`` field (`WITH_ENERGIES` extends transformers')."""

    @functools.wraps(forward)
    def wrapper(self, *args, output_energies: bool = False, **kwargs):
        trace = EnergyTrace(self.config.model_type) if output_energies else None
        token = _ACTIVE_TRACE.set(trace)
        try:
            outputs = forward(self, *args, **kwargs)
        finally:
            _ACTIVE_TRACE.reset(token)
        return attach_energies(outputs, trace)

    return wrapper


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


@dataclass
class TokenClassifierOutputWithEnergies(TokenClassifierOutput):
    """`TokenClassifierOutput` plus the model's `EnergyTrace` (None unless `output_energies=True`)."""

    energies: EnergyTrace | None = None


@dataclass
class MaskedLMOutputWithEnergies(MaskedLMOutput):
    """`MaskedLMOutput` (logits over the codebook for masked image modelling, as BEiT) plus the `EnergyTrace`."""

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
    """Return `outputs` with its `EnergyTrace` in the ``energies`` field (a transformers output class becomes its
    `WITH_ENERGIES` extension); appended when `return_dict=False` gave a tuple."""
    if isinstance(outputs, tuple):
        return outputs if energies is None else (*outputs, energies)
    if "energies" not in outputs.__dataclass_fields__:
        outputs = WITH_ENERGIES[type(outputs)](**outputs)
    if energies is not None:
        outputs["energies"] = energies  # item assignment: to_tuple() includes it
    return outputs


def passed_on(outputs) -> dict:
    """What a head hands on from its base model's ``outputs``: the cache (under the release's field name), the hidden
    states, the attentions and the energy trace."""
    return dict(**with_cache(cache_of(outputs)), hidden_states=outputs.hidden_states, attentions=outputs.attentions,
                energies=outputs.energies)
