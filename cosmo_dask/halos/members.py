"""Halo member ids ranked by binding energy, and their store (what merger trees follow).

For every kept FOF halo, its member particle ids, most bound first, with each member's
specific binding energy

    e = phi / a + |v - v_halo|^2 / 2          (velocity units squared, e.g. (km/s)^2)

``phi`` the potential of the member due to the other members of its halo, in comoving
coordinates (so ``phi / a`` is the physical one; ``G`` and the Plummer softening as the
catalog's MBPs use them), ``v`` the peculiar velocity and ``v_halo`` the halo's
mass-weighted mean velocity. Every member is ranked (no tracer cut here):
``phi`` is exact (:data:`cosmo_dask.halos.dispatch.segment_potentials`, on the CPU or the
GPU after the snapshot's chunks) for halos of up to
:data:`~cosmo_dask.halos.parameters.MEMBERS_EXACT_MAX` members, and for larger ones the
grid-Poisson potential of :func:`~cosmo_dask.halos.center_kernels.grid_potential` (the one
the catalog's ``mbp_grid`` centres use), trilinear at the members.

Distributed as a shuffle by halo: one task per snapshot chunk selects its members
(``labels >= 0``) and cuts them into buckets of consecutive halo ids (balanced by member
count, so that every halo lies in one bucket); one task per bucket computes the energies
and sorts. Bucket ``b`` holds a contiguous run of halos, so its result is rows
``offsets[h_b]:offsets[h_b+1]`` of the stored arrays: no task ever holds more than one
bucket.

Store layout (Zarr v3 group, written atomically with chunk checksums)::

    members/
      zarr.json        attrs: format="cosmo_dask.halo_members", format_version=1,
                       n_halos, n_members, scale_factor, softening, G, energy
      ids (M,)         int64 member ids, halo by halo, most bound first       units "1"
      binding_energy   float64 e of each member (above)                       velocity^2
      offsets (H+1,)   int64: halo h is rows offsets[h]:offsets[h+1]          units "1"
"""

from __future__ import annotations

import math
import os

import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize

from ..core.backend import array_module, empty_meta, host, to_device
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_product_group, read_array
from ..store.zarr_write import plain_attrs, store_arrays
from ..units.products import product_units, store_units
from . import dispatch as kernels
from .center_kernels import grid_potential
from .parameters import (
    MEMBERS_EXACT_MAX,
    MEMBERS_GRID_NODES,
    POTENTIAL_SOFTENING_LINKS,
    TREE_BUCKET_ROWS,
)

FORMAT = "cosmo_dask.halo_members"
FORMAT_VERSION = 1
#: what ``binding_energy`` is (stored as the ``energy`` attribute)
ENERGY = "phi / a + |v - v_halo|^2 / 2 (phi comoving, from the halo's own members)"


# ----------------------------------------------------------------------------- tasks
def bucket_edges(n_members: np.ndarray, n_buckets: int) -> np.ndarray:
    """Halo-id edges (n_buckets + 1,) of buckets of consecutive halos with about equal
    member counts (every bucket non-empty when there are enough halos)."""
    h = n_members.size
    n_buckets = max(1, min(n_buckets, h))
    cum = np.r_[0, np.cumsum(n_members, dtype=np.int64)]
    targets = cum[-1] * np.arange(1, n_buckets) / n_buckets
    inner = np.searchsorted(cum, targets, side="left")
    edges = np.unique(np.r_[0, np.clip(inner, 1, max(h - 1, 1)), h])
    return edges.astype(np.int64)


