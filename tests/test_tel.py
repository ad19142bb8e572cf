"""The Thermodynamic Equilibrium Layer (tel.txt Algorithm 1, eq. 6-13) against independent references."""

import math

import pytest
import torch
import torch.nn.functional as F
from tel_reference import PHI, naive_algorithm_1
from torch import nn

from energyzoo import TELSettings, ThermodynamicEquilibriumLayer, ThermodynamicRefinement
from energyzoo.modeling.configuration_tel import ACTIVATION_LIPSCHITZ
from energyzoo.modeling.outputs import tracing_energies
from energyzoo.modeling.tel_layer import EntropyEstimator


def refinement(width=16, channel_dim=-1, dtype=torch.float64, **fields):
    layer = ThermodynamicRefinement(width, channel_dim, TELSettings(**fields)).to(dtype)
    layer.reset_parameters()  # initial values exact in `dtype`
    return layer.eval()


def traced(layer, anchor):
    """(output, the layer's energy-trace entry: its per-step diagnostics) of one call."""
    with tracing_energies("tel") as trace:
        output = layer(anchor)
    (entry,) = trace.layers
    return output, entry


@pytest.mark.parametrize("training", [False, True])
def test_forward_matches_a_float64_naive_algorithm_1(training):
    settings = TELSettings(tel_steps=4, tel_dual_step=0.02, tel_entropy_shift=0.3)
    layer = ThermodynamicRefinement(24, -1, settings).train(training)
    with torch.no_grad():
        layer.tel_log_step_sizes.copy_(torch.log(torch.tensor([0.9, 0.6, 0.3, 0.8])))
    anchor = 2 * torch.randn(3, 7, 24, dtype=torch.float64)
    expected = naive_algorithm_1(anchor, settings, [0.9, 0.6, 0.3, 0.8], math.log(0.5), training)
    actual = layer(anchor.float())
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-5)


def test_one_step_is_anchor_plus_eta_t_phi_of_anchor_exactly():
    """K = 1: y1 = Wx + eta0 T0 phi(Wx) (tel.txt §2.3, "one-step MLP")."""
    layer = refinement(tel_steps=1, tel_initial_step_size=0.7, tel_initial_temperature=0.3)
    anchor = torch.randn(5, 16, dtype=torch.float64)
    for mode in (False, True):
        expected = anchor + 0.7 * 0.3 * F.silu(anchor)
        torch.testing.assert_close(layer.train(mode)(anchor), expected, rtol=1e-12, atol=1e-12)


def test_vanishing_temperature_gives_the_linear_layer():
    anchor_map = nn.Linear(6, 16).double()
    settings = TELSettings(tel_temperature_min=1e-12, tel_initial_temperature=1e-12)
    tel = ThermodynamicEquilibriumLayer(anchor_map, settings)
    x = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(tel.eval()(x), anchor_map(x), rtol=0, atol=1e-10)
    assert not torch.allclose(ThermodynamicEquilibriumLayer(anchor_map).double().eval()(x), anchor_map(x), atol=1e-3)


@pytest.mark.parametrize("activation", ["silu", "gelu", "tanh", "relu"])
def test_frozen_temperature_converges_to_the_fixed_point(activation):
    """Prop. C.4: with T frozen the iteration converges to y = Wx + T phi(y)."""
    layer = refinement(tel_steps=400, tel_activation=activation, tel_initial_temperature=0.8, tel_initial_step_size=0.9)
    anchor = 3 * torch.randn(8, 16, dtype=torch.float64)
    y = layer(anchor)
    residual = y - anchor - 0.8 * PHI[activation](y)
    assert residual.abs().max() < 1e-10
    few = refinement(tel_steps=3, tel_activation=activation, tel_initial_temperature=0.8, tel_initial_step_size=0.9)
    assert (few(anchor) - anchor - 0.8 * PHI[activation](few(anchor))).abs().max() > 1e-4


