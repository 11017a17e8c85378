"""Merger trees of a simulation's halo outputs, linked by their most-bound members.

:func:`merger_tree` follows, for each pair of adjacent outputs with halos, the
``n_tracers`` most-bound members of every halo (the ranking the run stored with the
halos, :mod:`cosmo_dask.halos.members`) to the next output: a halo's descendant is the
halo there that receives most of its tracers (ties: the more massive; none when no
tracer is in a halo there).

The join on particle ids is a shuffle: one task per chunk of each output's member ids
cuts its rows into ``P`` buckets by ``id mod P`` (the progenitor side keeps only the
tracers), one task per bucket and output pair matches the tracer ids with the member ids
of the next output (a sort and a binary search, NumPy or CuPy after the chunks) and
counts each (progenitor, descendant) pair, and one small task per output pair reduces
the counts. No task holds more than one bucket of ids.

:class:`MergerTree` holds the links (an xarray Dataset), main branches (the most
massive progenitor at each earlier output by default, or the one that gave the most
tracers), mass accretion histories, a consistent-trees file for ytree
(:meth:`MergerTree.to_ytree`) and its own store (:meth:`MergerTree.to_zarr`).
:func:`correa2015_mah` is the mass accretion history fit of Correa et al. (2015,
MNRAS 450, 1514) the histories are validated against.
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr
from dask.base import tokenize

from ..core.backend import array_module, host
from ..core.errors import ParameterError, SnapshotError
from ..core.task_graph import TaskGraph
from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_dataset_store
from ..store.zarr_write import plain_attrs
from .parameters import (
    N_TRACERS_DEFAULT,
    TREE_BUCKET_ROWS,
    check_main_progenitor,
    check_n_buckets,
    check_n_tracers,
)

FORMAT = "cosmo_dask.merger_tree"
FORMAT_VERSION = 1
#: the consistent-trees file inside a merger tree store
YTREE_FILE = "trees.dat"
#: Correa et al. (2015) collapse threshold
DELTA_C = 1.686


# ----------------------------------------------------------------------------- shuffle tasks
def _halo_of_rows(row0: int, n: int, offsets: np.ndarray, xp):
    rows = xp.arange(row0, row0 + n, dtype=np.int64)
    off = xp.asarray(offsets)
    halo = xp.searchsorted(off, rows, side="right") - 1
    return halo, rows - off[halo]


def _split(ids, row0: int, offsets: np.ndarray, n_tracers: int | None, n_buckets: int):
    """One chunk of an output's member ids as ``n_buckets`` pieces ``(ids, halo)`` by
    ``id mod n_buckets``; with ``n_tracers`` only each halo's first (most-bound) rows."""
    xp = array_module(ids)
    halo, rank = _halo_of_rows(row0, int(ids.shape[0]), offsets, xp)
    if n_tracers is not None:
        keep = rank < n_tracers
        ids, halo = ids[keep], halo[keep]
    bucket = ids % n_buckets
    order = xp.argsort(bucket, kind="stable") if xp is np else xp.argsort(bucket)
    bucket, ids, halo = bucket[order], ids[order], halo[order]
    cuts = host(xp.searchsorted(bucket, xp.arange(1, n_buckets)))
    return [(ids[a:b], halo[a:b]) for a, b in zip(np.r_[0, cuts], np.r_[cuts, ids.shape[0]],
                                                  strict=True)]


def _join(n_desc: int, n_prog_pieces: int, *pieces):
    """(progenitor, descendant, count) of one bucket: tracer ids (the first
    ``n_prog_pieces`` pieces) found among the next output's member ids (the others)."""
    prog, desc = pieces[:n_prog_pieces], pieces[n_prog_pieces:]
    xp = array_module(prog[0][0])
    t_ids = xp.concatenate([p[0] for p in prog])
    t_halo = xp.concatenate([p[1] for p in prog])
    m_ids = xp.concatenate([p[0] for p in desc])
    m_halo = xp.concatenate([p[1] for p in desc])
    if t_ids.shape[0] == 0 or m_ids.shape[0] == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    order = xp.argsort(m_ids)
    m_ids, m_halo = m_ids[order], m_halo[order]
    at = xp.minimum(xp.searchsorted(m_ids, t_ids), m_ids.shape[0] - 1)
    hit = m_ids[at] == t_ids
    code = t_halo[hit] * np.int64(n_desc) + m_halo[at[hit]]
    code, count = xp.unique(code, return_counts=True)
    code, count = host(code).astype(np.int64), host(count).astype(np.int64)
    return code // n_desc, code % n_desc, count


