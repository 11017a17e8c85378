"""The density octree's data model: :class:`DensityOctree` (the result of the
phase-space-element density on an adaptive octree).

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

The class holds the model (the tiling, its index and the leaves). Its products live
beside it: :mod:`.octree_sampling` (``sample``, ``to_uniform``), :mod:`.octree_store`
(the Zarr store behind ``to_zarr`` and :func:`open_density_octree`) and
:mod:`cosmo_dask.plot.density` (``plot_slice``); the methods of the class call them. Those
modules never import this one, so the imports go one way (no cycle).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import dask.array as da
import numpy as np

from ..core.backend import array_module, host
from ..core.checks import check_positive
from ..core.errors import ParameterError
from ..core.progress import compute
from ..units import QUANTITIES
from ..units.products import product_units

_MAX_BITS = 52  # level + log2(patch_size): cell indices stay exact in float64


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
        :func:`~cosmo_dask.units.products.product_units` of :attr:`units`."""
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

    # ------------------------------------------------------------------ lookups (for the products)
    def row_blocks(self):
        """Patches with one chunk over the patch axes: (chunk start offsets, the array);
        chunk ``c`` is ``(x.name, c, 0, 0, 0)``."""
        x = self.patches
        if any(len(c) > 1 for c in x.chunks[1:]):
            x = x.rechunk({1: -1, 2: -1, 3: -1})
        starts = np.concatenate([[0], np.cumsum(x.chunks[0])[:-1]]).astype(np.int64)
        return starts, x

    def locate(self, points: np.ndarray):
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
        """Density at points (the patch cell containing each point): see
        :func:`~cosmo_dask.density.octree_sampling.sample`."""
        from .octree_sampling import sample

        return sample(self, points)

    def to_uniform(self, n: int, *, chunks=None):
        """Mass-conserving average of the density on a uniform ``n^3`` grid over the
        root (an ``xarray.DataArray``): see
        :func:`~cosmo_dask.density.octree_sampling.to_uniform`."""
        from .octree_sampling import to_uniform

        return to_uniform(self, n, chunks=chunks)

    def to_zarr(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the tree atomically as a Zarr v3 store; returns the path written. See
        :func:`~cosmo_dask.density.octree_store.write_density_octree`."""
        from .octree_store import write_density_octree

        return write_density_octree(self, path, overwrite=overwrite)

    def plot_slice(self, *, axis: int = 2, position: float | None = None,
                   resolution: int | None = None, leaf_edges: bool = True, path=None, ax=None):
        """Image of log10 density on the plane ``x[axis] = position`` (a matplotlib
        Figure): see :func:`~cosmo_dask.plot.density.plot_slice`."""
        from ..plot.density import plot_slice

        return plot_slice(self, axis=axis, position=position, resolution=resolution,
                          leaf_edges=leaf_edges, path=path, ax=ax)


def open_density_octree(path: str | os.PathLike) -> DensityOctree:
    """Open a store written by :meth:`DensityOctree.to_zarr` (patches as lazy dask arrays).

    Raises
    ------
    SnapshotError
        When ``path`` holds no Zarr group, not a density-octree store, an
        unsupported format version, or a malformed one.
    """
    from .octree_store import malformed, read_density_octree

    fields = read_density_octree(path)
    try:
        return DensityOctree(**fields)
    except (KeyError, TypeError, ValueError) as exc:  # ParameterError is a ValueError
        raise malformed(path, exc) from exc
