"""``pse_density``: the phase-space-element density of a snapshot on an adaptive octree.

Pipeline (Kaehler's ADECO on Dask):

1. :func:`~.tessellation.block_columns`: Lagrangian sub-blocks of ``block^3``
   cells, held in persisted columns (one dask key per column of blocks), and
   every block's bounding box.
2. :func:`~.pse_octree.build_octree`: refine while the estimated tetrahedra
   per node exceed ``max_tets_per_node``, down to ``max_level``; every leaf
   gets a ``patch_size^3`` patch.
3. :mod:`~.pse_schedule`: the deposit as a Dask graph, strategy "gather" (one
   task per leaf, blocks moved to it) or "reduce" (partial patches per worker,
   summed by a tree).
4. The result is a :class:`~.octree_model.DensityOctree`, with its patches
   persisted (in worker memory under a distributed client).
"""

from __future__ import annotations

import math

import dask
import numpy as np

from ..core.backend import array_module
from ..core.errors import ParameterError
from ..core.progress import active_client, wait
from .octree_model import DensityOctree
from .parameters import (
    BLOCK_DEFAULT,
    MAX_PARTIALS_DEFAULT,
    PATCH_SIZE_DEFAULT,
    PSE_SPLIT_EVERY_DEFAULT,
    STRATEGIES,
    check_octree_params,
    check_pse_schedule,
)
from .pse_octree import build_octree, default_root
from .pse_schedule import choose_strategy, gather_graph, leaf_items, reduce_graph
from .tessellation import _lagrangian, block_columns

__all__ = ["pse_density", "check_parameters", "default_max_level", "column_workers",
           "STRATEGIES"]


def default_max_level(lagrangian_shape, patch_size: int) -> int:
    """Depth at which the finest cells are half the mean Lagrangian spacing.

    ``patch_size * 2**max_level >= 2 * max(lagrangian_shape)``: a 128^3 snapshot
    with 32^3 patches gets ``max_level = 3``, a 256^3-effective finest level.
    """
    want = 2 * max(int(s) for s in lagrangian_shape) / patch_size
    return max(0, math.ceil(math.log2(want))) if want > 1 else 0


def _root(root):
    """The root cube ``(lo (3,), side)`` given by the caller, checked."""
    try:
        lo, size = root
        lo = np.asarray(lo, np.float64).reshape(3)
        size = float(size)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"root must be None or (lower corner (3,), side), got {root!r}") \
            from exc
    if not (np.all(np.isfinite(lo)) and size > 0 and np.isfinite(size)):
        raise ParameterError(f"root must have a finite corner and a positive side, got {root!r}")
    return lo, size


def column_workers(values):
    """Worker address holding each persisted column, or None without a distributed client.

    Also None when some column has no holder after three tries (a worker was lost
    between the wait and the query, and the scheduler is computing its columns again):
    the tasks are then placed by the scheduler, as without a client."""
    client = active_client(*values)
    if client is None:
        return None
    from distributed import futures_of

    futures = futures_of(values)
    for _ in range(3):
        wait(*values)  # a failed column raises here, before any deposit is built
        where = client.who_has(futures)
        if all(where.get(v.key) for v in values):
            return [sorted(where[v.key])[0] for v in values]
    return None


def check_parameters(snap, *, patch_size: int = PATCH_SIZE_DEFAULT,
                     max_level: int | None = None, max_tets_per_node: float | None = None,
                     strategy: str = STRATEGIES[0], root=None,
                     max_partials: int = MAX_PARTIALS_DEFAULT,
                     split_every: int = PSE_SPLIT_EVERY_DEFAULT) -> tuple:
    """Check :func:`pse_density`'s parameters (:mod:`cosmo_dask.density.parameters`),
    reading no particle data (the snapshot's ids and ``lagrangian_shape`` are metadata).
    Returns ``(lagrangian_shape, box, patch_size, max_level, max_tets_per_node, root)``
    with the defaults filled in (``root`` None or ``(lo, side)``); ParameterError or
    SnapshotError otherwise."""
    shape, box = _lagrangian(snap)
    p, max_level, max_tets = check_octree_params(
        patch_size, max_level, max_tets_per_node,
        default_max_level=lambda patch: default_max_level(shape, patch))
    check_pse_schedule(strategy, max_partials, split_every)
    return shape, box, p, max_level, max_tets, None if root is None else _root(root)