def _links(n_prog: int, n_desc: int, desc_mass: np.ndarray, *joins):
    """Per progenitor: its descendant (most shared tracers, ties the more massive, then
    the lower index; -1 for none) and the shared count."""
    p = np.concatenate([j[0] for j in joins])
    d = np.concatenate([j[1] for j in joins])
    c = np.concatenate([j[2] for j in joins])
    code, inv = np.unique(p * np.int64(n_desc) + d, return_inverse=True)
    count = np.bincount(inv, weights=c).astype(np.int64)
    p, d = code // n_desc, code % n_desc
    desc = np.full(n_prog, -1, np.int64)
    shared = np.zeros(n_prog, np.int64)
    if p.size:
        order = np.lexsort((d, -desc_mass[d], -count, p))  # best first within progenitor
        p, d, count = p[order], d[order], count[order]
        first = np.r_[True, p[1:] != p[:-1]]
        desc[p[first]], shared[p[first]] = d[first], count[first]
    return desc, shared


# ----------------------------------------------------------------------------- the tree
@dataclass
class MergerTree:
    """Halo links between a simulation's halo outputs.

    Attributes
    ----------
    links : xarray.Dataset
        Over dim ``link`` (one per halo of every output but the last, in output then
        halo order): ``prog_output``, ``prog_redshift``, ``prog_halo``, ``desc_output``,
        ``desc_halo`` (-1: no descendant), ``shared`` (tracers found in the
        descendant), ``n_tracers`` (tracers followed: ``min(n_tracers, members)``),
        ``fraction`` (shared / n_tracers), ``prog_mass`` and ``desc_mass`` (NaN with no
        descendant); each with a ``units`` attribute.
    outputs : xarray.Dataset
        Over dim ``output`` (decreasing redshift): ``redshift``, ``scale_factor``,
        ``n_halos``, ``index`` (the simulation's output index).
    catalogs : list of xarray.Dataset
        The halo catalog of each output (``mass``, ``center_of_mass``, ...).
    parameters : dict
        ``n_tracers``, ``n_buckets``, the simulation path, box size, cosmology, units.
    """

    links: xr.Dataset
    outputs: xr.Dataset
    catalogs: list
    parameters: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ navigation
    @property
    def n_outputs(self) -> int:
        return int(self.outputs.sizes["output"])

    def descendants(self, k: int) -> np.ndarray:
        """Descendant halo (at output ``k + 1``) of every halo of output ``k``."""
        sel = self.links["prog_output"].values == k
        return self.links["desc_halo"].values[sel]

    def _main_progenitors(self, k: int, by: str) -> np.ndarray:
        """Main progenitor (at output ``k``) of every halo of output ``k + 1``; -1: none."""
        desc = self.descendants(k)
        n_desc = int(self.outputs["n_halos"].values[k + 1])
        out = np.full(n_desc, -1, np.int64)
        prog = np.flatnonzero(desc >= 0)
        if prog.size == 0:
            return out
        if by == "mass":
            key = np.asarray(self.catalogs[k]["mass"].values)[prog]
        else:
            sel = self.links["prog_output"].values == k
            key = self.links["shared"].values[sel][prog].astype(np.float64)
        order = np.lexsort((prog, -key, desc[prog]))  # per descendant: best first
        d = desc[prog][order]
        first = np.r_[True, d[1:] != d[:-1]]
        out[d[first]] = prog[order][first]
        return out

    def _branches(self, by: str) -> np.ndarray:
        """(n_outputs, n_final) halo index of each final halo's main branch; -1 where it
        ends."""
        n_out = self.n_outputs
        n_final = int(self.outputs["n_halos"].values[-1])
        out = np.full((n_out, n_final), -1, np.int64)
        out[-1] = np.arange(n_final)
        for k in range(n_out - 2, -1, -1):
            main = self._main_progenitors(k, by)
            cur = out[k + 1]
            ok = cur >= 0
            out[k, ok] = main[cur[ok]]
        return out

    def main_branch(self, halo: int, *, by: str = "mass") -> xr.Dataset:
        """The main progenitor chain of halo ``halo`` of the last output (z = 0).

        Parameters
        ----------
        halo : int
            Halo index in the last output's catalog.
        by : {"mass", "shared"}
            The main progenitor at each earlier output: among the halos whose
            descendant is the current one, the most massive (default), or the one that
            gave it the most tracers.

        Returns
        -------
        xarray.Dataset
            Over dim ``output`` (decreasing redshift): ``redshift``, ``scale_factor``,
            ``halo`` (-1 before the branch begins), ``mass`` (NaN there) and
            ``position`` (the centre of mass; NaN there), with units.
        """
        by = check_main_progenitor(by)
        n_final = int(self.outputs["n_halos"].values[-1])
        if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or not (
                0 <= halo < n_final):
            raise ParameterError(f"halo must be an index of the last output's catalog, in "
                                 f"[0, {n_final}), got {halo!r}")
        chain = self._branches(by)[:, int(halo)]
        mass = np.full(chain.size, np.nan)
        pos = np.full((chain.size, 3), np.nan)
        for k, h in enumerate(chain):
            if h >= 0:
                mass[k] = float(self.catalogs[k]["mass"].values[h])
                pos[k] = self.catalogs[k]["center_of_mass"].values[h]
        u = self.parameters.get("units", {})
        return xr.Dataset(
            {"redshift": ("output", self.outputs["redshift"].values, {"units": "1"}),
             "scale_factor": ("output", self.outputs["scale_factor"].values, {"units": "1"}),
             "halo": ("output", chain, {"units": "1"}),
             "mass": ("output", mass, {"units": u.get("mass", "")}),
             "position": (("output", "axis"), pos, {"units": u.get("length", "")})},
            coords={"axis": ["x", "y", "z"]}, attrs={"root_halo": int(halo), "by": by})

    def mass_accretion_histories(self, *, by: str = "mass") -> xr.Dataset:
        """M(z)/M(z=0) along the main branch of every halo of the last output.

        Returns
        -------
        xarray.Dataset
            ``mah`` (dims ``output``, ``halo``; NaN where the branch has ended: the
            progenitor fell below the halo finder's smallest group), ``mass0`` (halo,
            the final mass), ``median_mah`` (output: the median of ``mah`` counting ended
            branches as 0, i.e. below every resolved ratio; NaN where more than half
            have ended), ``n_resolved`` (output), ``redshift`` and ``scale_factor``.
        """
        by = check_main_progenitor(by)
        chain = self._branches(by)
        n_out, n_final = chain.shape
        mah = np.full((n_out, n_final), np.nan)
        for k in range(n_out):
            ok = chain[k] >= 0
            mah[k, ok] = self.catalogs[k]["mass"].values[chain[k, ok]]
        m0 = np.asarray(self.catalogs[-1]["mass"].values, dtype=np.float64)
        mah = mah / np.where(m0 > 0, m0, np.nan)[None, :]
        return xr.Dataset(
            {"mah": (("output", "halo"), mah, {"units": "1"}),
             "mass0": ("halo", m0, {"units": self.parameters.get("units", {}).get("mass", "")}),
             "median_mah": ("output", median_with_lost(mah), {"units": "1"}),
             "n_resolved": ("output", np.isfinite(mah).sum(axis=1), {"units": "1"}),
             "redshift": ("output", self.outputs["redshift"].values, {"units": "1"}),
             "scale_factor": ("output", self.outputs["scale_factor"].values, {"units": "1"})},
            attrs={"by": by})

    def tree_nodes(self, halo: int) -> dict:
        """Every halo of the tree of final halo ``halo`` (descendant chains reaching it),
        depth first with main (most massive) progenitors first: ``output``, ``halo``,
        ``redshift``, ``mass``, ``parent`` (row of the descendant; -1 at the root) and
        ``x`` (a layout position: leaves in depth-first order, a node above its main
        progenitor)."""
        self.main_branch(halo)  # checks halo
        n_out = self.n_outputs
        n_halos = self.outputs["n_halos"].values
        progs = [None] + [_progenitor_lists(self.descendants(k), int(n_halos[k + 1]),
                                            self.catalogs[k]["mass"].values)
                          for k in range(n_out - 1)]
        out = {"output": [], "halo": [], "parent": []}
        kids_of: list[list[int]] = []
        stack = [(n_out - 1, int(halo), -1)]
        while stack:  # depth first, main progenitor first
            k, h, parent = stack.pop()
            row = len(out["halo"])
            for key, v in (("output", k), ("halo", h), ("parent", parent)):
                out[key].append(v)
            kids_of.append([])
            if parent >= 0:
                kids_of[parent].append(row)
            if k > 0:
                stack.extend((k - 1, int(p), row) for p in reversed(progs[k][h]))
        x = np.zeros(len(kids_of))
        leaf = 0.0
        for row in range(len(kids_of) - 1, -1, -1):  # children have larger rows
            if not kids_of[row]:
                x[row], leaf = -leaf, leaf + 1.0
            else:
                x[row] = x[min(kids_of[row])]  # above the main (first visited) progenitor
        out["x"] = x.max() - x if x.size else x
        res = {k: np.asarray(v) for k, v in out.items()}
        res["redshift"] = self.outputs["redshift"].values[res["output"]]
        res["mass"] = np.array([float(self.catalogs[k]["mass"].values[h])
                                for k, h in zip(res["output"], res["halo"], strict=True)])
        return res

    # ------------------------------------------------------------------ writers
    def ytree_text(self) -> tuple[str, int]:
        """The consistent-trees text (see :meth:`to_ytree`) and the number of halos left
        out (branches that end before the last output)."""
        return _ctrees_text(self)

    def to_ytree(self, path: str | os.PathLike) -> dict:
        """Write the trees as a consistent-trees ASCII file that ``ytree.load`` reads.

        One tree per halo of the last output (its root), holding every halo whose chain
        of descendants reaches it; halos whose chain ends before the last output (no
        descendant found) belong to no tree and are left out (counted in the result).
        Columns: ``scale``, ``id`` (unique over outputs), ``desc_scale``, ``desc_id``
        (-1 at the root), ``num_prog``, ``pid``/``upid`` (-1), ``Mvir`` (Msun/h, the FOF
        mass), ``x``/``y``/``z`` (Mpc/h comoving, the centre of mass), ``vx``/``vy``/
        ``vz`` (km/s), ``Orig_halo_ID`` (the catalog index), ``Snap_idx`` (output
        index), ``n_particles``. Written to a temporary file then renamed over
        ``path`` (a ``.dat`` name, which ytree requires), with its CRC-32 in
        ``path + ".crc32"``.

        Returns
        -------
        dict
            ``path``, ``n_trees``, ``n_dropped``, ``crc32``.
        """
        p = local_path(path)
        if p.suffix != ".dat":
            raise ParameterError(f"{p}: a consistent-trees file must end in .dat (ytree "
                                 "recognises it by that)")
        if not p.parent.is_dir():
            raise ParameterError(f"{p}: the directory {p.parent} does not exist")
        text, dropped = self.ytree_text()
        crc = _write_text(p, text)
        _write_text(p.with_name(p.name + ".crc32"), f"{crc:08x}\n")
        return {"path": str(p), "n_trees": int(self.outputs["n_halos"].values[-1]),
                "n_dropped": int(dropped), "crc32": crc}

    def to_zarr(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """A merger tree store at ``path``, atomically: the links, outputs and the main
        branch of every final halo as Zarr groups (chunks checksummed), and
        :data:`YTREE_FILE` (consistent-trees, its CRC-32 in the root attributes)."""
        import zarr

        from ..store.chunk_manifest import crc32
        from ..store.zarr_write import store_dataset

        text, dropped = self.ytree_text()
        data = text.encode()
        with atomic_directory(path, overwrite=overwrite, what="merger tree store",
                              fmt=FORMAT) as tmp:
            zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=plain_attrs({
                "format": FORMAT, "format_version": FORMAT_VERSION,
                "parameters": self.parameters, "ytree_file": YTREE_FILE,
                "ytree_crc32": int(crc32(data)), "n_trees": int(
                    self.outputs["n_halos"].values[-1]), "n_dropped": int(dropped)}))
            (tmp / YTREE_FILE).write_bytes(data)  # after the group (mode "w" clears tmp)
            store_dataset(_plain(self.links), tmp / "links", label=f"writing {path}: links")
            store_dataset(_plain(self.outputs), tmp / "outputs",
                          label=f"writing {path}: outputs")
            for k, cat in enumerate(self.catalogs):
                keep = [v for v in ("n_members", "mass", "center_of_mass", "velocity")
                        if v in cat]
                store_dataset(_plain(cat[keep]), tmp / f"catalog_{k:03d}",
                              label=f"writing {path}: catalog {k}")
        return str(local_path(path))

    def __repr__(self) -> str:
        zs = ", ".join(f"{z:g}" for z in self.outputs["redshift"].values)
        return (f"<MergerTree {self.n_outputs} outputs (z = {zs}), "
                f"{int(self.outputs['n_halos'].values[-1])} final halos, "
                f"{self.parameters.get('n_tracers')} tracers>")


