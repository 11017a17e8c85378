"""Sampling a :class:`~cosmo_dask.density.octree_model.DensityOctree`: its density at
points (:func:`sample`) and its mass-conserving average on a uniform grid
(:func:`to_uniform`), with their tasks (one per group of patch chunks / output chunk)."""

from __future__ import annotations

import itertools

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import host
from ..core.errors import ParameterError
from ..core.progress import compute
from ..core.task_graph import TaskGraph
from .octree_store import FORMAT

_TASK_ELEMENTS = 2**22  # float64 elements (32 MiB) per default uniform slab / batch


def sample(tree, points) -> np.ndarray:
    """Density at points (the value of the patch cell containing each point).

    Parameters
    ----------
    points : array_like, shape (n, 3) or (3,)
        Positions (NumPy, CuPy or dask). Periodic trees wrap them into the
        box first.

    Returns
    -------
    numpy.ndarray, shape (n,)
        float64 density (in ``unit_strings["density"]``); NaN for points
        outside the root (or non-finite). Only the patches containing a
        point are computed.
    """
    if dask.is_dask_collection(points):
        (points,) = compute(points, label="octree sample points")
    pts = np.asarray(host(points), dtype=np.float64)
    if pts.shape == (3,):
        pts = pts[None, :]
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise ParameterError(f"DensityOctree.sample: points must have shape (n, 3), "
                             f"got {pts.shape}")
    leaf, cell = tree.locate(pts)
    values = np.full(len(pts), np.nan)
    sel = np.flatnonzero(leaf >= 0)
    if sel.size == 0:
        return values
    starts, x = tree.row_blocks()
    chunk = np.searchsorted(starts, leaf[sel], side="right") - 1
    order = np.argsort(chunk, kind="stable")
    sel, chunk = sel[order], chunk[order]
    used, first = np.unique(chunk, return_index=True)
    bounds = np.append(first, len(sel))
    per_task = max(1, _TASK_ELEMENTS // (max(tree.patches.chunks[0]) * tree.patch_size**3))
    tasks, pieces = [], []
    for t in range(0, len(used), per_task):
        ids = range(t, min(t + per_task, len(used)))
        lo, hi = bounds[t], bounds[ids[-1] + 1]
        rows = sel[lo:hi]
        spec = np.column_stack([leaf[rows] - starts[chunk[lo:hi]], cell[rows]])
        tasks.append((bounds[t:ids[-1] + 2] - lo, spec, used[ids[0]:ids[-1] + 1]))
        pieces.append(rows)
    g = TaskGraph([x])
    name = f"octree-sample-{tokenize(x.name, tasks)}"
    results = g.compute([
        g.add((name, t), _sample_blocks, b, spec, *[g.chunk(x, c, 0, 0, 0) for c in cs]).key
        for t, (b, spec, cs) in enumerate(tasks)], label="octree sample")
    for rows, vals in zip(pieces, results, strict=True):
        values[rows] = vals
    return values


def to_uniform(tree, n: int, *, chunks=None):
    """Mass-conserving average of the density on a uniform ``n^3`` grid over the root.

    Each uniform cell gets the exact (separable, float64) overlap-weighted
    sum of the leaf cells' masses divided by its volume, so the uniform
    grid's total mass equals :meth:`total_mass` to rounding. ``n`` is any
    positive integer. Uniform cell ``i`` covers ``root_lo + [i, i + 1) H``
    with ``H = root_size / n``.

    Parameters
    ----------
    n : int
        Cells per side.
    chunks : optional
        Dask chunks of the result (anything :func:`dask.array.core.normalize_chunks`
        accepts for shape ``(n, n, n)``); default: slabs along x of about
        32 MiB. One task per output chunk gathers exactly the leaves
        overlapping it.

    Returns
    -------
    xarray.DataArray
        ``density`` (x, y, z), float64, NumPy-backed dask array, with
        cell-centre coordinates; attribute ``units`` the tree's density
        unit, the coordinates' ``units`` its length unit.
    """
    import xarray as xr

    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
        raise ParameterError(f"DensityOctree.to_uniform: n must be a positive integer, "
                             f"got {n!r}")
    n = int(n)
    if chunks is None:
        chunks = (max(1, min(n, _TASK_ELEMENTS // (n * n))), n, n)
    try:
        chunks = da.core.normalize_chunks(chunks, (n, n, n), dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise ParameterError(f"DensityOctree.to_uniform: bad chunks {chunks!r} ({exc})") \
            from exc
    edges = np.arange(n + 1, dtype=np.float64) / n  # in root units; edges[n] == 1
    scale = 2.0 ** -tree.level.astype(np.float64)
    leaf_lo = tree.origin * scale[:, None]
    leaf_hi = (tree.origin + 1) * scale[:, None]
    bounds = [np.concatenate([[0], np.cumsum(c)]) for c in chunks]
    # masks[d][b]: leaves overlapping block b along axis d with positive length
    masks = [[(leaf_lo[:, d] < edges[b[k + 1]]) & (leaf_hi[:, d] > edges[b[k]])
              for k in range(len(b) - 1)] for d, b in enumerate(bounds)]
    starts, x = tree.row_blocks()
    chunk_of = np.searchsorted(starts, np.arange(tree.n_leaves), side="right") - 1
    g = TaskGraph([x])
    name = f"octree-uniform-{tokenize(x.name, n, chunks, tree.level, tree.origin)}"
    for i, mx in enumerate(masks[0]):
        for j, my in enumerate(masks[1]):
            mxy = mx & my
            for k, mz in enumerate(masks[2]):
                ids = np.flatnonzero(mxy & mz)
                used, arg = np.unique(chunk_of[ids], return_inverse=True)
                spec = np.column_stack([arg, ids - starts[chunk_of[ids]],
                                        tree.level[ids], tree.origin[ids]])
                lo = np.array([bounds[0][i], bounds[1][j], bounds[2][k]])
                hi = np.array([bounds[0][i + 1], bounds[1][j + 1], bounds[2][k + 1]])
                g.add((name, i, j, k), _uniform_block, n, lo, hi, tree.patch_size, spec,
                      *[g.chunk(x, c, 0, 0, 0) for c in used])
    data = g.array(name, chunks, np.empty((0, 0, 0), np.float64))
    h = tree.root_size / n
    pu = tree.unit_strings
    coords = {name: (name, tree.root_lo[d] + (np.arange(n) + 0.5) * h,
                     {"units": pu["length"]}) for d, name in enumerate("xyz")}
    attrs = {"units": pu["density"],
             "long_name": "mass-conserving average of the octree density over each "
                          "uniform cell",
             "n": n, "cell_size": h, "root_lo": tree.root_lo.tolist(),
             "root_size": tree.root_size, "coordinates": "cell centres",
             "length_units": pu["length"], "source": FORMAT}
    if tree.box_size is not None:
        attrs["box_size"] = tree.box_size
    return xr.DataArray(data, dims=("x", "y", "z"), coords=coords, attrs=attrs,
                        name="density")


# ---------------------------------------------------------------------- tasks
def _sample_blocks(bounds: np.ndarray, spec: np.ndarray, *blocks) -> np.ndarray:
    """Values of ``spec`` rows ``(row in block, a, b, c)`` from patch blocks.

    Rows ``bounds[k]:bounds[k + 1]`` of ``spec`` refer to ``blocks[k]``.
    """
    out = np.empty(len(spec))
    for k, block in enumerate(blocks):
        r = spec[bounds[k]:bounds[k + 1]]
        out[bounds[k]:bounds[k + 1]] = host(block)[r[:, 0], r[:, 1], r[:, 2], r[:, 3]]
    return out


def _uniform_block(n: int, start: np.ndarray, stop: np.ndarray, p: int, spec: np.ndarray,
                   *blocks) -> np.ndarray:
    """Uniform cells ``[start, stop)`` of the ``n^3`` grid from the leaves in ``spec``.

    ``spec`` rows are ``(block arg, row in block, level, ox, oy, oz)``. Works in
    root units (root = unit cube) and returns density: the overlap-weighted sum
    of leaf densities times ``n^3`` (the inverse uniform cell volume).
    """
    edges = np.arange(n + 1, dtype=np.float64) / n
    shape = tuple(int(v) for v in stop - start)
    out = np.zeros(shape)
    data = [np.asarray(host(b), dtype=np.float64) for b in blocks]
    cells = np.arange(p)
    for lev in np.unique(spec[:, 2]):
        rows = spec[spec[:, 2] == lev]
        res = float(p << int(lev))
        if (p << int(lev)) >= n:  # leaf cells no larger than uniform cells: <= 2 per axis
            batch = max(1, _TASK_ELEMENTS // (8 * p**3))
            for s in range(0, len(rows), batch):
                _scatter_fine(out, rows[s:s + batch], data, edges, start, res, cells)
        else:  # coarse leaf cells: separable overlap matrices per leaf
            for arg, row, _, *org in rows:
                rho = data[arg][row]
                weights = []
                for d in range(3):
                    e_lo = (org[d] * p + cells) / res
                    e_hi = (org[d] * p + cells + 1) / res
                    i0 = max(int(start[d]), int(np.searchsorted(edges, e_lo[0], "right")) - 1)
                    i1 = min(int(stop[d]), int(np.searchsorted(edges, e_hi[-1], "left")))
                    if i0 >= i1:
                        break
                    w = (np.minimum(e_hi[:, None], edges[None, i0 + 1:i1 + 1])
                         - np.maximum(e_lo[:, None], edges[None, i0:i1]))
                    weights.append((i0 - int(start[d]), i1 - int(start[d]),
                                    np.maximum(w, 0.0)))
                if len(weights) < 3:
                    continue
                (ax0, ax1, wx), (ay0, ay1, wy), (az0, az1, wz) = weights
                t = np.tensordot(wx, rho, axes=(0, 0))      # (I, b, c)
                t = np.tensordot(t, wy, axes=(1, 0))        # (I, c, J)
                t = np.tensordot(t, wz, axes=(1, 0))        # (I, J, K)
                out[ax0:ax1, ay0:ay1, az0:az1] += t
    out *= float(n) ** 3
    return out


def _scatter_fine(out, rows, data, edges, start, res, cells):
    """Add leaves whose cells are at most one uniform cell wide (each meets <= 2 per axis)."""
    n = len(edges) - 1
    p = len(cells)
    rho = np.stack([data[arg][row] for arg, row in rows[:, :2]])  # (B, p, p, p)
    idx = []
    for d in range(3):
        e_lo = (rows[:, 3 + d, None] * p + cells) / res   # (B, p), exact dyadic
        e_hi = (rows[:, 3 + d, None] * p + cells + 1) / res
        i0 = np.clip(np.searchsorted(edges, e_lo, "right") - 1, 0, n - 1)
        both = []
        for shift in (0, 1):
            i = i0 + shift
            ok = i < n
            ic = np.minimum(i, n - 1)
            w = np.minimum(e_hi, edges[ic + 1]) - np.maximum(e_lo, edges[ic])
            w = np.where(ok, np.maximum(w, 0.0), 0.0)
            local = i - int(start[d])
            inside = (local >= 0) & (local < out.shape[d])
            both.append((np.where(inside, local, 0), np.where(inside, w, 0.0)))
        idx.append(both)
    ny, nz = out.shape[1], out.shape[2]
    keys, weights = [], []
    for sx, sy, sz in itertools.product((0, 1), repeat=3):
        (ix, wx), (iy, wy), (iz, wz) = idx[0][sx], idx[1][sy], idx[2][sz]
        keys.append(((ix[:, :, None, None] * ny + iy[:, None, :, None]) * nz
                     + iz[:, None, None, :]).ravel())
        weights.append((rho * wx[:, :, None, None] * wy[:, None, :, None]
                        * wz[:, None, None, :]).ravel())
    flat = out.reshape(-1)
    flat += np.bincount(np.concatenate(keys), weights=np.concatenate(weights),
                        minlength=flat.size)
