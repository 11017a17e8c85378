"""The simulation's parameters, declared once: the force methods, step schedules,
kick/drift factors, analyses and defaults of :func:`cosmo_dask.simulation.run`, with
their checks. ``run`` checks them here, once, before any work; the schedule, integrator
and store code assume valid values. ``cosmo-dask simulate`` takes its choices and
defaults from here (the opening angle from :mod:`cosmo_dask.gravity.parameters`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.checks import check_bounded_int, check_subset
from ..core.errors import ParameterError

__all__ = ["METHODS", "METHOD_DEFAULT", "STEP_KINDS", "DEFAULT_STEPS", "FACTORS",
           "FACTORS_DEFAULT", "ANALYSES", "Z_FINAL_DEFAULT", "SOFTENING_SPACINGS",
           "MAX_STEPS", "check_method", "check_n_steps", "check_steps", "check_factors",
           "check_analyses", "check_outputs_count"]

#: the force methods of a run (``gravity.accelerations`` methods with a periodic mesh)
METHODS = ("pm", "treepm")
METHOD_DEFAULT = "pm"
#: base step schedules: uniform in log a, or in a (or an explicit array of scale factors)
STEP_KINDS = ("loga", "a")
#: the schedule of each method when ``steps`` is not given: the tree's small scales need
#: their steps late, when halos form (``docs/simulation.md``)
DEFAULT_STEPS = {"pm": "loga", "treepm": "a"}
#: kick/drift factors (:class:`~cosmo_dask.simulation.integrator.Factors`)
FACTORS = ("fastpm", "standard")
FACTORS_DEFAULT = "fastpm"
#: what may be computed at each output
ANALYSES = ("power", "halos")
#: the final redshift by default
Z_FINAL_DEFAULT = 0.0
#: default TreePM softening, in units of the mean interparticle spacing
SOFTENING_SPACINGS = 1.0 / 30.0
#: the most steps of a run (base steps, an explicit schedule's steps and outputs alike):
#: every step is a force computation, a row of the run's log and a rewrite of
#: ``simulation.json`` (which holds the log: about 150 bytes a row, so 2^16 steps already
#: rewrite a 10 MB file each step); the schedule is allocated only after this check
MAX_STEPS = 2**16


def check_method(method: Any) -> str:
    """A method out of :data:`METHODS`, else a ParameterError."""
    if method not in METHODS:
        raise ParameterError(f"method must be one of {METHODS}, got {method!r}")
    return method


def check_n_steps(n_steps: Any) -> int:
    """The number of base steps: an integer in ``[1, MAX_STEPS]``, else a ParameterError."""
    return check_bounded_int(n_steps, "n_steps", MAX_STEPS, "each step is a force "
                             "computation and a row of the run's log")


def check_outputs_count(outputs: Any) -> Any:
    """``outputs`` unchanged when it holds at most :data:`MAX_STEPS` redshifts (each splits
    a step), else a ParameterError; its values are checked by the run against the ICs."""
    size = int(np.size(outputs)) if outputs is not None else 0
    if size > MAX_STEPS:
        raise ParameterError(f"outputs: at most {MAX_STEPS} output redshifts, got {size}")
    return outputs


def check_steps(steps: Any):
    """``steps`` as ``"loga"``/``"a"`` or a float64 array (checked for shape and order
    only; its ends are checked against the run's by the schedule), else a
    ParameterError."""
    if isinstance(steps, str):
        if steps not in STEP_KINDS:
            raise ParameterError(f"steps must be 'loga', 'a' or an increasing array of scale "
                                 f"factors, got {steps!r}")
        return steps
    try:
        arr = np.asarray(steps, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError(f"steps must be 'loga', 'a' or an increasing array of scale "
                             f"factors, got {steps!r}") from None
    if arr.ndim != 1 or arr.size < 2 or not np.all(np.isfinite(arr)) or np.any(arr <= 0) \
            or np.any(np.diff(arr) <= 0):
        raise ParameterError("steps: an explicit schedule must be a 1-d strictly increasing "
                             "array of at least 2 positive scale factors")
    if arr.size > MAX_STEPS + 1:
        raise ParameterError(f"steps: an explicit schedule has at most {MAX_STEPS} steps, "
                             f"got {arr.size - 1}")
    return arr


def check_factors(factors: Any) -> str:
    """The kick/drift factors out of :data:`FACTORS` (None: :data:`FACTORS_DEFAULT`), else
    a ParameterError."""
    kind = FACTORS_DEFAULT if factors is None else factors
    if kind not in FACTORS:
        raise ParameterError(f"factors must be one of {FACTORS}, got {kind!r}")
    return kind


def check_analyses(analyses: Any) -> tuple[str, ...]:
    """The analyses as a tuple out of :data:`ANALYSES`, else a ParameterError."""
    return check_subset(analyses, ANALYSES, "analyses")