def _plain(ds: xr.Dataset) -> xr.Dataset:
    ds = ds.drop_vars([n for n in ds.coords if ds[n].dtype.kind == "U"])
    ds.attrs = {k: plain_attrs(v) for k, v in ds.attrs.items()}
    return ds


def _write_text(path: Path, text: str) -> int:
    """``text`` at ``path`` atomically (temporary sibling + rename); its CRC-32."""
    from ..store.chunk_manifest import crc32

    data = text.encode()
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.part"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return int(crc32(data))


def median_with_lost(mah: np.ndarray) -> np.ndarray:
    """Per row, the median of ``mah`` with NaN (ended branches) counted as 0 (below
    every resolved value); NaN where more than half the values are NaN."""
    out = np.full(mah.shape[0], np.nan)
    for k, row in enumerate(mah):
        if row.size and np.isfinite(row).sum() * 2 > row.size:
            out[k] = np.median(np.where(np.isfinite(row), row, 0.0))
    return out


def open_merger_tree(path: str | os.PathLike) -> MergerTree:
    """A merger tree store written by :meth:`MergerTree.to_zarr` (chunks verified; the
    consistent-trees file checked against its recorded CRC-32)."""
    import warnings

    with warnings.catch_warnings():  # zarr names the consistent-trees file: not a node
        warnings.filterwarnings("ignore", message=f"Object at {YTREE_FILE} is not")
        return _open_merger_tree(local_path(path))


