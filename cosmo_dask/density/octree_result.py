"""The result of the phase-space-element density on an adaptive octree: :class:`DensityOctree`.

Data model
----------
The root cube ``[root_lo, root_lo + root_size)^3`` is tiled exactly (disjoint
leaves whose union is the root) by octree leaves. Leaf ``i`` is the node at
depth ``level[i]`` with integer index ``origin[i]`` in ``[0, 2**level)^3``; it
covers ``root_lo + origin * s + [0, s]^3`` with ``s = root_size / 2**level``
and carries a ``p^3`` patch (``p = patch_size``, a power of two) of DENSITY
(mass / volume): patch cell ``(a, b, c)`` covers ``leaf_lo + (a, b, c) h +
[0, h]^3`` with ``h = s / p``. ``patches`` is a dask array ``(L, p, p, p)``
float64 (NumPy or CuPy chunks; what is returned to the user is NumPy).
Cells are half-open, ``[lo, lo + h)``; for an isolated tree (``box_size`` is
None) the root's upper faces belong to the root too. With a periodic
``box_size`` points are wrapped into ``[0, box_size)^3`` first.

Store layout
------------
``OUT.zarr`` (Zarr v3 group, written atomically; a "multiscale" layout, one
subgroup per level present)::

    OUT.zarr/
      zarr.json        attrs: format="cosmo_dask.density_octree", format_version=1,
                       root_lo [3], root_size, patch_size, box_size (null: isolated),
                       levels [present levels], n_leaves, attrs (provenance dict),
                       units {length, velocity, mass} (the snapshot's), root_lo_units,
                       root_size_units, box_size_units, density_units
      level_{l}/       attrs: level, n_leaves, leaf_size, cell_size, leaf_size_units,
                       cell_size_units
        origin   (n_l, 3)        int64, the integer node indices at level l (units "1")
        density  (n_l, p, p, p)  float64, chunks (1, p, p, p) (units: mass / length^3)

Units (attribute ``units`` of each array, ``*_units`` of each attribute) come
from :func:`~cosmo_dask.product_units.product_units` of the tree's ``units``.

Leaves are stored grouped by level (in their order within a level), so a tree
re-opened with :func:`open_density_octree` lists its leaves level by level.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import dask
import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from ..atomic import atomic_directory, local_path
from ..backend import array_module, host
from ..checks import check_positive
from ..errors import ParameterError, SnapshotError
from ..product_units import product_units, store_units
from ..progress import compute
from ..task_graph import TaskGraph
from ..units import QUANTITIES
from ..zarr_read import open_product_group
from ..zarr_write import plain_attrs, store_arrays

FORMAT = "cosmo_dask.density_octree"
FORMAT_VERSION = 1

_MAX_BITS = 52  # level + log2(patch_size): cell indices stay exact in float64
_TASK_ELEMENTS = 2**22  # float64 elements (32 MiB) per default uniform slab / batch


class Leaf(NamedTuple):
    """One octree leaf: its node, corner, cell size and (lazy) density patch."""

    level: int
    origin: tuple[int, int, int]
    lo: tuple[float, float, float]
    cell_size: float
    patch: da.Array


def _row_keys(idx: np.ndarray) -> np.ndarray:
    """Rows of non-negative int64 triples as one sortable/searchable key each (void bytes)."""
    return np.ascontiguousarray(idx, dtype=">i8").reshape(-1, 3).view("V24").ravel()


class DensityOctree:
    """A density field on an adaptive octree of ``p^3`` grid patches.

    Parameters
    ----------
    root_lo : array_like, shape (3,)
        Lower corner of the root cube.
    root_size : float
        Side of the root cube (> 0).
    patch_size : int
        Cells per leaf side ``p``, a power of two.
    level : array_like of int, shape (L,)
        Depth of each leaf (0 is the root).
    origin : array_like of int, shape (L, 3)
        Integer node index of each leaf, in ``[0, 2**level)``.
    patches : dask.array.Array or array, shape (L, p, p, p)
        Density (mass / volume) of every patch cell; any chunking, NumPy or
        CuPy chunks. Non-dask input is wrapped in chunks of one leaf.
    box_size : float, optional
        Periodic box ``[0, box_size)^3`` the root lies in; None (default) for
        an isolated region.
    attrs : dict, optional
        Provenance (strategy, counts, ...), written by :meth:`to_zarr`.
    units : mapping, optional
        The units ``{length, velocity, mass}`` of the snapshot the density came
        from: lengths (``root_lo``, sizes, sample points) in its length unit,
        densities in its mass / length^3 (see :attr:`unit_strings`). None: the
        "input length" / "input mass" labels.

    Raises
    ------
    ParameterError
        For wrong shapes or types, a patch size that is not a power of two,
        node indices out of range, or leaves that do not tile the root
        exactly (overlaps or gaps; checked exactly with integer arithmetic).
    """

    def __init__(self, root_lo, root_size, patch_size, level, origin, patches, *,
                 box_size=None, attrs=None, units: Mapping[str, str] | None = None):
        root_lo = np.asarray(root_lo, dtype=np.float64)
        if root_lo.shape != (3,) or not np.all(np.isfinite(root_lo)):
            raise ParameterError(f"DensityOctree: root_lo must be 3 finite numbers, "
                                 f"got {root_lo!r}")
        root_size = check_positive(root_size, "DensityOctree: root_size")
        if isinstance(patch_size, bool) or not isinstance(patch_size, (int, np.integer)):
            raise ParameterError(f"DensityOctree: patch_size must be an int, got {patch_size!r}")
        p = int(patch_size)
        if p < 1 or p & (p - 1):
            raise ParameterError(f"DensityOctree: patch_size must be a power of two, got {p}")
        if box_size is not None:
            box_size = check_positive(box_size, "DensityOctree: box_size")
            tol = 1e-12 * box_size
            if np.any(root_lo < -tol) or np.any(root_lo + root_size > box_size + tol):
                raise ParameterError(f"DensityOctree: the root cube {root_lo.tolist()} + "
                                     f"{root_size} must lie inside the periodic box "
                                     f"[0, {box_size}]^3")

        level = np.asarray(level)
        origin = np.asarray(origin)
        if level.ndim != 1 or not (level.dtype.kind in "iu" or level.size == 0):
            raise ParameterError(f"DensityOctree: level must be a 1-D integer array, got "
                                 f"shape {level.shape} dtype {level.dtype}")
        n_leaves = level.shape[0]
        if n_leaves == 0:
            raise ParameterError("DensityOctree: no leaves (the leaves must tile the root)")
        if origin.shape != (n_leaves, 3) or origin.dtype.kind not in "iu":
            raise ParameterError(f"DensityOctree: origin must be an integer array of shape "
                                 f"({n_leaves}, 3), got shape {origin.shape} dtype {origin.dtype}")
        log2p = p.bit_length() - 1
        if level.min() < 0 or int(level.max()) + log2p > _MAX_BITS:
            raise ParameterError(f"DensityOctree: levels must be in [0, {_MAX_BITS - log2p}] "
                                 f"for patch_size {p}, got {int(level.min())}..{int(level.max())}")
        level = level.astype(np.int64)
        origin = origin.astype(np.int64)
        if np.any(origin < 0) or np.any(origin >= (np.int64(1) << level)[:, None]):
            bad = int(np.flatnonzero(np.any((origin < 0)
                                            | (origin >= (np.int64(1) << level)[:, None]), 1))[0])
            raise ParameterError(f"DensityOctree: leaf {bad} has origin {origin[bad].tolist()} "
                                 f"outside [0, 2**{level[bad]}) at its level")

        if not isinstance(patches, da.Array):
            if not hasattr(patches, "shape") or not hasattr(patches, "dtype"):
                patches = np.asarray(patches)
            if patches.ndim == 4:
                patches = da.from_array(patches, chunks=(1, p, p, p), asarray=False)
        if patches.shape != (n_leaves, p, p, p):
            raise ParameterError(f"DensityOctree: patches must have shape ({n_leaves}, {p}, {p}, "
                                 f"{p}), got {patches.shape}")
        if patches.dtype.kind not in "fiu":
            raise ParameterError(f"DensityOctree: patches must be real numbers, got dtype "
                                 f"{patches.dtype}")
        if patches.dtype != np.float64:
            patches = patches.astype(np.float64)
        if attrs is not None and not isinstance(attrs, dict):
            raise ParameterError(f"DensityOctree: attrs must be a dict or None, got {attrs!r}")

        self.root_lo = root_lo
        self.root_size = root_size
        self.patch_size = p
        self.level = level
        self.origin = origin
        self.patches = patches
        self.box_size = box_size
        self.attrs = dict(attrs or {})
        self.units = None if units is None else {q: str(units[q]) for q in QUANTITIES
                                                 if q in units}
        self._log2p = log2p
        self._index = self._build_index()
        self._check_tiling()

    # ------------------------------------------------------------------ structure
    def _build_index(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per level present: (sorted node keys, leaf ids in that order)."""
        index = {}
        for lev in np.unique(self.level):
            ids = np.flatnonzero(self.level == lev)
            keys = _row_keys(self.origin[ids])
            order = np.argsort(keys, kind="stable")
            index[int(lev)] = (keys[order], ids[order])
        return index

    def _find(self, lev: int, nodes: np.ndarray) -> np.ndarray:
        """Leaf id of each node ``(m, 3)`` at level ``lev``, -1 where it is not a leaf."""
        keys, ids = self._index[lev]
        query = _row_keys(nodes)
        pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
        return np.where(keys[pos] == query, ids[pos], -1)

    def _check_tiling(self) -> None:
        """Exact: no duplicate node, no leaf inside another, total volume = root volume."""
        levels = sorted(self._index)
        for lev in levels:
            keys, ids = self._index[lev]
            dup = np.flatnonzero(keys[1:] == keys[:-1])
            if dup.size:
                i, j = ids[dup[0]], ids[dup[0] + 1]
                raise ParameterError(f"DensityOctree: leaves {i} and {j} are the same node "
                                     f"(level {lev}, origin {self.origin[i].tolist()})")
        for k, lev in enumerate(levels):
            ids = self._index[lev][1]
            for coarse in levels[:k]:
                hit = self._find(coarse, self.origin[ids] >> (lev - coarse))
                if np.any(hit >= 0):
                    j = int(np.flatnonzero(hit >= 0)[0])
                    raise ParameterError(
                        f"DensityOctree: leaf {ids[j]} (level {lev}, origin "
                        f"{self.origin[ids[j]].tolist()}) lies inside leaf {hit[j]} (level "
                        f"{coarse}, origin {self.origin[hit[j]].tolist()}); leaves must not "
                        "overlap")
        top = levels[-1]
        volume = sum(len(self._index[lev][1]) * 8 ** (top - lev) for lev in levels)
        if volume != 8**top:
            raise ParameterError(
                f"DensityOctree: the leaves cover {volume / 8**top:.6g} of the root volume; "
                "they must tile the root exactly (gaps found)")

    # ------------------------------------------------------------------ properties
    @property
    def unit_strings(self) -> dict[str, str]:
        """Unit strings of the tree's quantities (``length``, ``density``, ...):
        :func:`~cosmo_dask.product_units.product_units` of :attr:`units`."""
        return product_units(self.units)

    @property
    def n_leaves(self) -> int:
        """Number of leaves ``L``."""
        return int(self.level.shape[0])

    @property
    def leaf_size(self) -> np.ndarray:
        """(L,) side of each leaf cube."""
        return self.root_size / 2.0**self.level

    @property
    def cell_size(self) -> np.ndarray:
        """(L,) side of each leaf's patch cells."""
        return self.leaf_size / self.patch_size

    @property
    def leaf_lo(self) -> np.ndarray:
        """(L, 3) lower corner of each leaf."""
        return self.root_lo + self.origin * self.leaf_size[:, None]

    @property
    def max_level(self) -> int:
        """Deepest level present."""
        return int(self.level.max())

    @property
    def effective_resolution(self) -> int:
        """Cells per root side at the finest level: ``patch_size * 2**max_level``."""
        return self.patch_size << self.max_level

    @property
    def levels(self) -> dict[int, int]:
        """``{level: number of leaves}`` for the levels present."""
        return {lev: len(ids) for lev, (_, ids) in sorted(self._index.items())}

    def leaf(self, i: int) -> Leaf:
        """Leaf ``i`` as a :class:`Leaf` (its patch stays lazy)."""
        i = int(i)
        if not -self.n_leaves <= i < self.n_leaves:
            raise ParameterError(f"DensityOctree.leaf: index {i} out of range for "
                                 f"{self.n_leaves} leaves")
        i %= self.n_leaves
        return Leaf(int(self.level[i]), tuple(int(v) for v in self.origin[i]),
                    tuple(float(v) for v in self.leaf_lo[i]), float(self.cell_size[i]),
                    self.patches[i])

    @property
    def leaves(self) -> Iterator[Leaf]:
        """Iterator over all leaves, as :class:`Leaf` tuples, in order."""
        return (self.leaf(i) for i in range(self.n_leaves))

    def __repr__(self) -> str:
        hist = ", ".join(f"{lev}: {n}" for lev, n in self.levels.items())
        where = "isolated" if self.box_size is None else f"periodic box {self.box_size:g}"
        return (f"<DensityOctree {self.n_leaves} leaves of {self.patch_size}^3 cells, "
                f"levels {{{hist}}}, effective resolution {self.effective_resolution}^3, "
                f"root {self.root_lo.tolist()} + {self.root_size:g}, {where}>")

    # ------------------------------------------------------------------ helpers
    def _row_blocks(self):
        """Patches with one chunk over the patch axes: (chunk start offsets, the array);
        chunk ``c`` is ``(x.name, c, 0, 0, 0)``."""
        x = self.patches
        if any(len(c) > 1 for c in x.chunks[1:]):
            x = x.rechunk({1: -1, 2: -1, 3: -1})
        starts = np.concatenate([[0], np.cumsum(x.chunks[0])[:-1]]).astype(np.int64)
        return starts, x

    def _locate(self, points: np.ndarray):
        """``(leaf, cell)``: leaf id (-1 outside the root) and patch cell ``(n, 3)`` of points."""
        x = np.array(points, dtype=np.float64)
        hi = self.root_lo + self.root_size
        if self.box_size is not None:
            with np.errstate(invalid="ignore"):  # non-finite points stay NaN (outside)
                x = np.mod(x, self.box_size)
            x[x >= self.box_size] = 0.0  # np.mod may round up to the box size
            inside = np.all((x >= self.root_lo) & (x < hi), axis=1)
        else:
            inside = np.all((x >= self.root_lo) & (x <= hi), axis=1)
        leaf = np.full(len(x), -1, dtype=np.int64)
        cell = np.zeros((len(x), 3), dtype=np.int64)
        todo = np.flatnonzero(inside)
        u = (x[todo] - self.root_lo) / self.root_size
        for lev in sorted(self._index):
            if todo.size == 0:
                break
            res = self.patch_size << lev
            g = np.clip(np.floor(u * res), 0, res - 1).astype(np.int64)
            hit = self._find(lev, g >> self._log2p)
            found = hit >= 0
            leaf[todo[found]] = hit[found]
            cell[todo[found]] = g[found] - self.origin[hit[found]] * self.patch_size
            todo, u = todo[~found], u[~found]
        return leaf, cell

    # ------------------------------------------------------------------ products
    def total_mass(self) -> float:
        """Total mass: sum of density times cell volume over all leaves (one dask compute),
        in ``unit_strings["mass"]``."""
        sums = self.patches.sum(axis=(1, 2, 3))
        if array_module(sums) is not np:
            sums = sums.map_blocks(host, dtype=np.float64, meta=np.empty((0,), np.float64))
        (per_leaf,) = compute(sums, label="octree total mass")
        return float(np.dot(np.asarray(per_leaf, dtype=np.float64), self.cell_size**3))

    def sample(self, points) -> np.ndarray:
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
        leaf, cell = self._locate(pts)
        values = np.full(len(pts), np.nan)
        sel = np.flatnonzero(leaf >= 0)
        if sel.size == 0:
            return values
        starts, x = self._row_blocks()
        chunk = np.searchsorted(starts, leaf[sel], side="right") - 1
        order = np.argsort(chunk, kind="stable")
        sel, chunk = sel[order], chunk[order]
        used, first = np.unique(chunk, return_index=True)
        bounds = np.append(first, len(sel))
        per_task = max(1, _TASK_ELEMENTS // (max(self.patches.chunks[0]) * self.patch_size**3))
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

    def to_uniform(self, n: int, *, chunks=None):
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
        scale = 2.0 ** -self.level.astype(np.float64)
        leaf_lo = self.origin * scale[:, None]
        leaf_hi = (self.origin + 1) * scale[:, None]
        bounds = [np.concatenate([[0], np.cumsum(c)]) for c in chunks]
        # masks[d][b]: leaves overlapping block b along axis d with positive length
        masks = [[(leaf_lo[:, d] < edges[b[k + 1]]) & (leaf_hi[:, d] > edges[b[k]])
                  for k in range(len(b) - 1)] for d, b in enumerate(bounds)]
        starts, x = self._row_blocks()
        chunk_of = np.searchsorted(starts, np.arange(self.n_leaves), side="right") - 1
        g = TaskGraph([x])
        name = f"octree-uniform-{tokenize(x.name, n, chunks, self.level, self.origin)}"
        for i, mx in enumerate(masks[0]):
            for j, my in enumerate(masks[1]):
                mxy = mx & my
                for k, mz in enumerate(masks[2]):
                    ids = np.flatnonzero(mxy & mz)
                    used, arg = np.unique(chunk_of[ids], return_inverse=True)
                    spec = np.column_stack([arg, ids - starts[chunk_of[ids]],
                                            self.level[ids], self.origin[ids]])
                    lo = np.array([bounds[0][i], bounds[1][j], bounds[2][k]])
                    hi = np.array([bounds[0][i + 1], bounds[1][j + 1], bounds[2][k + 1]])
                    g.add((name, i, j, k), _uniform_block, n, lo, hi, self.patch_size, spec,
                          *[g.chunk(x, c, 0, 0, 0) for c in used])
        data = g.array(name, chunks, np.empty((0, 0, 0), np.float64))
        h = self.root_size / n
        pu = self.unit_strings
        coords = {name: (name, self.root_lo[d] + (np.arange(n) + 0.5) * h,
                         {"units": pu["length"]}) for d, name in enumerate("xyz")}
        attrs = {"units": pu["density"],
                 "long_name": "mass-conserving average of the octree density over each "
                              "uniform cell",
                 "n": n, "cell_size": h, "root_lo": self.root_lo.tolist(),
                 "root_size": self.root_size, "coordinates": "cell centres",
                 "length_units": pu["length"], "source": FORMAT}
        if self.box_size is not None:
            attrs["box_size"] = self.box_size
        return xr.DataArray(data, dims=("x", "y", "z"), coords=coords, attrs=attrs,
                            name="density")

    # ------------------------------------------------------------------ store
    def to_zarr(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the tree atomically as a Zarr v3 store (layout in the module docstring).

        Returns the path written. Raises ``SnapshotError`` for an existing
        ``path`` without ``overwrite=True``; a failed write leaves nothing.
        """
        provenance = plain_attrs(self.attrs)
        try:
            json.dumps(provenance)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"DensityOctree.to_zarr: attrs must be JSON-serialisable "
                                 f"({exc})") from exc
        levels = sorted(self._index)
        p = self.patch_size
        pu = self.unit_strings
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "root_lo": self.root_lo.tolist(), "root_size": self.root_size,
                "patch_size": p, "box_size": self.box_size, "levels": levels,
                "n_leaves": self.n_leaves, "attrs": provenance, "units": self.units,
                "root_lo_units": pu["length"], "root_size_units": pu["length"],
                "box_size_units": pu["length"], "density_units": pu["density"]}
        with atomic_directory(path, overwrite=overwrite, what="density octree store",
                              fmt=FORMAT, inputs=(provenance.get("source"),)) as tmp:
            group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=meta)
            sources, chunks, dims = {}, {}, {}
            for lev in levels:
                ids = np.flatnonzero(self.level == lev)
                size = self.root_size / 2.0**lev
                group.create_group(f"level_{lev}", attributes={
                    "level": lev, "n_leaves": len(ids), "leaf_size": size,
                    "cell_size": size / p, "leaf_size_units": pu["length"],
                    "cell_size_units": pu["length"]})
                rows = min(len(ids), 2**20)
                sources[f"level_{lev}/origin"] = da.from_array(
                    self.origin[ids].astype(np.int64), chunks=(rows, 3))
                chunks[f"level_{lev}/origin"] = (rows, 3)
                dims[f"level_{lev}/origin"] = ("leaf", "axis")
                src = self.patches if len(ids) == self.n_leaves else self.patches[ids]
                sources[f"level_{lev}/density"] = src.astype(np.float64)
                chunks[f"level_{lev}/density"] = (1, p, p, p)
                dims[f"level_{lev}/density"] = ("leaf", "x", "y", "z")
            store_arrays(group, sources, root=tmp, chunks=chunks, compressors="auto",
                         dims=dims, label=f"writing {path}")
            store_units(group, {name: pu["density"] if name.endswith("/density") else "1"
                                for name in sources})
        return str(local_path(path))

    # ------------------------------------------------------------------ plot
    def plot_slice(self, *, axis: int = 2, position: float | None = None,
                   resolution: int | None = None, leaf_edges: bool = True, path=None, ax=None):
        """Image of log10 density on the plane ``x[axis] = position``.

        Parameters
        ----------
        axis : {0, 1, 2}
            Normal of the plane.
        position : float, optional
            Coordinate of the plane; default the root's centre. Wrapped into
            the box for periodic trees; must lie in the root otherwise.
        resolution : int, optional
            Pixels per side; default the finest leaf-cell resolution
            (:attr:`effective_resolution`) capped at 1024.
        leaf_edges : bool
            Draw the boundaries of the leaves cut by the plane (skipped above
            20000 of them).
        path : str or path-like, optional
            Save the figure there (Agg backend when no ``ax`` is given).
        ax : matplotlib Axes, optional
            Draw into it instead of a new figure.

        Returns
        -------
        matplotlib.figure.Figure
        """
        import matplotlib

        if axis not in (0, 1, 2) or isinstance(axis, bool):
            raise ParameterError(f"DensityOctree.plot_slice: axis must be 0, 1 or 2, got {axis!r}")
        lo, size = self.root_lo, self.root_size
        if position is None:
            position = float(lo[axis] + 0.5 * size)
        position = float(position)
        if self.box_size is not None:
            position = position % self.box_size
        if not (lo[axis] <= position <= lo[axis] + size) or (
                self.box_size is not None and position >= lo[axis] + size):
            raise ParameterError(f"DensityOctree.plot_slice: position {position} is outside "
                                 f"the root [{lo[axis]}, {lo[axis] + size}) along axis {axis}")
        if resolution is None:
            resolution = min(self.effective_resolution, 1024)
        if isinstance(resolution, bool) or not isinstance(resolution, (int, np.integer)) \
                or resolution <= 0:
            raise ParameterError(f"DensityOctree.plot_slice: resolution must be a positive "
                                 f"integer, got {resolution!r}")
        res = int(resolution)
        if ax is None and path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.collections import LineCollection

        a, b = [d for d in range(3) if d != axis]
        centres = (np.arange(res) + 0.5) / res * size
        pts = np.empty((res, res, 3))
        pts[..., axis] = position
        pts[..., a] = lo[a] + centres[:, None]
        pts[..., b] = lo[b] + centres[None, :]
        dens = self.sample(pts.reshape(-1, 3)).reshape(res, res)
        with np.errstate(divide="ignore", invalid="ignore"):
            image = np.where(dens > 0, np.log10(np.where(dens > 0, dens, 1.0)), np.nan)
        fig = ax.figure if ax is not None else plt.figure(figsize=(5.5, 4.5))
        ax = ax if ax is not None else fig.add_subplot(111)
        cmap = matplotlib.colormaps["magma"].with_extremes(bad="black")
        extent = (lo[a], lo[a] + size, lo[b], lo[b] + size)
        shown = ax.imshow(image.T, origin="lower", extent=extent, cmap=cmap,
                          interpolation="nearest")
        fig.colorbar(shown, ax=ax, label="log10 density")
        leaf_lo, leaf_size = self.leaf_lo, self.leaf_size
        cut = (leaf_lo[:, axis] <= position) & (position < leaf_lo[:, axis] + leaf_size)
        if self.box_size is None and position == lo[axis] + size:
            cut = leaf_lo[:, axis] + leaf_size >= position
        ids = np.flatnonzero(cut)
        if leaf_edges and 0 < ids.size <= 20000:
            x0, y0 = leaf_lo[ids, a], leaf_lo[ids, b]
            x1, y1 = x0 + leaf_size[ids], y0 + leaf_size[ids]
            segs = np.stack([np.stack([np.column_stack([x0, y0]), np.column_stack([x1, y0])], 1),
                             np.stack([np.column_stack([x0, y0]), np.column_stack([x0, y1])], 1)],
                            1).reshape(-1, 2, 2)
            ax.add_collection(LineCollection(segs, colors="white", linewidths=0.4, alpha=0.45))
            ax.set_xlim(extent[0], extent[1])
            ax.set_ylim(extent[2], extent[3])
        names = "xyz"
        ax.set_xlabel(names[a])
        ax.set_ylabel(names[b])
        levs = self.level[ids] if ids.size else self.level
        ax.set_title(f"{names[axis]} = {position:.4g}: {ids.size} leaves, levels "
                     f"{int(levs.min())}-{int(levs.max())}")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


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


# ---------------------------------------------------------------------- open
def open_density_octree(path: str | os.PathLike) -> DensityOctree:
    """Open a store written by :meth:`DensityOctree.to_zarr` (patches as lazy dask arrays).

    Raises
    ------
    SnapshotError
        When ``path`` holds no Zarr group, not a density-octree store, an
        unsupported format version, or a malformed one.
    """
    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="density octree store")
    try:
        levels = [int(v) for v in attrs["levels"]]
        level, origin, patches = [], [], []
        for lev in levels:
            sub = group[f"level_{lev}"]
            org = np.asarray(sub["origin"][...], dtype=np.int64)
            origin.append(org)
            level.append(np.full(len(org), lev, dtype=np.int64))
            patches.append(da.from_zarr(sub["density"]))
        tree = DensityOctree(attrs["root_lo"], attrs["root_size"], int(attrs["patch_size"]),
                             np.concatenate(level), np.concatenate(origin),
                             da.concatenate(patches, axis=0), box_size=attrs.get("box_size"),
                             attrs=dict(attrs.get("attrs") or {}), units=attrs.get("units"))
    except (KeyError, TypeError, ValueError) as exc:  # ParameterError is a ValueError
        raise SnapshotError(f"{p}: malformed density octree store ({exc})") from exc
    return tree
