"""The zoo's one energy mechanism (`energyzoo.modeling.outputs`): recording scope and the plot helper."""

import re

import pytest
import torch
from torch import nn

from energyzoo import FEMConfig, FEMForCausalLM, TELSettings, ThermodynamicEquilibriumLayer, model_from_preset
from energyzoo.modeling import outputs
from energyzoo.modeling.outputs import record_energies, recording_energies, tracing_energies
from energyzoo.registry import ARCHITECTURES


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_the_trace_keys_a_model_records_are_the_ones_the_outputs_docstring_lists(model_type):
    torch.manual_seed(0)
    model = model_from_preset(ARCHITECTURES[model_type].tiny_preset).eval()
    config = model.config
    if model.main_input_name == "input_ids":
        inputs = {"input_ids": torch.randint(0, min(config.vocab_size, 50), (1, 6))}
    else:
        size = getattr(config, "image_size", 8)
        inputs = {"pixel_values": torch.randn(1, config.num_channels, size, size)}
    with torch.no_grad():
        recorded = {key for layer in model(**inputs, output_energies=True).energies.layers for key in layer}
    documented = set(re.findall(r"``(\w+)``", outputs.__doc__))
    assert recorded and recorded <= documented, sorted(recorded - documented)


def test_layers_record_only_inside_a_trace_and_into_the_innermost_one():
    record_energies({"energy": torch.ones(1)})  # no trace: a no-op
    assert not recording_energies()
    with tracing_energies("outer") as outer:
        record_energies({"energy": torch.zeros(1, requires_grad=True) + 1})
        with tracing_energies("inner") as inner:
            record_energies({"energy": torch.full((1,), 2.0)})
        record_energies({"energy": torch.full((1,), 3.0)})
    assert [float(layer["energy"]) for layer in outer.layers] == [1.0, 3.0]
    assert [float(layer["energy"]) for layer in inner.layers] == [2.0]
    assert outer.layers[0]["energy"].grad_fn is None  # stored detached
    assert not recording_energies()


def plotted(figure) -> dict[str, list[tuple[list[float], list[float]]]]:
    return {axis.get_title(): [(list(line.get_xdata()), list(line.get_ydata())) for line in axis.get_lines()]
            for axis in figure.axes}


def test_plot_draws_per_step_quantities_of_iterative_layers(tmp_path):
    module = nn.Sequential(ThermodynamicEquilibriumLayer(nn.Linear(4, 8), TELSettings(tel_activation="tanh")),
                           ThermodynamicEquilibriumLayer(nn.Linear(8, 8), TELSettings(tel_steps=3))).train()
    with tracing_energies("tel") as trace:
        module(torch.randn(16, 4))
    figure = trace.plot(tmp_path / "tel.png")
    assert (tmp_path / "tel.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = plotted(figure)
    assert set(lines) == {"temperature", "residual"}  # silu (second layer) has no closed-form energy
    for layer, (steps, temperatures) in zip(trace.layers, lines["temperature"]):
        assert steps == list(range(len(layer["temperature"])))
        torch.testing.assert_close(torch.tensor(temperatures, dtype=torch.float32), layer["temperature"].float())
    assert len(lines["temperature"][1][0]) == 3


def test_plot_draws_per_layer_means_of_non_iterative_layers(tmp_path):
    model = FEMForCausalLM(FEMConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                     num_attention_heads=4)).eval()
    with torch.no_grad():
        trace = model(torch.randint(3, 50, (2, 9)), output_energies=True).energies
    figure = trace.plot(tmp_path / "fem.png", names=("energy",))
    ((layers, energies),) = plotted(figure)["energy"]
    assert layers == [0, 1, 2]
    figure.canvas.draw()  # the ticks are placed at drawing: whole layers only (three layers drew 0, 0.5, ..., 2)
    ticks = [tick for tick in figure.axes[0].get_xticks() if 0 <= tick <= 2]
    assert ticks and all(float(tick).is_integer() for tick in ticks), ticks
    torch.testing.assert_close(
        torch.tensor(energies, dtype=torch.float32), trace.stack("energy").float().mean(dim=(1, 2))
    )


def test_a_trace_summary_is_each_layers_means_and_prints_as_a_table():
    trace = outputs.EnergyTrace("fem", [{"energy": torch.tensor([1.0, 3.0]), "temperature": torch.tensor(0.5)},
                                        {"energy": torch.tensor([[2.0, 4.0]]), "temperature": torch.tensor(0.25)}])
    summary = trace.summary()
    assert summary == {"energy/layer_0": 2.0, "temperature/layer_0": 0.5, "energy/layer_1": 3.0,
                       "temperature/layer_1": 0.25}
    assert str(summary).splitlines() == ["layer" + " " * 9 + "energy temperature",  # columns 11 wide, right-aligned
                                         "layer 0" + " " * 12 + "2" + " " * 9 + "0.5",
                                         "layer 1" + " " * 12 + "3" + " " * 8 + "0.25"]