def _open_merger_tree(p: Path) -> MergerTree:
    from ..store.chunk_manifest import crc32
    from ..store.zarr_read import open_product_group

    _, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION,
                                  what="merger tree store")
    data = (p / YTREE_FILE).read_bytes() if (p / YTREE_FILE).is_file() else None
    if data is None or crc32(data) != attrs.get("ytree_crc32"):
        raise SnapshotError(f"{p / YTREE_FILE}: missing or its CRC-32 differs from the "
                            "store's record (the file was altered)")

    def load(group):
        return open_dataset_store(p, group=group, fmt=FORMAT, version=FORMAT_VERSION,
                                  what="merger tree store")

    outputs = load("outputs")
    cats = []
    for k in range(outputs.sizes["output"]):
        c = load(f"catalog_{k:03d}")
        cats.append(c.assign_coords(axis=["x", "y", "z"]) if "axis" in c.dims else c)
    return MergerTree(load("links"), outputs, cats, dict(attrs.get("parameters", {})))


# ----------------------------------------------------------------------------- consistent-trees
def _ctrees_text(tree: MergerTree) -> tuple[str, int]:
    n_out = tree.n_outputs
    params = tree.parameters
    units = params.get("units", {})
    h = float((params.get("cosmology") or {}).get("h", 0.7) or 0.7)
    to_msun_h = _mass_to_msun_h(units.get("mass"), h)
    to_mpc_h = _length_to_mpc_h(units.get("length"), h)
    a = tree.outputs["scale_factor"].values
    n_halos = tree.outputs["n_halos"].values.astype(np.int64)
    base = np.r_[0, np.cumsum(n_halos)].astype(np.int64)  # uid = base[k] + halo
    desc = [tree.descendants(k) for k in range(n_out - 1)] + [np.full(n_halos[-1], -1)]
    # the root (final halo) of every halo, following descendants; -1: the chain ends early
    root = [np.arange(n_halos[-1])]
    for k in range(n_out - 2, -1, -1):
        d = desc[k]
        r = np.full(n_halos[k], -1, np.int64)
        ok = d >= 0
        r[ok] = root[0][d[ok]]
        root.insert(0, r)
    n_prog = [np.zeros(n_halos[0], np.int64)] + [
        np.bincount(desc[k][desc[k] >= 0], minlength=n_halos[k + 1]) for k in range(n_out - 1)]
    dropped = 0
    cols = []
    for k in range(n_out):
        cat = tree.catalogs[k]
        mass = np.asarray(cat["mass"].values, np.float64) * to_msun_h
        pos = np.asarray(cat["center_of_mass"].values, np.float64) * to_mpc_h
        vel = (np.asarray(cat["velocity"].values, np.float64) if "velocity" in cat
               else np.zeros_like(pos))
        nm = np.asarray(cat["n_members"].values, np.int64)
        cols.append((mass, pos, vel, nm))
        dropped += int((root[k] < 0).sum())
    # depth first from each root (a halo's progenitors after it, the main one first)
    progs = [None] + [_progenitor_lists(desc[k], n_halos[k + 1], tree.catalogs[k]["mass"].values)
                      for k in range(n_out - 1)]
    lines = []
    for r in range(int(n_halos[-1])):
        lines.append(f"#tree {base[n_out - 1] + r}")
        stack = [(n_out - 1, r)]
        while stack:
            k, hh = stack.pop()
            mass, pos, vel, nm = cols[k]
            if k == n_out - 1:
                d_scale, d_id = 0.0, -1
            else:
                d_scale, d_id = a[k + 1], base[k + 1] + desc[k][hh]
            lines.append(
                f"{a[k]:.6f} {base[k] + hh} {d_scale:.6f} {d_id} {n_prog[k][hh]} -1 -1 -1 0 "
                f"{mass[hh]:.6e} {pos[hh, 0]:.6f} {pos[hh, 1]:.6f} {pos[hh, 2]:.6f} "
                f"{vel[hh, 0]:.3f} {vel[hh, 1]:.3f} {vel[hh, 2]:.3f} {hh} {k} {nm[hh]}")
            if k > 0:
                stack.extend((k - 1, p) for p in reversed(progs[k][hh]))
    cosmo = params.get("cosmology") or {}
    om = float(cosmo.get("Omega_m", 0.3))
    ol = float(cosmo.get("Omega_L", cosmo.get("Omega_Lambda", 1.0 - om)))
    box = float(params.get("box_size") or 0.0) * to_mpc_h
    header = [
        "#scale(0) id(1) desc_scale(2) desc_id(3) num_prog(4) pid(5) upid(6) desc_pid(7) "
        "phantom(8) Mvir(9) x(10) y(11) z(12) vx(13) vy(14) vz(15) Orig_halo_ID(16) "
        "Snap_idx(17) n_particles(18)",
        "#Consistent Trees format, written by cosmo_dask.halos.merger_tree (FOF halos "
        "linked by their most-bound members)",
        f"#Omega_M = {om:.6f}; Omega_L = {ol:.6f}; h0 = {h:.6f}",
        f"#Full box size = {box:.6f} Mpc/h",
        "#Scale: Scale factor of halo.",
        "#ID: ID of halo (unique across simulation).",
        "#Desc_Scale: Scale of descendant halo, if applicable.",
        "#Desc_ID: ID of descendant halo, if applicable.",
        "#Num_prog: Number of progenitors.",
        "#Mvir: FOF halo mass (Msun/h)",
        "#X/Y/Z: Halo position, centre of mass (Mpc/h comoving)",
        "#VX/VY/VZ: Halo velocity (km/s physical, peculiar)",
        "#Orig_halo_ID: index in the output's FOF catalog",
        "#Snap_idx: index of the output among those with halos",
        f"#Halos dropped (no descendant chain to the last output): {dropped}",
    ]
    return "\n".join(header + [str(int(n_halos[-1]))] + lines) + "\n", dropped