def pse_density(snap, *, patch_size: int = PATCH_SIZE_DEFAULT, max_level: int | None = None,
                max_tets_per_node: float | None = None, strategy: str = STRATEGIES[0],
                root=None, block: int = BLOCK_DEFAULT, max_partials: int = MAX_PARTIALS_DEFAULT,
                split_every: int = PSE_SPLIT_EVERY_DEFAULT,
                n_groups: int | None = None) -> DensityOctree:
    """Density from the phase-space sheet: exact tetrahedron deposits on an adaptive octree.

    Parameters
    ----------
    snap : Snapshot
        With ``ids`` (a permutation of ``0 .. N-1``) and ``lagrangian_shape``;
        periodic (``box_size``) or isolated. NumPy or CuPy chunks: with CuPy the
        tetrahedra are built and deposited on the GPU.
    patch_size : int
        Cells per side of every leaf patch (a power of two).
    max_level : int, optional
        Deepest octree level. Default :func:`default_max_level`: the finest
        cells are half the mean Lagrangian spacing.
    max_tets_per_node : float, optional
        A node is refined while more tetrahedra overlap it (estimated from the
        sub-blocks' bounding boxes). Default ``patch_size**3``: about one
        tetrahedron per patch cell.
    strategy : {"auto", "gather", "reduce"}
        Scheduling (see :mod:`cosmo_dask.density.pse_schedule`); "auto" takes the
        one with fewer estimated bytes moved (:func:`~.pse_schedule.choose_strategy`).
    root : None or (lo (3,), side)
        The root cube; None: the periodic box, or the bounding cube of all
        tetrahedra for an isolated snapshot. Mass outside the root is dropped.
    block : int
        Lagrangian sub-block side in cells (ADECO: 8).
    max_partials : int
        "reduce": partial patches a group may hold before its oldest leaf is summed.
    split_every : int
        "reduce": fan-in of the summation tree.
    n_groups : int, optional
        "reduce" without a distributed client: how many groups of columns
        stand in for workers (default: dask's CPU count).

    Returns
    -------
    DensityOctree
        Leaves tiling the root, each a ``patch_size^3`` density patch (mass per
        unit volume, float64). ``attrs`` records the strategy, the estimates
        behind "auto", and the tetrahedra count.

    Raises
    ------
    SnapshotError
        No ids or ``lagrangian_shape``, ids that are not a permutation.
    ParameterError
        Bad ``patch_size``, ``max_level``, ``max_tets_per_node``, ``strategy``,
        ``root``, ``block``, ``max_partials`` or ``split_every``.
    """
    shape, box, p, max_level, max_tets, root = check_parameters(
        snap, patch_size=patch_size, max_level=max_level, max_tets_per_node=max_tets_per_node,
        strategy=strategy, root=root, max_partials=max_partials, split_every=split_every)
    gpu = array_module(snap.pos) is not np
    cols = block_columns(snap, block)  # checks block
    root_lo, root_size = default_root(cols.blocks.lo, cols.blocks.hi, box) if root is None \
        else root
    layout = build_octree(cols.blocks, root_lo=root_lo, root_size=root_size, box_size=box,
                          max_level=max_level, max_tets_per_node=max_tets)
    workers = column_workers(cols.values)
    items = leaf_items(layout, cols)
    chosen, estimate = choose_strategy(cols, items, p, workers)
    if strategy != "auto":
        chosen = strategy
    # every input of the deposit tasks: the columns (their keys hash the particles and
    # masses), the particle mass, the tree and the schedule
    token = dask.base.tokenize([v.key for v in cols.values], cols.particle_mass, box, p,
                               max_level, max_tets, chosen, root_lo, root_size, block, gpu,
                               workers, n_groups, max_partials, split_every)[:12]
    if chosen == "gather":
        patches = gather_graph(cols, layout, items, p, workers, token, gpu=gpu)
    else:
        patches = reduce_graph(cols, layout, items, p, workers, token,
                              n_groups=dask.system.CPU_COUNT if n_groups is None else n_groups,
                              max_partials=max_partials, split_every=split_every, gpu=gpu)
    attrs = {"strategy": chosen, "strategy_asked": strategy,
             "estimated_bytes_moved": estimate, "n_tets": int(cols.blocks.n_tets.sum()),
             "block": cols.blocks.block, "max_level": max_level,
             "max_tets_per_node": max_tets, "lagrangian_shape": list(shape)}
    return DensityOctree(root_lo, root_size, p, layout.level, layout.origin, patches,
                         box_size=box, attrs=attrs, units=snap.units)

