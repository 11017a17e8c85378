"""Distributed friends-of-friends: the Dask graph around the per-domain kernel.

1. ``fof-split``/``fof-domain``: particles (with ids) are cut into domains by
   :mod:`cosmo_dask.spatial`, each with a ghost shell one linking length wide
   (two with ``min_friends > 1``, so ghosts' friend counts are complete).
2. ``fof-local``: the kernel links each domain's particles; every particle gets
   a representative (the global index of its local component's root).
3. ``fof-ghosts``/``fof-match``/``fof-merge``: a ghost particle and its owner's copy
   must end in one group. Each domain lists its ghosts' ``(index, representative)``
   rows by owning domain (``fof-ghosts``; owners are domains that touch it, up to 26);
   each owner's ``fof-match`` reads those lists (16 bytes a ghost row; a list reaches
   every domain it names), joins its pieces with its exported rows, in parallel, and
   keeps the distinct (representative there, representative here) pairs of different
   groups. Those links are the edges of a small graph whose connected components, in
   the one ``fof-merge`` task, merge groups across domains and the periodic boundary
   exactly. A group whose ghost copies elsewhere link to nothing else makes no edge:
   it is complete in its own domain.
4. ``fof-count``/``fof-catalog``: per-domain group sizes and smallest member ids
   (only groups that are large enough or cross a domain face), reduced into the
   halo order: decreasing size, ties by smallest member id.
5. ``fof-labels``: halo ids scattered back into the snapshot's particle order.

Why exact: a pair closer than the linking length always lies inside the domain
(plus ghost shell) of the particle that owns it, so the kernel sees every link;
links are never invented, because ghosts' friend counts can only be too low.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, empty_meta, host
from ..core.errors import SnapshotError
from ..core.progress import compute, worker_count, worker_threads
from ..core.task_graph import TaskGraph
from ..spatial import DomainGrid, DomainLayout, DomainPart, decompose, domain_grid, rows_by_chunk
from . import dispatch as kernels
from .parameters import (
    LINKING_LENGTH_DEFAULT,
    MIN_FRIENDS_DEFAULT,
    MIN_MEMBERS_DEFAULT,
    box_linking_length,
    check_fof,
)

#: particles per domain aimed at by the default domain count
DOMAIN_PARTICLES = 2**21
#: particles per domain aimed at on GPU workers (about 120 bytes each on the device)
GPU_DOMAIN_PARTICLES = 2**27
#: snapshots smaller than this run as one domain by default
SMALL_SNAPSHOT = 2**17
#: the default domains are at most MAX_DOMAIN_CUBE^3 (512: 2^24 particles each, about
#: 0.3 GiB, at 2048^3; the exchanges then take ~25k keys each, spatial.domains)
MAX_DOMAIN_CUBE = 8


@dataclass
class FOFLabels:
    """Friends-of-friends groups of a snapshot.

    Attributes
    ----------
    labels : dask.array.Array
        (N,) int64 halo id of each particle in snapshot order; -1 for particles
        in no group of at least ``min_members``. Halo ``h`` is row ``h`` of the
        arrays below: ordered by decreasing ``n_members``, ties by smallest
        member particle id.
    n_members : numpy.ndarray
        (H,) members per halo.
    first_member_id : numpy.ndarray
        (H,) smallest particle id in each halo (``ids`` array, else snapshot index).
    linking_length : float
        The absolute linking length used (box units).
    parameters : dict
        Everything the result depends on.
    """

    labels: da.Array
    n_members: np.ndarray
    first_member_id: np.ndarray
    linking_length: float
    parameters: dict = field(default_factory=dict)

    @property
    def n_halos(self) -> int:
        return int(self.n_members.size)


# ----------------------------------------------------------------------------- tasks
# Per-domain functions work on NumPy or CuPy arrays (following the chunks); the
# cross-domain tables (_merge, _count output, _catalog) are small and on the host.
def _local(part: DomainPart, grid: DomainGrid, ll: float, min_friends: int,
           with_members: bool = False, count_friends: bool = False) -> dict:
    # friend counts are read only by the members tables (the catalog's MCP); the kernel
    # counts them only when asked (or with min_friends > 1, where they decide the links)
    root, friends = kernels.fof_local(part.pos, grid.kernel_periods, ll, min_friends,
                                      count_friends=with_members and count_friends)
    rep = part.index[root]
    n_own = part.n_owned  # owned rows come first, ghosts after
    ids = part.extra.get("ids", part.index)
    extra = {k: v[:n_own] for k, v in (("vel", part.extra.get("vel")),
                                       ("mass", part.extra.get("mass"))) if v is not None}
    if with_members:
        extra["pos"] = part.pos[:n_own]
    # the boundary tables in one copy to the host (on a GPU: one read of the exported
    # count and one copy, not masked selections and copies of each); a ghost's owner is
    # the domain whose fof-match joins it with that domain's exported copy
    xp = array_module(part.index)
    exported = xp.flatnonzero(part.exported)
    n_ghost, n_exp = int(part.index.shape[0]) - n_own, int(exported.shape[0])
    boundary = host(xp.concatenate([part.index[n_own:], rep[n_own:],
                                    grid.owner_of(part.pos[n_own:]), part.index[exported],
                                    rep[exported]]))
    ghost_index, ghost_rep, ghost_owner, export_index, export_rep = np.split(
        boundary, np.cumsum([n_ghost, n_ghost, n_ghost, n_exp]))
    return {
        **extra,
        "index": part.index[:n_own],
        "rep": rep[:n_own],
        "ids": ids[:n_own].astype(np.int64, copy=False),
        "friends": None if friends is None else friends[:n_own],
        "ghost_index": ghost_index,
        "ghost_rep": ghost_rep,
        "ghost_owner": ghost_owner,
        "export_index": export_index,
        "export_rep": export_rep,
        # the owned rows' local groups, so that fof-count needs no sort (group_rows)
        "root": root[:n_own],
    }


def _ghosts_by_owner(local: dict, neighbours: tuple[int, ...]) -> list:
    """One domain's ghost rows ``(index, rep)``, one piece per neighbouring domain (in the
    order of ``neighbours``): the rows that domain owns, for its ``fof-match``."""
    owner = local["ghost_owner"]
    order = np.argsort(owner, kind="stable")
    owner = owner[order]
    nb = np.asarray(neighbours, dtype=np.int64)
    lo, hi = np.searchsorted(owner, nb, side="left"), np.searchsorted(owner, nb, side="right")
    if int((hi - lo).sum()) != owner.size:
        raise RuntimeError("fof-ghosts: a ghost particle is owned by a domain that does not "
                           "touch its own (decomposition bug)")
    index, rep = local["ghost_index"][order], local["ghost_rep"][order]
    return [(index[a:b], rep[a:b]) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]


def _match(local: dict, slots: tuple[int, ...], *ghosts: list) -> tuple[np.ndarray, np.ndarray]:
    """The links one domain's groups make across its faces: each ghost of one of its
    particles held by a neighbour (piece ``slots[k]`` of that neighbour's
    :func:`_ghosts_by_owner` list ``ghosts[k]``: ``(index, rep)``) joins the ghost's group
    there (``rep``) to the particle's group here. Returns the distinct pairs ``(rep
    there, rep here)`` of different groups (a ghost alone in its group there, or with
    only this domain's particles, links nothing new), sorted."""
    pieces = [lst[k] for lst, k in zip(ghosts, slots, strict=True)]
    empty = np.empty(0, np.int64)
    g_idx = np.concatenate([empty, *[p[0] for p in pieces]])
    g_rep = np.concatenate([empty, *[p[1] for p in pieces]])
    if g_idx.size == 0:
        return empty, empty
    e_idx, e_rep = local["export_index"], local["export_rep"]
    order = np.argsort(e_idx, kind="stable")
    e_idx, e_rep = e_idx[order], e_rep[order]
    at = np.minimum(np.searchsorted(e_idx, g_idx), max(e_idx.size - 1, 0))
    if e_idx.size == 0 or np.any(e_idx[at] != g_idx):
        raise RuntimeError("fof-match: a ghost particle has no owner copy (decomposition bug)")
    here = e_rep[at]
    keep = g_rep != here
    a, b = g_rep[keep], here[keep]
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    first = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])][:a.size]
    return a[first], b[first]