def _progenitor_lists(desc: np.ndarray, n_desc: int, mass) -> list:
    """Per descendant, its progenitors, most massive first."""
    mass = np.asarray(mass)
    prog = np.flatnonzero(desc >= 0)
    order = np.lexsort((prog, -mass[prog], desc[prog]))
    prog = prog[order]
    d = desc[prog]
    cuts = np.searchsorted(d, np.arange(1, n_desc))
    return np.split(prog, cuts)


def _mass_to_msun_h(unit, h: float) -> float:
    from ..units import factor

    try:
        return float(factor(unit or "1e10 Msun/h", "Msun/h", "mass", h=h))
    except ParameterError:
        return 1.0


def _length_to_mpc_h(unit, h: float) -> float:
    from ..units import factor

    try:
        return float(factor(unit or "Mpc/h", "Mpc/h", "length", h=h))
    except ParameterError:
        return 1.0


# ----------------------------------------------------------------------------- building
def _halo_outputs(sim) -> list[dict]:
    return [e for e in sim.outputs if e.get("halos")]


def check_merger_tree(sim, *, n_tracers=N_TRACERS_DEFAULT, n_buckets=None) -> list[dict]:
    """The halo output entries :func:`merger_tree` uses, after checking ``sim`` and the
    parameters (ParameterError in one line, reading no particle data)."""
    n_tracers = check_n_tracers(n_tracers)
    check_n_buckets(n_buckets)
    entries = _halo_outputs(sim)
    if not entries:
        raise ParameterError(f"{sim.path}: the simulation has no halo outputs; run it with "
                             "analyses=['halos'] (cosmo-dask simulate --analyses halos)")
    if len(entries) < 2:
        raise ParameterError(f"{sim.path}: merger trees need at least two halo outputs, the "
                             f"simulation has one (z = {float(entries[0]['redshift']):g})")
    missing = [float(e["redshift"]) for e in entries if not e.get("members")]
    if missing:
        raise ParameterError(f"{sim.path}: the halo outputs at z = "
                             f"{', '.join(f'{z:g}' for z in missing)} hold no member ids "
                             "(its particles had no ids, or an older cosmo_dask wrote it); run the "
                             "simulation again with particle ids")
    return entries