def scatter_members(lab, pos, vel, ids, mass, particle_mass, edges, offset: int = 0):
    """One chunk's halo members cut into the buckets of ``edges`` (:func:`bucket_edges`):
    a list of dicts of host arrays ``label``, ``index`` (the particle's row in the
    snapshot: ``offset`` is the chunk's first), ``pos``, ``vel``, ``ids`` (None without
    ids), ``mass``; the selection is made where the chunk lives. The one shuffle of
    halo members by halo (member ranking, subhalos)."""
    xp = array_module(lab)
    sel = xp.flatnonzero(lab >= 0)
    label = host(lab[sel]).astype(np.int64)
    out = {"label": label, "index": host(sel).astype(np.int64) + int(offset),
           "pos": host(pos[sel]).astype(np.float64),
           "vel": (np.zeros((label.size, 3)) if vel is None
                   else host(vel[sel]).astype(np.float64)),
           "ids": host(ids[sel]).astype(np.int64) if ids is not None else None,
           "mass": (np.full(label.size, float(particle_mass)) if mass is None
                    else host(mass[sel]).astype(np.float64))}
    bucket = np.searchsorted(edges, label, side="right") - 1
    order = np.argsort(bucket, kind="stable")
    cuts = np.searchsorted(bucket[order], np.arange(1, edges.size - 1))
    return [{k: v[idx] for k, v in out.items()} for idx in np.split(order, cuts)]


def _trilinear(phi: np.ndarray, origin: np.ndarray, cell: float, upos: np.ndarray):
    """``phi`` (a node grid from :func:`grid_potential`) trilinear at ``upos``."""
    n = phi.shape[0]
    x = (upos - origin) / cell
    i0 = np.clip(np.floor(x).astype(np.int64), 0, n - 2)
    w = np.clip(x - i0, 0.0, 1.0)
    out = np.zeros(upos.shape[0])
    for dx in (0, 1):
        wx = w[:, 0] if dx else 1 - w[:, 0]
        for dy in (0, 1):
            wy = w[:, 1] if dy else 1 - w[:, 1]
            for dz in (0, 1):
                wz = w[:, 2] if dz else 1 - w[:, 2]
                out += wx * wy * wz * phi[i0[:, 0] + dx, i0[:, 1] + dy, i0[:, 2] + dz]
    return out


def rank_members(label, pos, vel, ids, mass, *, box_size, softening, G, scale_factor,
                 exact_max=MEMBERS_EXACT_MAX, grid_nodes=MEMBERS_GRID_NODES, like=None):
    """Members of whole halos sorted by halo, then by binding energy (most bound first).

    Parameters
    ----------
    label : numpy.ndarray
        int64 halo id of each member (n,); every member of each halo present.
    pos, vel : numpy.ndarray
        float64 comoving positions (n, 3) (length units) and peculiar velocities
        (n, 3) (velocity units).
    ids : numpy.ndarray
        int64 particle ids (n,).
    mass : numpy.ndarray
        float64 masses (n,) (mass units).
    box_size : float or None
        Periodic box side (length units).
    softening : float
        Plummer softening of the potential (length units).
    G : float
        Gravitational constant (length velocity^2 / mass).
    scale_factor : float
        ``a`` of the snapshot (the potential of comoving positions divided by it).
    exact_max : int
        Halos above this member count use the grid potential.
    grid_nodes : int
        Nodes per axis of that grid.
    like : array, optional
        Zero-size NumPy or CuPy array: where the exact potentials are computed.

    Returns
    -------
    (label, ids, energy) : numpy.ndarray
        Sorted by (label, energy); ``energy`` in velocity^2.
    """
    order = np.argsort(label, kind="stable")
    label, pos, vel, ids, mass = label[order], pos[order], vel[order], ids[order], mass[order]
    n = label.size
    if n == 0:
        return label, ids, np.empty(0)
    starts = np.r_[np.flatnonzero(np.r_[True, label[1:] != label[:-1]]), n].astype(np.int64)
    sizes = np.diff(starts)
    phi = np.empty(n)
    big = sizes > exact_max
    small = np.flatnonzero(~big)
    if small.size:
        sel = np.flatnonzero(np.repeat(~big, sizes))
        sub = np.r_[0, np.cumsum(sizes[small])].astype(np.int64)
        xp = np if like is None else array_module(like)
        phi[sel] = host(kernels.segment_potentials(
            xp.asarray(pos[sel]), xp.asarray(mass[sel]), xp.asarray(sub), box_size=box_size,
            softening=softening, G=G))
    for s in np.flatnonzero(big):
        a, b = starts[s], starts[s + 1]
        grid, origin, cell = grid_potential(pos[a:b], mass[a:b], box_size=box_size, G=G,
                                            n_grid=grid_nodes)
        upos = pos[a:b]
        if box_size is not None:  # the grid's frame: minimum image of the first member
            rel = upos - upos[0]
            upos = upos[0] + rel - box_size * np.rint(rel / box_size)
        phi[a:b] = _trilinear(grid, origin, cell, upos)
    first = starts[:-1]
    msum = np.add.reduceat(mass, first)
    vh = np.add.reduceat(mass[:, None] * vel, first, axis=0) / msum[:, None]
    dv = vel - np.repeat(vh, sizes, axis=0)
    energy = phi / scale_factor + 0.5 * (dv * dv).sum(axis=1)
    order = np.lexsort((energy, label))
    return label[order], ids[order], energy[order]