def _merge(*links: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Representatives joined across domains -> their merged class (sorted keys): the
    connected components of every domain's links (:func:`_match`)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    empty = np.empty(0, np.int64)
    a = np.concatenate([empty, *[lk[0] for lk in links]])
    b = np.concatenate([empty, *[lk[1] for lk in links]])
    if a.size == 0:
        return empty, empty
    # the distinct representatives, sorted: an explicit sort (NumPy 2.4's plain np.unique
    # hashes, some 25 times slower on these large-valued int64 arrays)
    nodes = np.sort(np.concatenate([a, b]))
    nodes = nodes[np.r_[True, nodes[1:] != nodes[:-1]]]
    ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
    k = nodes.size
    graph = coo_matrix((np.ones(ia.size, np.int8), (ia, ib)), shape=(k, k))
    _, comp = connected_components(graph, directed=False)
    smallest = np.full(comp.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(smallest, comp, nodes)
    return nodes, smallest[comp]


def _classes(local: dict, merged):
    """Class of each owned particle and whether its group is joined to another domain's
    (then the catalog sums its rows from every domain)."""
    rep = local["rep"]
    xp = array_module(rep)
    nodes, cls = (xp.asarray(a) for a in merged)
    if nodes.size == 0:  # nothing crosses a face: the classes are the representatives
        return rep, xp.zeros(rep.size, dtype=bool)
    out = rep.copy()
    at = xp.minimum(xp.searchsorted(nodes, rep), nodes.size - 1)
    crossing = nodes[at] == rep
    out[crossing] = cls[at[crossing]]
    return out, crossing


def _count(local: dict, merged, min_members: int) -> np.ndarray:
    """Rows (class, local count, smallest id) worth reporting from one domain (host):
    local groups with at least ``min_members`` members here, or crossing a domain face
    (a class split into several local groups here has a row for each; the catalog sums)."""
    cls, crossing = _classes(local, merged)
    if cls.size == 0:
        return np.empty((0, 3), np.int64)
    return kernels.group_rows(local["root"], cls, local["ids"], crossing, min_members)


def _catalog(min_members: int, *tables) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class keys sorted, halo id of each key, counts in halo order, first ids)."""
    rows = np.concatenate(tables) if tables else np.empty((0, 3), np.int64)
    if rows.size == 0:
        e = np.empty(0, np.int64)
        return e, e, e, e
    order = np.argsort(rows[:, 0], kind="stable")
    rows = rows[order]
    starts = np.flatnonzero(np.r_[True, rows[1:, 0] != rows[:-1, 0]])
    keys = rows[starts, 0]
    counts = np.add.reduceat(rows[:, 1], starts)
    first = np.minimum.reduceat(rows[:, 2], starts)
    keep = counts >= min_members
    keys, counts, first = keys[keep], counts[keep], first[keep]
    rank = np.lexsort((first, -counts))  # decreasing size, ties by smallest id
    halo_of_key = np.empty(keys.size, np.int64)
    halo_of_key[rank] = np.arange(keys.size)
    return keys, halo_of_key, counts[rank], first[rank]


def _halo_ids(local: dict, merged, catalog):
    """Halo id (or -1) of each owned particle of one domain."""
    cls, _ = _classes(local, merged)
    xp = array_module(cls)
    keys, halo_of_key = xp.asarray(catalog[0]), xp.asarray(catalog[1])
    labels = xp.full(cls.size, -1, dtype=np.int64)
    if keys.size:
        at = xp.minimum(xp.searchsorted(keys, cls), keys.size - 1)
        hit = keys[at] == cls
        labels[hit] = halo_of_key[at[hit]]
    return labels


def _members(local: dict, merged, catalog, particle_mass: float, box_size) -> dict:
    """The domain's halo members sorted by halo id, where the domain's arrays are (on the
    GPU for a GPU domain: the catalog tasks run there and send only per-halo rows to the
    host); positions in float64, wrapped into the periodic box."""
    labels = _halo_ids(local, merged, catalog)
    xp = array_module(labels)
    sel = xp.flatnonzero(labels >= 0)
    sel = sel[xp.argsort(labels[sel], kind="stable")]
    mass = local.get("mass")

    def pick(key):
        arr = local[key]
        if arr is None:
            return None
        return xp.asarray(arr[host(sel)]) if array_module(arr) is not xp else arr[sel]

    return {
        "label": labels[sel],
        "index": pick("index"),
        "ids": pick("ids"),
        "friends": pick("friends"),
        "pos": _wrapped64(pick("pos"), box_size),
        "vel": None if local.get("vel") is None else pick("vel"),
        "mass": (xp.full(sel.size, particle_mass, dtype=np.float64) if mass is None
                 else pick("mass").astype(np.float64)),
    }


def _wrapped64(pos, box_size):
    """``pos`` in float64 (NumPy or CuPy), wrapped into ``[0, box_size)``."""
    pos = pos.astype(np.float64)
    if box_size is not None:
        xp = array_module(pos)
        pos = xp.mod(pos, box_size)
        pos[pos >= box_size] = 0.0
    return pos


def _domain_labels(local: dict, merged, catalog, bounds: np.ndarray) -> list:
    """(global index, halo id or -1) of one domain's owned particles, split by snapshot chunk."""
    # owned rows are in increasing index order (DomainPart)
    return rows_by_chunk(bounds, local["index"], _halo_ids(local, merged, catalog))


def _occupied(pieces: list) -> np.ndarray:
    """The snapshot chunks of which a domain's :func:`_domain_labels` pieces hold rows."""
    return np.flatnonzero([index.shape[0] > 0 for index, _ in pieces])


def _labels_in_chunk_order(layout: DomainLayout, per_domain: list, chunks_of: list, token: str,
                           meta) -> da.Array:
    """The way back (:meth:`~cosmo_dask.spatial.layout.DomainLayout.gather`): the
    persisted per-domain label pieces -> labels in snapshot order, chunk ``i`` one
    ``fof-labels`` task reading a piece of each domain holding its rows."""
    g = TaskGraph(per_domain)
    (labels,) = layout.gather(g, [g.ref(dl) for dl in per_domain], [("labels", (), meta)],
                              token=token, chunks_of=chunks_of, fill=-1)
    return labels


# ----------------------------------------------------------------------------- API
def _default_domains(snap, ghost: float) -> int:
    """A cube number of domains: ~4 per thread (load balance on clustered data), at least
    N / DOMAIN_PARTICLES, at most ``MAX_DOMAIN_CUBE^3`` (512); one for small snapshots."""
    n = snap.n_particles
    if n < SMALL_SNAPSHOT:
        return 1
    if snap.device == "gpu":  # one big domain per GPU worker (a domain must fit on a GPU)
        target = max(math.ceil(n / GPU_DOMAIN_PARTICLES), worker_count())
    else:
        target = max(math.ceil(n / DOMAIN_PARTICLES), 4 * worker_threads())
    cube = min(MAX_DOMAIN_CUBE, math.ceil(target ** (1 / 3) - 1e-9))
    if snap.box_size is not None:
        while cube > 1 and ghost >= snap.box_size / cube:
            cube -= 1
    return cube**3


@dataclass
class FOFGraph:
    """What the FOF graph leaves behind: the labels, and (optionally) the persisted
    per-domain member tables that catalog tasks read."""

    result: FOFLabels
    members: list | None
    box_size: float | None


def run_fof(snap, linking_length: float = LINKING_LENGTH_DEFAULT, *, absolute: bool = False,
            min_members: int = MIN_MEMBERS_DEFAULT, min_friends: int = MIN_FRIENDS_DEFAULT,
            n_domains: int | tuple[int, int, int] | None = None,
            with_members: bool = False, count_friends: bool = False) -> FOFGraph:
    """Build and run the FOF graph (see :func:`fof_labels` for the parameters, which the
    caller has checked with :func:`cosmo_dask.halos.parameters.check_fof`).

    With ``with_members`` the per-domain member tables (halo-sorted owned
    members: label, index, ids, friends, pos, vel, mass) are persisted too; their
    ``friends`` (friend counts) are None unless ``count_friends`` (or
    ``min_friends > 1``, whose kernel counts friends anyway).
    """
    ll = box_linking_length(snap, linking_length, absolute)
    ghost = ll if min_friends == 1 else 2.0 * ll
    params = {"linking_length": ll, "linking_length_input": float(linking_length),
              "absolute": bool(absolute), "min_members": int(min_members),
              "min_friends": int(min_friends)}
    n = snap.n_particles
    if n == 0:
        empty = FOFLabels(da.empty(0, dtype=np.int64, chunks=1), np.empty(0, np.int64),
                          np.empty(0, np.int64), ll, params)
        return FOFGraph(empty, [] if with_members else None, snap.box_size)
    if n_domains is None:
        n_domains = _default_domains(snap, ghost)
    if snap.box_size is not None:
        grid = domain_grid(n_domains, box_size=snap.box_size)
    else:
        lo, hi = compute(snap.pos.min(axis=0), snap.pos.max(axis=0), label="bounding box")
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise SnapshotError(f"{snap.source or 'snapshot'}: non-finite positions")
        grid = domain_grid(n_domains, bounds=(np.asarray(lo), np.asarray(hi)))
    grid.check_ghost_width(ghost, what="linking length" if min_friends == 1
                           else "ghost width (2 x linking length for min_friends > 1)")
    params["n_domains"] = list(grid.shape)

    extra = {}
    if snap.ids is not None:
        extra["ids"] = snap.ids
    if with_members:
        if snap.vel is not None:
            extra["vel"] = snap.vel
        if snap.mass is not None:
            extra["mass"] = snap.mass
    device = snap.device
    layout = decompose(snap.pos, grid, ghost_width=ghost, name="fof")
    parts = layout.exchange(**extra)
    periods = grid.kernel_periods
    bounds = layout.bounds
    pm = snap.particle_mass if snap.particle_mass is not None else 1.0
    # every input of the tasks below (the parts' keys hash positions, ids, vel, mass, grid)
    token = tokenize([p.key for p in parts], periods, ll, min_members, min_friends,
                     with_members, count_friends, device, bounds, pm, snap.box_size)
    g = TaskGraph(parts)
    locals_ = [g.add((f"fof-local-{token}", d), _local, g.ref(p), grid, ll, min_friends,
                     with_members, count_friends) for d, p in enumerate(parts)]
    # the cross-domain links: each domain's ghosts go to their owners' fof-match (only
    # domains that touch), each match joins them with its own exported rows, in parallel;
    # the one fof-merge reads only the distinct links between different groups
    near = [grid.neighbours(d) for d in range(len(parts))]
    ghosts = [g.add((f"fof-ghosts-{token}", d), _ghosts_by_owner, lo_, near[d])
              for d, lo_ in enumerate(locals_)]
    links = [g.add((f"fof-match-{token}", d), _match, lo_,
                   tuple(near[s].index(d) for s in near[d]), *[ghosts[s] for s in near[d]])
             for d, lo_ in enumerate(locals_)]
    merged = g.add(f"fof-merge-{token}", _merge, *links)
    tables = [g.add((f"fof-count-{token}", d), _count, lo_, merged, min_members)
              for d, lo_ in enumerate(locals_)]
    catalog = g.add(f"fof-catalog-{token}", _catalog, min_members, *tables)
    per_domain = [g.add((f"fof-dlabels-{token}", d), _domain_labels, lo_, merged, catalog,
                        bounds) for d, lo_ in enumerate(locals_)]
    # the snapshot chunks each domain holds owned rows of: the way back reads only those
    occupied = [g.add((f"fof-occupied-{token}", d), _occupied, dl)
                for d, dl in enumerate(per_domain)]
    members = []
    if with_members:
        members = [g.add((f"fof-members-{token}", d), _members, lo_, merged, catalog, pm,
                         snap.box_size) for d, lo_ in enumerate(locals_)]
    persisted = g.persist([r.key for r in (catalog, *occupied, *per_domain, *members)],
                          label="friends-of-friends")
    nd = len(parts)
    catalog_p, occupied_p = persisted[0], persisted[1:1 + nd]
    per_domain_p = persisted[1 + nd:1 + 2 * nd]
    members_p = list(persisted[1 + 2 * nd:])
    (_, _, counts, first), *chunks_of = compute(catalog_p, *occupied_p, label=None)
    labels = _labels_in_chunk_order(layout, per_domain_p, chunks_of, token,
                                    empty_meta(snap.pos, 1, np.int64))
    result = FOFLabels(labels, np.asarray(counts), np.asarray(first), ll, params)
    return FOFGraph(result, members_p if with_members else None, snap.box_size)


def fof_labels(snap, linking_length: float = LINKING_LENGTH_DEFAULT, *,
               absolute: bool = False, min_members: int = MIN_MEMBERS_DEFAULT,
               min_friends: int = MIN_FRIENDS_DEFAULT,
               n_domains: int | tuple[int, int, int] | None = None) -> FOFLabels:
    """Friends-of-friends groups of a snapshot, computed domain by domain.

    Parameters
    ----------
    snap : Snapshot
    linking_length : float
        In units of the mean interparticle spacing ``box_size / N^(1/3)``
        (default 0.2), or in box units with ``absolute=True`` (required for
        isolated snapshots).
    min_members : int
        Groups with fewer members get label -1 (>= 2).
    min_friends : int
        1 for classic FOF; k > 1 for the DBSCAN-like variant in which
        particles with fewer than k friends join no group and carry no links.
    n_domains : int or (int, int, int), optional
        Domain count; each is one ``fof-local`` task. Default: one for fewer
        than 2^17 particles, else a cube number with about four domains per
        worker thread and at most 2^21 particles each (at most 512); on GPU
        snapshots at least one per GPU worker and at most 2^27 particles each.

    Returns
    -------
    FOFLabels
        Labels stay lazy (backed by persisted per-domain results); the per-halo
        arrays are computed.
    """
    check_fof(snap, linking_length, absolute=absolute, min_members=min_members,
              min_friends=min_friends, centers=(), n_domains=n_domains)
    return run_fof(snap, linking_length, absolute=absolute, min_members=min_members,
                   min_friends=min_friends, n_domains=n_domains).result