def merger_tree(sim, *, n_tracers: int = N_TRACERS_DEFAULT, n_buckets: int | None = None,
                device: str | None = None) -> MergerTree:
    """Merger trees of a simulation's halo outputs (see the module docstring).

    Parameters
    ----------
    sim : SimulationStore or path
        A simulation run with ``analyses=["halos"]`` (``open_simulation(path)``), at
        least two outputs.
    n_tracers : int
        Most-bound members of each halo followed to the next output (default 20;
        halos with fewer members follow all of them).
    n_buckets : int, optional
        Buckets of the id shuffle (default: one per
        :data:`~cosmo_dask.halos.parameters.TREE_BUCKET_ROWS` rows of the largest
        output pair, at least the number of member chunks).
    device : {"cpu", "gpu"}, optional
        Where the shuffle and join tasks run: NumPy or CuPy chunks of the member ids
        (default ``"cpu"``).

    Returns
    -------
    MergerTree

    Raises
    ------
    ParameterError
        Before any work: no halo outputs, a single one, outputs without member ids,
        ``n_tracers < 1``.
    """
    from ..simulation.store import SimulationStore, open_simulation

    if not isinstance(sim, SimulationStore):
        sim = open_simulation(sim)
    entries = check_merger_tree(sim, n_tracers=n_tracers, n_buckets=n_buckets)
    device = device or "cpu"
    if device not in ("cpu", "gpu"):
        raise ParameterError(f"device must be 'cpu' or 'gpu', got {device!r}")
    zs = [float(e["redshift"]) for e in entries]
    members = [sim.members(z, device=device) for z in zs]
    catalogs = [sim.halos(z) for z in zs]
    n_halos = [int(m["offsets"].size - 1) for m in members]
    for z, m, c in zip(zs, members, catalogs, strict=True):
        if int(c.sizes.get("halo", 0)) != m["offsets"].size - 1:
            raise SnapshotError(f"{sim.path}: at z = {z:g} the members store and the halo "
                                "catalog disagree on the halo count")
    rows = max((int(members[k]["ids"].shape[0]) + int(members[k + 1]["ids"].shape[0])
                for k in range(len(zs) - 1)), default=0)
    if n_buckets is None:
        n_chunks = max(len(m["ids"].data.chunks[0]) for m in members)
        n_buckets = max(n_chunks, math.ceil(rows / TREE_BUCKET_ROWS), 1)
    arrays = [m["ids"].data for m in members]
    token = tokenize([a.name for a in arrays], n_tracers, n_buckets)
    g = TaskGraph(arrays)

    def splits(k: int, tracers: bool):
        x = arrays[k]
        bounds = np.r_[0, np.cumsum(x.chunks[0])]
        off = members[k]["offsets"].values
        kind = "tree-tracers" if tracers else "tree-members"
        return [g.add_split((f"{kind}-{token}", k, c), _split, g.chunk(x, c),
                            int(bounds[c]), off, n_tracers if tracers else None, n_buckets,
                            n=n_buckets) for c in range(len(x.chunks[0]))]

    reduce_keys = []
    for k in range(len(zs) - 1):
        tr, mem = splits(k, True), splits(k + 1, False)
        joins = [g.add((f"tree-join-{token}", k, b), _join, n_halos[k + 1], len(tr),
                       *[s[b] for s in tr], *[s[b] for s in mem]) for b in range(n_buckets)]
        dmass = np.asarray(catalogs[k + 1]["mass"].values, np.float64)
        reduce_keys.append(g.add((f"tree-links-{token}", k), _links, n_halos[k], n_halos[k + 1],
                                 dmass, *joins).key)
    results = g.compute(reduce_keys, label="merger tree") if reduce_keys else []
    links = _links_dataset(results, catalogs, zs, n_tracers, sim)
    outputs = xr.Dataset({
        "redshift": ("output", np.asarray(zs), {"units": "1"}),
        "scale_factor": ("output", np.array([float(e["scale_factor"]) for e in entries]),
                         {"units": "1"}),
        "n_halos": ("output", np.asarray(n_halos, np.int64), {"units": "1"}),
        "index": ("output", np.array([int(e["index"]) for e in entries]), {"units": "1"})})
    units = {"mass": catalogs[-1]["mass"].attrs.get("units", ""),
             "length": catalogs[-1]["center_of_mass"].attrs.get("units", "")}
    params = {"n_tracers": int(n_tracers), "n_buckets": int(n_buckets),
              "simulation": str(sim.path), "box_size": sim.parameters.get("box_size"),
              "cosmology": sim.parameters.get("cosmology"), "units": units,
              "device": device}
    return MergerTree(links, outputs, catalogs, params)


