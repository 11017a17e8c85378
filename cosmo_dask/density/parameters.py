"""Density's parameters, declared once: the mass-assignment schemes and mesh sizes of
``paint`` (and ``power_spectrum``), the PSE octree and schedule of ``pse_density``, with
their defaults, bounds and checks.

The public functions (:func:`~cosmo_dask.density.paint`,
:func:`~cosmo_dask.density.pse_density`, :func:`~cosmo_dask.analysis.power_spectrum`)
check their parameters here, once, before any graph is built; the graph code and the
kernels assume valid values. ``cosmo-dask density`` and ``cosmo-dask power`` take their
choices and defaults from here.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..core.checks import check_integer
from ..core.errors import ParameterError

__all__ = ["SCHEMES", "SCHEME_DEFAULT", "CLI_N_MESH_DEFAULT", "SPLIT_EVERY_DEFAULT",
           "STRATEGIES", "PATCH_SIZE_DEFAULT", "MAX_LEVEL_MAX", "BLOCK_DEFAULT",
           "MAX_PARTIALS_DEFAULT", "PSE_SPLIT_EVERY_DEFAULT", "check_n_mesh", "check_scheme",
           "check_box_size", "check_split_every", "check_block", "check_octree_params",
           "check_strategy", "check_pse_schedule"]

# ----------------------------------------------------------------------------- paint
#: mass-assignment schemes -> order (cells touched per axis): nearest grid point, cloud
#: in cell, triangular-shaped cloud, piecewise cubic spline
SCHEMES = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}
#: the scheme of ``paint`` and ``power_spectrum`` (and of their commands)
SCHEME_DEFAULT = "cic"
#: cells per side of ``cosmo-dask density`` and ``cosmo-dask power`` (the Python
#: functions take ``n_mesh`` without a default)
CLI_N_MESH_DEFAULT = 256
#: fan-in of the sums of a slab's partial deposits (``split_every`` of ``paint``)
SPLIT_EVERY_DEFAULT = 8

# ----------------------------------------------------------------------------- PSE
#: scheduling of the PSE leaf deposits (:mod:`cosmo_dask.density.pse_schedule`)
STRATEGIES = ("auto", "gather", "reduce")
#: cells per side of a leaf patch (a power of two)
PATCH_SIZE_DEFAULT = 32
#: the deepest octree level allowed
MAX_LEVEL_MAX = 20
#: Lagrangian sub-block side in cells (ADECO: 8)
BLOCK_DEFAULT = 8
#: "reduce": partial patches a group may hold, and the fan-in of the summation tree
MAX_PARTIALS_DEFAULT = 16
PSE_SPLIT_EVERY_DEFAULT = 4


def check_n_mesh(n_mesh: Any, what: str) -> int:
    """``n_mesh`` checked for the mesh path: :func:`cosmo_dask.spatial.fft.check_mesh_size`
    (a positive integer up to 4096, prime factors 2, 3, 5, 7)."""
    from ..spatial.fft import check_mesh_size  # spatial loads dask.array

    return check_mesh_size(n_mesh, what)


def check_scheme(scheme: Any, what: str) -> str:
    """A scheme name out of :data:`SCHEMES` (any case), lower-cased, else a
    ParameterError prefixed by ``what``."""
    if not isinstance(scheme, str) or scheme.lower() not in SCHEMES:
        raise ParameterError(f"{what}: scheme must be one of {', '.join(SCHEMES)}, "
                             f"got {scheme!r}")
    return scheme.lower()


def check_box_size(box: Any, what: str) -> float:
    """The side of a periodic cube: a finite number > 0, else a ParameterError."""
    try:
        value = float(box)
    except (TypeError, ValueError):
        raise ParameterError(f"{what}: box_size must be a positive number, got {box!r}") \
            from None
    if not (math.isfinite(value) and value > 0):
        raise ParameterError(f"{what}: box_size must be a positive number, got {box!r}")
    return value


def check_split_every(split_every: Any, what: str) -> int:
    """``split_every`` of the mesh path: None (:data:`SPLIT_EVERY_DEFAULT`) or an integer
    >= 2, else a ParameterError."""
    if split_every is None:
        return SPLIT_EVERY_DEFAULT
    return check_integer(split_every, f"{what}: split_every", 2)


def check_block(block: Any, shape: Any = None) -> int:
    """The Lagrangian sub-block side: a positive integer, and with the Lagrangian mesh's
    ``shape`` at most its longest side, else a ParameterError."""
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1:
        raise ParameterError(f"block must be a positive integer, got {block!r}")
    if shape is not None and block > max(int(s) for s in shape):
        raise ParameterError(f"block must be at most {max(int(s) for s in shape)}, the "
                             f"Lagrangian mesh's side, got {block}")
    return int(block)


def check_octree_params(patch_size, max_level=None, max_tets_per_node=None, *,
                        default_max_level=None):
    """Validated ``(patch_size, max_level, max_tets_per_node)`` (ParameterError otherwise).

    ``max_level=None`` takes ``default_max_level(patch_size)`` (a callable, given by the
    caller that knows the Lagrangian mesh); ``max_tets_per_node=None`` takes
    ``patch_size^3``. Each parameter is checked here once.
    """
    if (isinstance(patch_size, bool) or not isinstance(patch_size, numbers.Integral)
            or patch_size < 1 or patch_size & (patch_size - 1)):
        raise ParameterError(f"patch_size must be a power of two, got {patch_size!r}")
    if max_level is None and default_max_level is not None:
        max_level = default_max_level(int(patch_size))
    if max_tets_per_node is None:
        max_tets_per_node = float(patch_size) ** 3
    if (isinstance(max_level, bool) or not isinstance(max_level, numbers.Integral)
            or not 0 <= max_level <= MAX_LEVEL_MAX):
        raise ParameterError(f"max_level must be an integer in [0, {MAX_LEVEL_MAX}], "
                             f"got {max_level!r}")
    try:
        mt = float(max_tets_per_node)
    except (TypeError, ValueError):
        mt = float("nan")
    if not mt > 0:
        raise ParameterError(f"max_tets_per_node must be positive, got {max_tets_per_node!r}")
    return int(patch_size), int(max_level), mt


def check_strategy(strategy: Any) -> str:
    """A PSE strategy out of :data:`STRATEGIES`, else a ParameterError."""
    if strategy not in STRATEGIES:
        raise ParameterError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def check_pse_schedule(strategy: Any, max_partials: Any,
                       split_every: Any) -> tuple[str, int, int]:
    """``pse_density``'s schedule: the strategy, and the "reduce" tree's ``max_partials``
    (>= 1) and ``split_every`` (>= 2), else a ParameterError. (The block side is checked
    by :func:`~cosmo_dask.density.tessellation.block_columns`, :func:`check_block`.)"""
    return (check_strategy(strategy), check_integer(max_partials, "max_partials", 1),
            check_integer(split_every, "split_every", 2))
