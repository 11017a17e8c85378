"""Gravity's shared parameters, declared once: the opening-angle bound, the TreePM split
defaults and their checks. Every entry point (``api``, ``treepm``, the tree walks on CPU
and GPU, the P2P kernels, the CLI) takes them from here."""

from __future__ import annotations

import math
from typing import Any

from ..core.checks import check_bounded_int
from ..core.errors import ParameterError

#: the methods of ``gravity.accelerations`` (and ``cosmo-dask gravity --method``); the
#: first is the default
METHODS = ("tree", "direct", "pm", "treepm")
#: the softening kernels; the first is the default
KERNELS = ("plummer", "spline")
#: the Plummer-equivalent softening length by default (length units)
SOFTENING_DEFAULT = 0.0
#: the working precision of ``accelerations`` and ``cosmo-dask gravity`` by default
PRECISION_DEFAULT = "float32"
#: the tree's leaves and groups: at most this many particles by default
MAX_LEAF_DEFAULT = 64
MAX_GROUP_DEFAULT = 64
#: the opening angle must lie in (0, THETA_MAX)
THETA_MAX = 1.5
#: the default opening angle
THETA_DEFAULT = 0.5
#: default r_split in mesh cells: r_split = R_SPLIT_CELLS * box_size / n_mesh
R_SPLIT_CELLS = 1.2
#: default r_cut in units of r_split
R_CUT_SPLITS = 4.5
#: the largest r_cut in units of r_split (the truncated-kernel table ends at x = 3)
R_CUT_MAX_SPLITS = 6.0
#: the smallest default PM mesh
MIN_N_MESH = 16
#: with the truncated kernel a multipole needs bmax < theta * TRUNC_OPEN_SPLITS * r_split
#: as well as bmax < theta * d (the kernel varies on the scale r_split)
TRUNC_OPEN_SPLITS = 0.5
#: the TreePM short range's octree: leaves and groups of at most this many particles.
#: 32/32 holds 1.2-1.8x fewer P2P pairs than 64/64 at one particle per mesh cell (CPU
#: walk, 64^3 boxes at z = 0 and 9) but twice the groups, and the GPU walk runs once per
#: group: which is faster on a GPU is measured by ``python -m benchmarks simulation --split
#: --split-trees``
TREEPM_MAX_LEAF = 64
TREEPM_MAX_GROUP = 64


def check_theta(theta: Any, what: str = "") -> float:
    """The opening angle as a float in (0, THETA_MAX), else a ParameterError (prefixed by
    ``what:`` when given)."""
    prefix = f"{what}: " if what else ""
    ok = isinstance(theta, (int, float)) or hasattr(theta, "__float__")
    t = float(theta) if ok and not isinstance(theta, bool) else math.nan
    if not 0.0 < t < THETA_MAX:
        raise ParameterError(f"{prefix}theta (the opening angle) must be a number in "
                             f"(0, {THETA_MAX}), got {theta!r}")
    return t


#: the largest tree leaf or group accepted whatever the particle count (above it, at most
#: the particle count: a leaf never holds more)
MAX_LEAF_ANY = 2**16


def check_leaf_size(value: Any, name: str, n_particles: int) -> int:
    """A tree's ``max_leaf`` or ``max_group``: an integer from 1 to the larger of the
    particle count and :data:`MAX_LEAF_ANY`, else a ParameterError."""
    return check_bounded_int(value, name, max(int(n_particles), MAX_LEAF_ANY),
                             "a leaf holds at most all the particles")


def default_r_cut(rs: float) -> float:
    """The short-range cutoff used when ``r_cut`` is not given: ``R_CUT_SPLITS * rs``."""
    return R_CUT_SPLITS * rs