def _links_dataset(results, catalogs, zs, n_tracers, sim) -> xr.Dataset:
    cols = {k: [] for k in ("prog_output", "prog_redshift", "prog_halo", "desc_output",
                            "desc_halo", "shared", "n_tracers", "prog_mass", "desc_mass")}
    for k, (desc, shared) in enumerate(results):
        n = desc.size
        nm = np.asarray(catalogs[k]["n_members"].values, np.int64)
        pm = np.asarray(catalogs[k]["mass"].values, np.float64)
        dm = np.asarray(catalogs[k + 1]["mass"].values, np.float64)
        cols["prog_output"].append(np.full(n, k))
        cols["prog_redshift"].append(np.full(n, zs[k]))
        cols["prog_halo"].append(np.arange(n))
        cols["desc_output"].append(np.full(n, k + 1))
        cols["desc_halo"].append(desc)
        cols["shared"].append(shared)
        cols["n_tracers"].append(np.minimum(nm, n_tracers))
        cols["prog_mass"].append(pm)
        cols["desc_mass"].append(np.where(desc >= 0, dm[np.maximum(desc, 0)] if dm.size
                                          else np.nan, np.nan))
    cat = {k: (np.concatenate(v) if v else np.empty(0)) for k, v in cols.items()}
    mass_unit = catalogs[0]["mass"].attrs.get("units", "")
    units = {"prog_mass": mass_unit, "desc_mass": mass_unit}
    data = {k: ("link", v.astype(np.float64 if k in ("prog_redshift", "prog_mass",
                                                      "desc_mass") else np.int64),
                {"units": units.get(k, "1")}) for k, v in cat.items()}
    frac = cat["shared"] / np.maximum(cat["n_tracers"], 1)
    data["fraction"] = ("link", frac.astype(np.float64), {"units": "1"})
    return xr.Dataset(data, attrs={"n_tracers": int(n_tracers), "simulation": str(sim.path)})