@pytest.mark.parametrize("activation", ["silu", "gelu", "tanh", "relu", "prelu"])
def test_step_map_is_non_expansive_under_the_design_rule(activation):
    """Prop. 2.1 / eq. 13 at the worst case T = T_max, eta = eta_max; breaking the rule breaks the bound."""
    settings = TELSettings(tel_activation=activation)
    layer = refinement(tel_activation=activation)
    eta = torch.tensor(settings.tel_step_size_max, dtype=torch.float64)
    temperature = torch.tensor(settings.tel_resolved_temperature_max, dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    anchor = torch.randn(512, 16, generator=generator, dtype=torch.float64)
    y1 = 3 * torch.randn(512, 16, generator=generator, dtype=torch.float64)
    y2 = y1 + 0.5 * torch.randn(512, 16, generator=generator, dtype=torch.float64)
    gap = (y1 - y2).norm(dim=-1)
    moved = (layer.step(y1, anchor, eta, temperature) - layer.step(y2, anchor, eta, temperature)).norm(dim=-1)
    assert (moved <= gap * (1 + 1e-12)).all()
    hot = torch.tensor(4.0 / ACTIVATION_LIPSCHITZ[activation], dtype=torch.float64)
    expanded = (layer.step(y1, anchor, eta, hot) - layer.step(y2, anchor, eta, hot)).norm(dim=-1)
    assert (expanded > gap).any()


def test_step_sizes_and_temperatures_are_clipped_to_the_design_range():
    layer = refinement(tel_steps=3)
    with torch.no_grad():
        layer.tel_log_step_sizes.copy_(torch.tensor([5.0, -30.0, 0.0]))
        layer.tel_log_temperature.fill_(10.0)
    assert layer.step_sizes().tolist() == pytest.approx([1.0, 1e-4, 1.0])
    _, trace = traced(layer, torch.randn(4, 16, dtype=torch.float64))
    assert trace["temperature"].max() <= 1 / ACTIVATION_LIPSCHITZ["silu"] + 1e-9


def test_temperature_is_frozen_at_inference_and_adapts_in_training():
    layer = refinement(tel_dual_step=0.02)
    anchor = torch.randn(32, 16, dtype=torch.float64)
    assert torch.all(traced(layer, anchor)[1]["temperature"] == 0.5)
    trained = traced(layer.train(), anchor)[1]["temperature"]
    assert trained[0] == 0.5 and (trained[1:] != 0.5).all()
    # var(silu(N(0,1))) < 1, so the Gaussian entropy estimate is negative and T falls (eq. 9 with beta0 = 0)
    assert (trained.diff() < 0).all()
    adapting = refinement(tel_dual_step=0.02, tel_adapt_at_inference=True)
    torch.testing.assert_close(traced(adapting, anchor)[1]["temperature"], trained)


def test_channel_temperatures_broadcast_over_conv_channels():
    conv = nn.Conv2d(3, 8, 3, padding=1).double()
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    glob = ThermodynamicEquilibriumLayer(conv, TELSettings()).double().eval()
    per_channel = ThermodynamicEquilibriumLayer(conv, TELSettings(tel_temperature="channel")).double().eval()
    assert per_channel.refinement.tel_log_temperature.shape == (8,)
    torch.testing.assert_close(per_channel(x), glob(x))
    with torch.no_grad():
        per_channel.refinement.tel_log_temperature[3] = math.log(0.05)
    changed = (per_channel(x) - glob(x)).abs().amax(dim=(0, 2, 3))
    assert changed[3] > 0 and torch.all(changed[torch.arange(8) != 3] == 0)


def test_early_exit_stops_each_position_on_its_own():
    anchor = torch.randn(6, 16, dtype=torch.float64)
    anchor[0] = 0.0  # phi(0) = 0 for silu: g_G = 0 from the first step, so this row exits at once
    exiting = refinement(tel_early_exit=True, tel_exit_tolerance=1e-9, tel_exit_patience=1)
    full = refinement()
    one_step = refinement(tel_steps=1)
    y = exiting(anchor)
    torch.testing.assert_close(y[0], one_step(anchor)[0])
    torch.testing.assert_close(y[1:], full(anchor)[1:])
    assert traced(exiting, anchor)[1]["iterations"] == pytest.approx((1 + 5 * 5) / 6)
    loose = refinement(tel_early_exit=True, tel_exit_tolerance=1e9, tel_exit_patience=2)
    output, trace = traced(loose, anchor)
    torch.testing.assert_close(output, refinement(tel_steps=2)(anchor))
    assert trace["iterations"] == 2
    # training always runs all K steps (App. E)
    torch.testing.assert_close(loose.train()(anchor), full.train()(anchor))


@pytest.mark.parametrize("activation", ["gelu", "tanh", "relu", "prelu"])
def test_free_energy_decreases_and_energy_rule_exits(activation):
    layer = refinement(tel_activation=activation, tel_initial_step_size=1.0, tel_initial_temperature=0.85)
    _, trace = traced(layer, 3 * torch.randn(64, 16, dtype=torch.float64))
    assert (trace["free_energy_change"] <= 1e-12).all()
    assert trace["energy"].diff().le(1e-12).all()
    exiting = refinement(tel_activation=activation, tel_early_exit=True, tel_exit_rule="energy", tel_exit_tolerance=1e9,
                         tel_exit_patience=1)
    assert traced(exiting, torch.randn(4, 16, dtype=torch.float64))[1]["iterations"] == 1


def test_diagnostics_follow_their_definitions():
    layer = refinement(tel_steps=3, tel_activation="tanh")
    anchor = torch.randn(10, 16, dtype=torch.float64)
    _, trace = traced(layer, anchor)
    # step 0: g_H = 0, so rho = 0 and kappa = 0; ||g_G|| = T ||phi(Wx)||
    assert trace["enthalpy_entropy_ratio"][0] == 0 and trace["gradient_alignment"][0] == 0
    torch.testing.assert_close(trace["residual"][0], (0.5 * torch.tanh(anchor)).norm(dim=-1).mean())
    y1 = anchor + 0.25 * torch.tanh(anchor)
    g_h, t_g_s = y1 - anchor, 0.5 * torch.tanh(y1)
    torch.testing.assert_close(trace["enthalpy_entropy_ratio"][1], (g_h.norm(dim=-1) / t_g_s.norm(dim=-1)).mean())
    torch.testing.assert_close(trace["gradient_alignment"][1], F.cosine_similarity(g_h, t_g_s, dim=-1).mean())
    energy = (0.5 * (y1 - anchor).square() - 0.5 * torch.log(torch.cosh(y1))).sum(-1).mean()
    torch.testing.assert_close(trace["energy"][1], energy)


def estimate(kind, sample, **fields):
    return EntropyEstimator(TELSettings(tel_estimator=kind, **fields))(sample, -1)


def test_entropy_estimators_recover_known_entropies_on_the_gaussian_scale():
    """Each analytic estimator returns its closed-form entropy minus a unit Gaussian's (eq. 35's scale)."""
    generator = torch.Generator().manual_seed(0)
    normal = 2.0 * torch.randn(20000, 4, generator=generator)
    laplace = torch.distributions.Laplace(0.0, 1.5).sample((20000, 4))
    student = torch.distributions.StudentT(5.0, 0.0, 0.7).sample((20000, 4))
    unit = 0.5 * math.log(2 * math.pi * math.e)
    torch.testing.assert_close(estimate("gaussian", normal), torch.full((4,), math.log(2.0)), atol=0.02, rtol=0)
    torch.testing.assert_close(estimate("robust_gaussian", normal), torch.full((4,), math.log(2.0)), atol=0.03, rtol=0)
    laplace_entropy = float(torch.distributions.Laplace(0.0, 1.5).entropy()) - unit
    torch.testing.assert_close(estimate("laplace", laplace), torch.full((4,), laplace_entropy), atol=0.03, rtol=0)
    student_entropy = float(torch.distributions.StudentT(5.0, 0.0, 0.7).entropy()) - unit
    torch.testing.assert_close(estimate("student_t", student), torch.full((4,), student_entropy), atol=0.05, rtol=0)


@pytest.mark.parametrize("sigma", [0.3, 3.0])
def test_analytic_estimators_agree_on_gaussian_data_and_drive_the_temperature_the_same_way(sigma):
    """On N(0, sigma^2) data every analytic estimator reads log sigma + its documented misfit constant (0 for
    the Gaussians, +0.048 for Laplace, -0.047 for Student-t at nu = 5), so the drift of eq. 9 (beta_0 = 0)
    has the sign of log sigma whichever estimator is chosen."""
    sample = sigma * torch.randn(50000, 4, generator=torch.Generator().manual_seed(1))
    constants = {"gaussian": 0.0, "robust_gaussian": 0.0, "laplace": 0.0484, "student_t": -0.0468}
    for kind, constant in constants.items():
        torch.testing.assert_close(estimate(kind, sample), torch.full((4,), math.log(sigma) + constant),
                                   atol=0.02, rtol=0, msg=kind)
    anchor = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))
    drifts = []
    for kind in constants:
        layer = ThermodynamicRefinement(16, -1, TELSettings(tel_estimator=kind)).train()
        layer.entropy_force.forward = lambda y: y  # phi = identity: the statistics are those of y itself
        temperatures = traced(layer, anchor * sigma)[1]["temperature"]
        drifts.append(temperatures[-1] - temperatures[0])
    assert all((drift > 0) == (sigma > 1) and drift != 0 for drift in drifts), drifts