def _rank_bucket(kw, like, *pieces):
    cat = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
    _, ids, energy = rank_members(cat["label"], cat["pos"], cat["vel"], cat["ids"],
                                  cat["mass"], like=like, **kw)
    return ids, energy


# ----------------------------------------------------------------------------- graph
def member_arrays(snap, result, *, softening: float | None = None,
                  n_buckets: int | None = None, exact_max: int = MEMBERS_EXACT_MAX,
                  grid_nodes: int = MEMBERS_GRID_NODES):
    """Lazy ranked member arrays of a FOF result (see the module docstring).

    Parameters
    ----------
    snap : Snapshot
        The snapshot the halos were found in (with ``ids``).
    result : HaloResult
        :func:`cosmo_dask.halos.fof` of ``snap``.
    softening : float, optional
        Plummer softening (length units); default the catalog's
        ``potential_softening`` (0.1 linking lengths).
    n_buckets : int, optional
        Buckets of the halo shuffle (default: about one per snapshot chunk, at least
        one per :data:`~cosmo_dask.halos.parameters.TREE_BUCKET_ROWS` members).

    Returns
    -------
    ids, energy : dask.array.Array
        int64 ids and float64 binding energies (velocity^2), halo by halo, most bound
        first.
    offsets : numpy.ndarray
        int64 (H+1,): halo h is rows ``offsets[h]:offsets[h+1]``.
    attrs : dict
        ``softening``, ``G``, ``scale_factor``, ``energy_units``.
    """
    if snap.ids is None:
        raise ParameterError(f"{snap.source or 'snapshot'}: has no particle ids; halo "
                             "members are stored as ids")
    cat = result.catalog
    n_members = np.asarray(cat["n_members"].values, dtype=np.int64)
    offsets = np.r_[0, np.cumsum(n_members)].astype(np.int64)
    G = float(snap.G) if snap.G is not None else 1.0
    if softening is None:
        softening = float(cat.attrs.get("potential_softening", POTENTIAL_SOFTENING_LINKS
                                        * result.parameters.get("linking_length", 0.0)))
    a = float(snap.scale_factor) if snap.scale_factor is not None else 1.0
    units = product_units(snap.units, g_one=snap.G is None)
    attrs = {"softening": float(softening), "G": G, "scale_factor": a,
             "energy_units": units["potential"]}
    total = int(offsets[-1])
    if total == 0:
        empty_i = da.zeros(0, dtype=np.int64, chunks=1)
        return empty_i, da.zeros(0, dtype=np.float64, chunks=1), offsets, attrs
    rows = tuple(int(c) for c in snap.pos.chunks[0])
    labels = result.labels
    if tuple(labels.chunks[0]) != rows:
        labels = labels.rechunk((rows,))
    if n_buckets is None:
        n_buckets = max(len(rows), math.ceil(total / TREE_BUCKET_ROWS))
    edges = bucket_edges(n_members, n_buckets)
    nb = edges.size - 1
    inputs = [x for x in (labels, snap.pos, snap.vel, snap.ids, snap.mass) if x is not None]
    token = tokenize([x.name for x in inputs], edges, softening, G, a, exact_max, grid_nodes,
                     snap.particle_mass, snap.box_size)
    g = TaskGraph(inputs)
    like = empty_meta(snap.pos, 1, np.float64)
    splits = []
    for c in range(len(rows)):
        args = [g.chunk(labels, c), g.chunk(snap.pos, c, 0),
                None if snap.vel is None else g.chunk(snap.vel, c, 0),
                None if snap.ids is None else g.chunk(snap.ids, c),
                None if snap.mass is None else g.chunk(snap.mass, c)]
        splits.append(g.add_split((f"members-scatter-{token}", c), scatter_members, *args,
                                  snap.particle_mass, edges, n=nb))
    kw = {"box_size": snap.box_size, "softening": float(softening), "G": G,
          "scale_factor": a, "exact_max": int(exact_max), "grid_nodes": int(grid_nodes)}
    keys = [g.add((f"members-rank-{token}", b), _rank_bucket, kw, like,
                  *[s[b] for s in splits]).key for b in range(nb)]
    sizes = [int(offsets[edges[b + 1]] - offsets[edges[b]]) for b in range(nb)]
    ids, energy = g.item_arrays(keys, sizes, [
        (f"members-ids-{token}", 0, (), np.empty(0, np.int64)),
        (f"members-energy-{token}", 1, (), np.empty(0, np.float64))])
    return ids, energy, offsets, attrs