# ----------------------------------------------------------------------------- fit
def correa2015_mah(mass0, redshift, cosmology=None, power_spectrum=None):
    """Median mass accretion history fit of Correa et al. (2015, MNRAS 450, 1514).

    ``M(z) / M0 = (1 + z)^alpha exp(beta z)`` with ``beta = -f(M0)``,
    ``alpha = [1.686 (2/pi)^(1/2) dD/dz|_(z=0) + 1] f(M0)``,
    ``f(M0) = [S(M0/q) - S(M0)]^(-1/2)`` (``S = sigma^2`` of the linear power at z = 0),
    ``q = 4.137 z_f^(-0.9476)``, ``z_f = -0.0064 (log10 M0)^2 + 0.0237 log10 M0 + 1.8837``
    (``M0`` in Msun) (their eqs. 17-23).

    Parameters
    ----------
    mass0 : float or array-like
        Final (z = 0) halo mass, 1e10 Msun/h.
    redshift : float or array-like
        Redshifts (broadcast against ``mass0``).
    cosmology : Cosmology, dict or None
        The cosmology (default :class:`~cosmo_dask.models.cosmology.Cosmology`'s).
    power_spectrum : optional
        The linear ``P(k, z = 0)`` as :func:`cosmo_dask.halos.sigma_of_mass` takes it
        (default the cosmology's EH98 spectrum normalised to ``sigma8``).

    Returns
    -------
    numpy.ndarray
        ``M(z) / M0`` (dimensionless).
    """
    from ..models.cosmology import Cosmology
    from .mass_functions import sigma_of_mass

    cosmo = Cosmology.coerce(cosmology)
    m0 = np.asarray(mass0, dtype=np.float64)
    z = np.asarray(redshift, dtype=np.float64)
    if np.any(~np.isfinite(m0)) or np.any(m0 <= 0):
        raise ParameterError("correa2015_mah: mass0 must be finite and > 0 (1e10 Msun/h)")
    if np.any(~np.isfinite(z)) or np.any(z < 0):
        raise ParameterError("correa2015_mah: redshift must be finite and >= 0")
    log_m = np.log10(m0 * 1e10 / cosmo.h)  # Msun
    z_f = -0.0064 * log_m**2 + 0.0237 * log_m + 1.8837
    q = 4.137 * z_f ** (-0.9476)
    s0 = np.asarray(sigma_of_mass(m0, cosmo, 0.0, power_spectrum)) ** 2
    sq = np.asarray(sigma_of_mass(m0 / q, cosmo, 0.0, power_spectrum)) ** 2
    f = 1.0 / np.sqrt(sq - s0)
    dddz = -float(cosmo.growth_rate(1.0))  # dD/dz at z = 0 (D(1) = 1): -f(a = 1)
    alpha = (DELTA_C * math.sqrt(2.0 / math.pi) * dddz + 1.0) * f
    beta = -f
    return (1.0 + z) ** alpha * np.exp(beta * z)


# ----------------------------------------------------------------------------- figures
def mass_bins(tree: MergerTree, n_bins: int = 2, *, min_particles: int = 100) -> list:
    """Final halos with at least ``min_particles`` members split into ``n_bins`` bins of
    equal count by mass: a list of boolean masks over the final halos."""
    from ..core.checks import check_integer

    n_bins = check_integer(n_bins, "n_bins", 1)
    cat = tree.catalogs[-1]
    n = np.asarray(cat["n_members"].values)
    m = np.asarray(cat["mass"].values, dtype=np.float64)
    ok = np.flatnonzero(n >= min_particles)
    if ok.size < n_bins:
        return []
    ranked = ok[np.argsort(m[ok], kind="stable")]
    masks = []
    for part in np.array_split(ranked, n_bins):
        mask = np.zeros(n.size, bool)
        mask[part] = True
        masks.append(mask)
    return masks


def plot_mass_accretion(tree: MergerTree, *, n_bins: int = 2, min_particles: int = 100,
                        fit: bool = True, ax=None, path=None):
    """Median mass accretion histories of the final halos in ``n_bins`` mass bins (of at
    least ``min_particles`` members; their individual histories drawn thin), with the
    :func:`correa2015_mah` fit at each bin's median final mass when the tree knows its
    cosmology; log M/M0 against z."""
    from ..plot.figure import new_axes
    from ..plot.merger_tree import draw_mass_accretion

    mah = tree.mass_accretion_histories()
    z = mah["redshift"].values
    ratios = mah["mah"].values
    m0 = mah["mass0"].values
    unit = mah["mass0"].attrs.get("units", "")
    medians, fits = [], []
    cosmo = tree.parameters.get("cosmology")
    zf = np.linspace(0.0, float(z.max()), 50)
    bins = mass_bins(tree, n_bins, min_particles=min_particles)
    for mask in bins:
        mm = float(np.median(m0[mask]))
        medians.append((median_with_lost(ratios[:, mask]),
                        f"median, {int(mask.sum())} halos, M0 ~ {mm:.3g} {unit}"))
        if fit and cosmo:
            fits.append((zf, correa2015_mah(mm, zf, cosmo), "Correa et al. 2015"))
    shown = np.logical_or.reduce(bins) if bins else np.zeros(ratios.shape[1], bool)
    ax = new_axes(ax, path)
    return draw_mass_accretion(ax, z, ratios[:, shown], medians, fits, path=path)


def plot_tree(tree: MergerTree, halo: int = 0, *, ax=None, path=None):
    """One final halo's merger tree (:meth:`MergerTree.tree_nodes`) drawn against z."""
    from ..plot.figure import new_axes
    from ..plot.merger_tree import draw_tree

    nodes = tree.tree_nodes(halo)
    ax = new_axes(ax, path)
    return draw_tree(ax, nodes["redshift"], nodes["x"], nodes["mass"], nodes["parent"],
                     mass_unit=tree.parameters.get("units", {}).get("mass", ""), path=path)


__all__ = ["merger_tree", "MergerTree", "open_merger_tree", "correa2015_mah", "mass_bins",
           "plot_mass_accretion", "plot_tree",
           "check_merger_tree", "median_with_lost", "FORMAT"]
