"""The K-step refinement loop shared by the zoo's iterative layers: TEL's K gradient steps (tel.txt Algorithm 1),
and the same shape of loop in Hyper-SET (R recurrences), EqT (K proximal steps) and EER (T loops).

`refine` runs a step function K times from an initial state and returns the final state, the per-step records
and the iterations each position took:

- early exit is per position (tolerance, patience): once a position's residual stayed <= tolerance for
  ``patience`` consecutive steps its refined tensor stops changing, and the loop ends when every position has
  stopped. A position's result depends only on its own residuals, never on another position or sequence;
- records are stacked over the steps taken, either kept in the autograd graph (for losses built from the
  trajectory) or detached (for energy traces), or not kept;
- backpropagation can be truncated to the last N steps (the earlier ones run without autograd).

K is set per call. `refinement_steps` overrides it for every iterative layer of a model while a forward runs
(`model(..., refinement_steps=K)`, also through `generate`): the one runtime knob for test-time compute.
Pure torch: this file imports no family file.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .errors import UserError
from .outputs import ForwardContextVar

RECORD_MODES = (None, "detached", "graph")

# The run-wide K override of the forward in progress (None: each layer's configured K).
_STEPS_OVERRIDE = ForwardContextVar("energyzoo_refinement_steps")


@dataclass(frozen=True)
class EarlyExit:
    """Per-position early exit: stop a position once its residual stayed <= ``tolerance`` for ``patience``
    consecutive steps. ``channel_dim`` is the refined tensor's channel axis (the other axes are positions)."""

    tolerance: float
    patience: int = 1
    channel_dim: int = -1


class Refined(NamedTuple):
    """The result of `refine`: the final state, each record stacked over the steps taken (dim 0), and the
    steps each position took (the positions' shape; a 0-d tensor of K without early exit)."""

    state: Any
    records: dict[str, torch.Tensor]
    iterations: torch.Tensor


StepFunction = Callable[[int, tuple], tuple[tuple, torch.Tensor | None, dict[str, torch.Tensor]]]


def refine(
    step: StepFunction,
    state: tuple,
    steps: int,
    *,
    early_exit: EarlyExit | None = None,
    records: str | None = None,
    backprop_steps: int | None = None,
) -> Refined:
    """Run ``step`` ``steps`` times from ``state``.

    Args:
        step: ``step(index, state) -> (next_state, residual, step_records)``. ``state`` is a tuple whose first
            entry is the refined tensor (positions x channels); the other entries (a temperature, a velocity,
            ...) ride along. ``residual`` is the per-position exit measure (the positions' shape), or None when
            early exit is off; ``step_records`` a dict of this step's quantities (possibly empty).
        state: the initial state.
        steps: K, the number of steps (at most: early exit may stop sooner).
        early_exit: per-position early exit, or None.
        records: None (step records dropped), "detached" (for traces) or "graph" (kept in autograd's graph).
        backprop_steps: if set, only the last ``backprop_steps`` steps are differentiated through.
    """
    if records not in RECORD_MODES:
        raise UserError(f"refine records must be one of {RECORD_MODES}, got {records!r}")
    if steps < 0 or (backprop_steps is not None and backprop_steps < 0):
        raise UserError(f"refine needs steps >= 0 and backprop_steps None or >= 0, got {steps}, {backprop_steps}")
    first_differentiated = 0 if backprop_steps is None else max(0, steps - backprop_steps)
    history: list[dict[str, torch.Tensor]] = []
    active = streak = taken = None
    for index in range(steps):
        with torch.set_grad_enabled(torch.is_grad_enabled() and index >= first_differentiated):
            next_state, residual, step_records = step(index, state)
        if early_exit is not None:
            if active is None:
                active = torch.ones_like(residual, dtype=torch.bool)
                streak = torch.zeros_like(residual, dtype=torch.long)
                taken = torch.zeros_like(residual)
            refined = torch.where(active.unsqueeze(early_exit.channel_dim), next_state[0], state[0])
            next_state = (refined, *next_state[1:])
            taken = taken + active
            streak = torch.where(residual <= early_exit.tolerance, streak + 1, 0)
            active = active & (streak < early_exit.patience)
        if records is not None:
            history.append(step_records)
        state = next_state
        if early_exit is not None and not active.any():
            break
    stacked = {}
    if history and history[0]:
        stacked = {name: torch.stack([entry[name] for entry in history]) for name in history[0]}
        if records == "detached":
            stacked = {name: value.detach() for name, value in stacked.items()}
    iterations = taken if taken is not None else torch.tensor(float(steps))
    return Refined(state, stacked, iterations)


def refinement_steps(default: int) -> int:
    """K for an iterative layer: the ``refinement_steps`` of the forward in progress, or the layer's ``default``."""
    override = _STEPS_OVERRIDE.get()
    return default if override is None else override


def takes_refinement_steps(forward):
    """Wrap an iterative model's ``forward`` so that ``refinement_steps=K`` (None: each layer's configured K)
    sets K for every iterative layer while it runs; `generate` passes it on to every step. A model whose hidden
    states are one per step (``_hidden_states_per_step``) refuses hidden-state indices with a changed K."""

    @functools.wraps(forward)
    def wrapper(self, *args, refinement_steps: int | None = None, **kwargs):
        if refinement_steps is not None and (not isinstance(refinement_steps, int) or refinement_steps < 0):
            raise UserError(f"refinement_steps must be None or an integer >= 0, got {refinement_steps!r}")
        selection = kwargs.get("output_hidden_states")
        if (refinement_steps is not None and getattr(self, "_hidden_states_per_step", False)
                and not isinstance(selection, (bool, type(None)))):
            # transformers resolves the indices against the configured step count, which this call changes
            raise UserError(f"{type(self).__name__} records a hidden state per refinement step: with "
                             f"refinement_steps={refinement_steps}, pass output_hidden_states=True rather than the "
                             f"indices {selection!r}")
        token = _STEPS_OVERRIDE.set(refinement_steps)
        try:
            return forward(self, *args, **kwargs)
        finally:
            _STEPS_OVERRIDE.reset(token)

    return wrapper