# ----------------------------------------------------------------------------- store
def write_members(snap, result, path: str | os.PathLike, *, overwrite: bool = False,
                  **kwargs) -> str:
    """Rank the members of ``result`` (:func:`member_arrays`, ``kwargs`` its options) and
    write them as a members store at ``path``, atomically (chunks checksummed)."""
    ids, energy, offsets, attrs = member_arrays(snap, result, **kwargs)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION,
            "n_halos": int(offsets.size - 1), "n_members": int(offsets[-1]),
            "energy": ENERGY, **attrs}
    with atomic_directory(path, overwrite=overwrite, what="halo members store",
                          fmt=FORMAT) as tmp:
        import zarr

        group = zarr.open_group(str(tmp), mode="w", zarr_format=3,
                                attributes=plain_attrs(meta))
        store_arrays(group, {"ids": ids, "binding_energy": energy,
                             "offsets": da.from_array(offsets, chunks=-1)}, root=tmp,
                     label=f"writing {path}", show=False,
                     dims={"ids": ("member",), "binding_energy": ("member",),
                           "offsets": ("halo_edge",)})
        store_units(group, {"ids": "1", "binding_energy": attrs["energy_units"],
                            "offsets": "1"})
    return str(local_path(path))


def open_members(path: str | os.PathLike, *, device: str = "cpu",
                 verify: bool | None = None) -> xr.Dataset:
    """A members store (:func:`write_members`) as a Dataset: ``ids`` and
    ``binding_energy`` lazy dask arrays over dim ``member`` (CuPy chunks with
    ``device="gpu"``; every chunk checked against its CRC-32 when ``verify``, default
    dask config ``cosmo_dask.verify``), ``offsets`` (dim ``halo_edge``) loaded; each
    with its ``units`` attribute; the store's attributes as the Dataset's."""
    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="halo members store", verify=verify)
    data = {}
    for name in ("ids", "binding_energy", "offsets"):
        arr = group[name]
        where = device if name != "offsets" else "cpu"
        if arr.shape[0] == 0:  # no halos: nothing to read (one empty chunk)
            x = to_device(da.from_array(np.empty(0, arr.dtype), chunks=1), where)
        else:
            x = read_array(arr, name, str(p), device=where, verify=verify)
        if name == "offsets":
            x = x.compute()
        dim = "halo_edge" if name == "offsets" else "member"
        data[name] = (dim, x, {"units": str(arr.attrs.get("units", "1"))})
    meta = {k: v for k, v in attrs.items() if k not in ("format", "format_version")
            and not str(k).startswith("_")}
    return xr.Dataset(data, attrs=meta)


def halo_members(members: xr.Dataset, halo: int) -> np.ndarray:
    """The member ids of one halo of an :func:`open_members` Dataset, most bound first."""
    off = members["offsets"].values
    return np.asarray(host(members["ids"].data[off[halo]:off[halo + 1]].compute()))


__all__ = ["member_arrays", "write_members", "open_members", "rank_members", "halo_members",
           "FORMAT"]