@pytest.mark.parametrize("estimator", ["gaussian", "robust_gaussian", "laplace", "student_t", "mlp"])
def test_token_pooling_makes_each_position_its_own_in_training(estimator):
    """With tel_entropy_pooling="token" no position's output depends on another position or sequence, in
    training mode too (the dual update runs): each row equals the row alone. D.4's batch pooling does not."""
    anchor = 2 * torch.randn(6, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    anchor[3] *= 4  # a row of another scale: its statistics differ
    for temperature in ("global", "channel"):
        token = refinement(tel_estimator=estimator, tel_entropy_pooling="token", tel_temperature=temperature,
                           tel_dual_step=0.05).train()
        together = token(anchor)
        for row in (0, 3):
            torch.testing.assert_close(together[row, 2:3], token(anchor[row : row + 1, 2:3])[0])
        batch = refinement(tel_estimator=estimator, tel_temperature=temperature, tel_dual_step=0.05).train()
        assert not torch.allclose(batch(anchor)[0, 2:3], batch(anchor[:1, 2:3])[0])


def test_temperature_and_dual_update_stay_in_fp32_in_a_bf16_layer():
    """A bf16 layer's temperatures follow the fp32 layer's on the same anchor to ~3e-5 (its forces differ only
    by bf16 rounding); rounding tau itself to bf16 (spacing 4e-3 near log 0.5) would be off by ~1e-3."""
    anchor = (2 * torch.randn(64, 32, generator=torch.Generator().manual_seed(4))).bfloat16()
    temperatures = []
    for dtype in (torch.float32, torch.bfloat16):
        layer = ThermodynamicRefinement(32, -1, TELSettings(tel_dual_step=0.05)).to(dtype).train()
        temperatures.append(traced(layer, anchor.to(dtype))[1]["temperature"])
    assert temperatures[1].dtype == torch.float32
    assert (temperatures[0].diff().abs() > 1e-3).all()  # the dual update moves T by ~3e-3 per step
    torch.testing.assert_close(temperatures[1], temperatures[0], rtol=0, atol=1e-4)


def test_mlp_estimator_learns_through_the_temperature():
    layer = ThermodynamicRefinement(16, -1, TELSettings(tel_estimator="mlp", tel_temperature="channel")).train()
    layer(torch.randn(32, 16)).square().sum().backward()
    estimator = layer.entropy_estimator
    assert estimator.tel_estimator_in.weight.grad.abs().sum() > 0
    assert sum(p.numel() for p in estimator.parameters()) == 3 * 16 + 16 + 16 + 1


def test_bf16_forward_is_finite_and_close_to_fp32():
    layer = ThermodynamicRefinement(32, -1, TELSettings()).train()
    anchor = 5 * torch.randn(8, 32)
    reference = layer(anchor)
    low = layer.to(torch.bfloat16)(anchor.bfloat16())
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), reference, rtol=0.05, atol=0.1)


@pytest.mark.parametrize(("field", "value"), [
    ("tel_exit_rule", "energy"),  # silu's entropy has no closed form
    ("tel_temperature_min", 0.0),
    ("tel_student_t_dof", 2.0),
    ("tel_entropy_scale", -1.0),
])
def test_invalid_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"TELSettings.{field}"):
        TELSettings(**{field: value})
