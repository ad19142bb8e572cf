"""The shared refinement loop (`energyzoo.modeling.refinement`) against closed forms: K steps of an affine map
y <- a y + b have y_K = a^K y_0 + b (1 - a^K) / (1 - a)."""

import pytest
import torch

from energyzoo.modeling.refinement import EarlyExit, refine, refinement_steps, takes_refinement_steps


def affine_step(a, b, record=True):
    """y <- a y + b per position; residual |y_next - y| per position (channels on the last axis)."""

    def step(index, state):
        (y,) = state
        y_next = a * y + b
        residual = (y_next - y).abs().amax(-1)
        return (y_next,), residual, ({"mean": y_next.mean(), "index": torch.tensor(float(index))} if record else {})

    return step


def closed_form(y0, a, b, k):
    return a**k * y0 + b * (1 - a**k) / (1 - a)


@pytest.mark.parametrize("steps", [0, 1, 7])
def test_k_steps_reach_the_closed_form_and_records_stack_over_the_steps(steps):
    y0 = torch.randn(3, 4, dtype=torch.float64)
    result = refine(affine_step(0.5, 1.0), (y0,), steps, records="detached")
    torch.testing.assert_close(result.state[0], closed_form(y0, 0.5, 1.0, steps))
    assert result.iterations == steps
    if steps:
        torch.testing.assert_close(result.records["index"], torch.arange(steps, dtype=torch.float32))
        expected_means = torch.stack([closed_form(y0, 0.5, 1.0, k).mean() for k in range(1, steps + 1)])
        torch.testing.assert_close(result.records["mean"], expected_means)
    else:
        assert result.records == {}


def test_early_exit_freezes_each_position_on_its_own_residual():
    """Positions converge at different speeds (a per-row contraction); each stops once its own residual is
    under the tolerance for `patience` steps, and its result is the one it has when run alone."""
    rates = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)[:, None]
    y0 = torch.full((3, 2), 8.0, dtype=torch.float64)
    exit_rule = EarlyExit(tolerance=1e-2, patience=2)
    together = refine(affine_step(rates, 0.0), (y0,), 60, early_exit=exit_rule)
    for row in range(3):
        alone = refine(affine_step(rates[row : row + 1], 0.0), (y0[row : row + 1],), 60, early_exit=exit_rule)
        torch.testing.assert_close(together.state[0][row], alone.state[0][0])
        assert together.iterations[row] == alone.iterations[0]
        # the residual after step k is (1 - rate) rate^(k-1) * 8; it must stay <= tol for two steps
        residuals = (1 - rates[row]) * rates[row] ** torch.arange(60, dtype=torch.float64) * 8
        first_below = int((residuals <= 1e-2).nonzero()[0])
        assert alone.iterations[0] == first_below + 2
        torch.testing.assert_close(alone.state[0][0], closed_form(y0[row], rates[row], 0.0, first_below + 2))
    assert together.iterations[0] < together.iterations[1] < together.iterations[2]


def test_graph_records_carry_gradients_and_detached_ones_do_not():
    a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y0 = torch.ones(2, 3, dtype=torch.float64)
    kept = refine(affine_step(a, 1.0), (y0,), 4, records="graph")
    kept.records["mean"].sum().backward()
    # d/da sum_k mean(y_k) with y_k = a^k + (1 - a^k) / (1 - a), y_0 = 1
    a_ = a.detach().clone().requires_grad_()
    torch.stack([closed_form(torch.tensor(1.0, dtype=torch.float64), a_, 1.0, k) for k in range(1, 5)]).sum().backward()
    torch.testing.assert_close(a.grad, a_.grad)
    assert refine(affine_step(a, 1.0), (y0,), 4, records="detached").records["mean"].grad_fn is None
    assert refine(affine_step(a, 1.0), (y0,), 4).records == {}
    with pytest.raises(ValueError, match="records"):
        refine(affine_step(a, 1.0), (y0,), 4, records="kept")


def test_truncated_backprop_differentiates_only_the_last_steps():
    """With backprop_steps=N the gradient is that of N steps from the (constant) state after K - N steps."""
    a = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    y0 = torch.full((2, 2), 3.0, dtype=torch.float64)
    refine(affine_step(a, 1.0), (y0,), 6, backprop_steps=2).state[0].sum().backward()
    truncated = a.grad.clone()
    a.grad = None
    start = closed_form(y0, 0.6, 1.0, 4)  # a constant: no gradient through the first four steps
    refine(affine_step(a, 1.0), (start,), 2).state[0].sum().backward()
    torch.testing.assert_close(truncated, a.grad)
    a.grad = None
    refine(affine_step(a, 1.0), (y0,), 6).state[0].sum().backward()
    assert not torch.allclose(truncated, a.grad)


def test_refinement_steps_override_holds_while_the_forward_runs():
    class Iterative:
        @takes_refinement_steps
        def forward(self, default):
            return refinement_steps(default)

    model = Iterative()
    assert model.forward(5) == 5 and model.forward(5, refinement_steps=2) == 2
    assert refinement_steps(5) == 5  # restored after the call
    with pytest.raises(ValueError, match="refinement_steps"):
        model.forward(5, refinement_steps=-1)
