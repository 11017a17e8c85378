"""The step schedule: the scale factors at which a simulation's steps begin and end.

``step_schedule(a_start, a_end, n_steps, steps, output_a)`` returns the
increasing array ``a_0 = a_start < a_1 < ... < a_n = a_end``. The base
schedule has ``n_steps`` steps, uniform in ``log a`` (``"loga"``) or in ``a``
(``"a"``), or is the explicit array given. Every output scale factor is then
inserted exactly (the step containing it is split in two; a base point within
``1e-9`` (relative) of an output is moved onto it instead), so a run has
``n_steps`` plus at most ``len(outputs)`` steps and lands exactly on each
output's ``a = 1 / (1 + z)``.

The midpoint ``a_h`` of a step (where a kick-drift-kick leapfrog evaluates the
momenta for the drift) is the midpoint in the step variable: the geometric mean
``sqrt(a_0 a_1)`` for ``"loga"`` and explicit arrays, the arithmetic mean for ``"a"``.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import ParameterError

#: relative distance below which a base schedule point is moved onto an output
SNAP_TOL = 1e-9


def base_schedule(a_start: float, a_end: float, n_steps: int | None, steps) -> np.ndarray:
    """The schedule before outputs are inserted (see the module docstring); ``steps`` as
    :func:`cosmo_dask.simulation.parameters.check_steps` returns it."""
    if isinstance(steps, np.ndarray):
        if not (math.isclose(steps[0], a_start, rel_tol=1e-10)
                and math.isclose(steps[-1], a_end, rel_tol=1e-10)):
            raise ParameterError(
                f"steps: an explicit schedule must run from the ICs' a = {a_start:.10g} to "
                f"a_final = {a_end:.10g}, got [{steps[0]:.10g}, {steps[-1]:.10g}]")
        if n_steps is not None and n_steps != steps.size - 1:
            raise ParameterError(f"n_steps={n_steps} differs from the explicit schedule's "
                                 f"{steps.size - 1} steps; leave n_steps=None")
        out = steps.copy()
    else:
        if n_steps is None:
            raise ParameterError("n_steps is required (a positive integer) unless steps is "
                                 "an explicit array")
        if steps == "loga":
            out = np.exp(np.linspace(math.log(a_start), math.log(a_end), n_steps + 1))
        else:
            out = np.linspace(a_start, a_end, n_steps + 1)
    out[0], out[-1] = a_start, a_end
    return out


def step_schedule(a_start: float, a_end: float, n_steps: int | None, steps="loga",
                  output_a=()) -> np.ndarray:
    """The full schedule (base schedule with every output scale factor inserted exactly)."""
    sched = base_schedule(a_start, a_end, n_steps, steps)
    for a_out in output_a:
        a_out = float(a_out)
        if not a_start * (1 - 1e-12) <= a_out <= a_end * (1 + 1e-12):
            raise ParameterError(f"output at a = {a_out:.10g} lies outside the run's "
                                 f"[{a_start:.10g}, {a_end:.10g}]")
        near = np.abs(sched - a_out) <= SNAP_TOL * a_out
        if near.any():
            sched[np.argmax(near)] = a_out
        else:
            sched = np.insert(sched, np.searchsorted(sched, a_out), a_out)
    if np.any(np.diff(sched) <= 0):  # two outputs closer than the snapping tolerance
        raise ParameterError("outputs: two output redshifts are closer than 1e-9 in a")
    return sched


def midpoint(a0: float, a1: float, steps) -> float:
    """Midpoint of the step ``[a0, a1]`` in the step variable (see the module docstring)."""
    if isinstance(steps, str) and steps == "a":
        return 0.5 * (a0 + a1)
    return math.sqrt(a0 * a1)
