"""``cosmo_dask.halos.subhalos`` (defined here): bound substructure inside FOF halos.

The method: a phase-space friends-of-friends inside each FOF host, hierarchical with an
adaptive linking length as in ROCKSTAR (Behroozi, Wechsler & Wu 2013), followed by
iterative unbinding of every candidate as in SUBFIND (Springel et al. 2001). It works on
one snapshot and its FOF halos (``subhalos(snap, halos)``), with nothing from earlier
outputs; HBT-style tracking (Han et al. 2012, 2018) would follow the previous output's
subhalos through their particles and so needs the simulation's history and every
output's member ids, which a single snapshot and catalog do not carry.

Per host (its members' positions unwrapped around its first member, so the rest is
open space):

1. **Seeds.** The host's members in 6-D, positions scaled by the host's 1-D position
   dispersion ``sigma_x`` and velocities by its 1-D velocity dispersion ``sigma_v``
   (both about the host's means). The linking length is adaptive: the
   ``link_fraction`` quantile (ROCKSTAR's 0.7) of the particles' 6-D nearest-neighbour
   distances, so that that fraction of the particles has a friend. The groups of at
   least ``min_members`` are split again, each in its own scaling, until no group of
   ``min_members`` remains; the last groups of each branch are the *seeds*.
2. **Assignment.** Going down the hierarchy, the particles of a group that fell in
   none of its subgroups go to the nearest subgroup in that subgroup's phase-space
   metric ``|x - x_g|^2 / sigma_x,g^2 + |v - v_g|^2 / sigma_v,g^2`` (ROCKSTAR's; the
   means and 1-D dispersions of the subgroup's particles), or stay with the group itself
   (a seed of its own, in its broader metric) when that is nearer and at least
   ``min_members`` of its particles are in no subgroup: a host whose particles
   dissolve into the loose remainder at some level keeps them instead of handing them
   to its densest satellite. Seeds closer than ``MERGE_SIGMAS`` to a larger seed (in
   the metric of twice the smaller of their squared dispersions) join it: the Poisson
   splits of one core are one structure.
3. **Unbinding.** The seed whose core lies nearest the host's centre of mass and mean
   velocity (in the host's metric) is the host's central; every other seed, with the
   particles it owns, is a satellite candidate. Each candidate loses, in turns, the
   particles of positive energy ``e = phi + |v - v_c + a H (x - x_c)|^2 / 2`` (at most a
   quarter of its particles a turn, the most energetic first), ``phi`` the candidate's
   own potential (physical: ``G / a`` over the softened comoving separations), ``v_c``
   its members' mean velocity and ``x_c`` its most-bound (lowest ``phi``) member,
   recomputed each turn, until none is unbound; it is kept when ``min_members`` remain.
   The potentials come from the project's kernels only: the exact pairwise sum
   (:data:`cosmo_dask.halos.dispatch.segment_potentials`, every candidate of every host
   of a batch in one call per turn) for candidates of at most ``tree_threshold``
   particles, the octree (:data:`cosmo_dask.gravity.dispatch.tree_forces`) above.
4. **The central** (subhalo 0 of each host, ``is_central``): every member of the host
   that no satellite kept (the central seed's, the unbound ones of the satellites)
   unbound in the same way. A host whose central keeps fewer than ``min_members`` has
   no central row.

Distribution: the members of the hosts are gathered per batch of hosts by the one
shuffle of halo members (:func:`cosmo_dask.halos.members.scatter_members`, as the
member ranking at simulation outputs): each snapshot chunk sends its host members to
the batch of consecutive hosts holding them, batches of about equal member counts
(one task per chunk), and each batch task finds the
subhalos of its hosts; no task sees more than its batch's members. The 6-D groups are
found on the host (scipy's k-d tree); the potentials run where the snapshot's chunks
live (CuPy chunks: the GPU kernels of the two contracts).

Cosmology: with a ``scale_factor``, a ``cosmology`` and physical units on the snapshot
(positions comoving, velocities peculiar), ``a`` and ``H(a)`` enter the energies as
above; otherwise ``a = 1`` and no Hubble flow (an isolated or Newtonian system).
"""

from __future__ import annotations

import math
import time

import numpy as np
import xarray as xr
from dask.base import tokenize

from ..core.backend import array_module, empty_meta, host
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from ..units.products import product_units
from .members import bucket_edges, scatter_members
from .parameters import (
    SUBHALO_LINK_FRACTION_DEFAULT,
    SUBHALO_MIN_MEMBERS_DEFAULT,
    SUBHALO_THETA_DEFAULT,
    SUBHALO_TREE_THRESHOLD_DEFAULT,
    check_subhalos,
)
from .subhalo_result import SubhaloResult

__all__ = ["find_subhalos", "plot_subhalo_mass_function", "subhalo_mass_function",
           "subhalos"]

#: seeds this close (squared phase-space metric of the larger one) merge into it
MERGE_SIGMAS = 3.0
#: at most this fraction of a candidate's particles leaves in one unbinding turn
UNBIND_FRACTION = 0.25
#: deepest hierarchy of 6-D groups (each level keeps at most ``link_fraction`` of its
#: parent's particles, so 40 levels reach 20 particles from more than 10^7 at 0.7)
MAX_DEPTH = 40

#: the quantity of :func:`~cosmo_dask.units.products.product_units` each catalog
#: variable is in
VARIABLE_QUANTITIES = {
    "host": "dimensionless", "n_bound": "dimensionless", "mass": "mass",
    "position": "length", "velocity": "velocity", "v_max": "velocity", "r_max": "length",
    "mbp_id": "dimensionless", "mbp_index": "dimensionless", "is_central": "dimensionless",
    "n_candidates": "dimensionless",
}


# ----------------------------------------------------------------------------- 6-D FOF
def _scaled(pos, vel):
    """The 6-D coordinates of ``pos``/``vel`` scaled by their 1-D dispersions."""
    x = pos - pos.mean(axis=0)
    v = vel - vel.mean(axis=0)
    sx = math.sqrt(max(float((x * x).sum()) / (3 * len(x)), 0.0))
    sv = math.sqrt(max(float((v * v).sum()) / (3 * len(v)), 0.0))
    return np.hstack([x / (sx or 1.0), v / (sv or 1.0)])


def _fof6(u, fraction):
    """Labels of the 6-D friends-of-friends groups of ``u`` at the adaptive linking
    length (the ``fraction`` quantile of the nearest-neighbour distances)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    tree = cKDTree(u)
    d, _ = tree.query(u, k=2)
    ll = float(np.quantile(d[:, 1], fraction))
    pairs = tree.query_pairs(ll, output_type="ndarray") if ll > 0 else np.empty((0, 2), int)
    n = len(u)
    graph = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])),
                       shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _seed_stats(pos, vel, rows):
    x, v = pos[rows], vel[rows]
    xc, vc = x.mean(axis=0), v.mean(axis=0)
    sx = math.sqrt(float(((x - xc) ** 2).sum()) / (3 * len(rows)))
    sv = math.sqrt(float(((v - vc) ** 2).sum()) / (3 * len(rows)))
    tiny = 1e-12
    return xc, vc, max(sx, tiny), max(sv, tiny)


def _merge(pos, vel, cores, owned):
    """Merge seeds lying within :data:`MERGE_SIGMAS` of a larger seed (in the metric of
    twice the smaller of their squared dispersions, so that a broad seed does not swallow
    a compact one): the Poisson splits of one structure."""
    if len(cores) < 2:
        return cores, owned
    stats = [_seed_stats(pos, vel, c) for c in cores]
    order = sorted(range(len(cores)), key=lambda k: -len(cores[k]))
    target = list(range(len(cores)))
    for i, a in enumerate(order):
        if target[a] != a:
            continue
        xa, va, sxa, sva = stats[a]
        for b in order[i + 1:]:
            if target[b] != b:
                continue
            xb, vb, sxb, svb = stats[b]
            d2 = (((xb - xa) ** 2).sum() / (2 * min(sxa, sxb) ** 2)
                  + ((vb - va) ** 2).sum() / (2 * min(sva, svb) ** 2))
            if d2 < MERGE_SIGMAS**2:
                target[b] = a
    keep = sorted(set(target))
    join = [[b for b in range(len(cores)) if target[b] == k] for k in keep]
    return ([np.concatenate([cores[b] for b in j]) for j in join],
            [np.concatenate([owned[b] for b in j]) for j in join])


def _nearest(pos, vel, rows, groups):
    """Index of the nearest of ``groups`` (arrays of rows) to each of ``rows`` in each
    group's phase-space metric (its means and 1-D dispersions)."""
    if len(groups) == 1:
        return np.zeros(len(rows), np.int64)
    x, v = pos[rows], vel[rows]
    best = np.full(len(rows), np.inf)
    out = np.zeros(len(rows), np.int64)
    for k, g in enumerate(groups):
        xc, vc, sx, sv = _seed_stats(pos, vel, g)
        d = ((x - xc) ** 2).sum(axis=1) / sx**2 + ((v - vc) ** 2).sum(axis=1) / sv**2
        closer = d < best
        best[closer] = d[closer]
        out[closer] = k
    return out


def _split(pos, vel, rows, extra, min_members, fraction, depth):
    """``(cores, owned)``: the seeds below the 6-D group ``rows`` (each the rows of its
    deepest group, its *core*) and the rows each seed owns: its core, the particles of
    the groups above it that fell in no subgroup and were handed down to its branch,
    and its share of ``extra`` (particles handed down to this group)."""
    if len(rows) < 2 * min_members or depth >= MAX_DEPTH:
        return [rows], [np.concatenate([rows, extra])]
    lab = _fof6(_scaled(pos[rows], vel[rows]), fraction)
    counts = np.bincount(lab)
    big = np.flatnonzero(counts >= min_members)
    if big.size == 0:
        return [rows], [np.concatenate([rows, extra])]
    groups = [rows[lab == g] for g in big]
    loose = rows[counts[lab] < min_members]
    rest = np.concatenate([loose, extra])
    # each to the nearest subgroup, or to this group itself (its own broader metric) when
    # that is nearer and enough of its particles are in no subgroup
    keep = len(loose) >= min_members
    near = _nearest(pos, vel, rest, groups + ([rows] if keep else []))
    cores, owned = [], []
    for j, grp in enumerate(groups):
        c, o = _split(pos, vel, grp, rest[near == j], min_members, fraction, depth + 1)
        cores += c
        owned += o
    if keep:
        cores.append(loose)
        owned.append(rest[near == len(groups)])
    return _merge(pos, vel, cores, owned)


# ----------------------------------------------------------------------------- unbinding
class _Energy:
    """What the energies need: ``G / a``, ``a H(a)`` (0 without cosmology), the
    softening, the tree threshold and opening angle, and where the kernels run."""

    def __init__(self, G, a, a_h, softening, tree_threshold, theta, like):  # noqa: N803
        self.g_phys = G / a
        self.a_h = a_h
        self.softening = softening
        self.tree_threshold = tree_threshold
        self.theta = theta
        self.like = like

    def potentials(self, pos, mass, starts):
        """Potentials of every particle due to its own segment (physical, velocity^2)."""
        from ..gravity import dispatch as gravity_kernels
        from . import dispatch as kernels

        xp = array_module(self.like)
        out = np.zeros(len(pos))
        sizes = np.diff(starts)
        small = sizes <= self.tree_threshold
        if small.any():
            sel = np.flatnonzero(np.repeat(small, sizes))
            sub = np.r_[0, np.cumsum(sizes[small])].astype(np.int64)
            pot = kernels.segment_potentials(xp.asarray(pos[sel]), xp.asarray(mass[sel]),
                                             xp.asarray(sub), softening=self.softening,
                                             G=self.g_phys)
            out[sel] = host(pot)
        for s in np.flatnonzero(~small):
            a, b = starts[s], starts[s + 1]
            _, pot = gravity_kernels.tree_forces(
                xp.asarray(pos[a:b]), xp.asarray(mass[a:b]), G=self.g_phys, theta=self.theta,
                softening=self.softening, precision="float64", potential=True)
            out[a:b] = host(pot)
        return out

    def energies(self, pos, vel, mass, pot):
        """Specific energies of one candidate's members about its most-bound member and
        mean velocity; returns ``(e, mbp row)``."""
        c = int(np.argmin(pot))
        vc = (mass[:, None] * vel).sum(axis=0) / mass.sum()
        dv = vel - vc + self.a_h * (pos - pos[c])
        return pot + 0.5 * (dv * dv).sum(axis=1), c


def _unbind(pos, vel, mass, candidates, min_members, energy: _Energy):
    """Iterative unbinding of every candidate (arrays of rows) at once; returns per
    candidate the bound rows (None when fewer than ``min_members`` stay) and their
    potentials."""
    current = [np.asarray(c) for c in candidates]
    done = [None] * len(current)
    active = [k for k in range(len(current)) if len(current[k]) >= min_members]
    while active:
        rows = np.concatenate([current[k] for k in active])
        starts = np.r_[0, np.cumsum([len(current[k]) for k in active])].astype(np.int64)
        pot = energy.potentials(pos[rows], mass[rows], starts)
        still = []
        for j, k in enumerate(active):
            r = rows[starts[j]:starts[j + 1]]
            p = pot[starts[j]:starts[j + 1]]
            e, _ = energy.energies(pos[r], vel[r], mass[r], p)
            unbound = np.flatnonzero(e > 0)
            if unbound.size == 0:
                done[k] = (r, p)
                continue
            cap = max(1, int(UNBIND_FRACTION * len(r)))
            if unbound.size > cap:
                unbound = unbound[np.argsort(e[unbound])[::-1][:cap]]
            keep = np.ones(len(r), bool)
            keep[unbound] = False
            if keep.sum() >= min_members:
                current[k] = r[keep]
                still.append(k)
        active = still
    return done


def _circular(pos, mass, centre, g_phys, softening):
    """``(V_max, R_max)`` of the circular-velocity curve ``sqrt(G M(<= r) / (a r))`` of
    members about ``centre``, its points at the members' radii beyond one softening
    length (inside it the curve measures the softening, not the subhalo)."""
    r = np.sqrt(((pos - centre) ** 2).sum(axis=1))
    order = np.argsort(r)
    r, m = r[order], np.cumsum(mass[order])
    ok = r > max(softening, 0.0)
    if not ok.any():
        return 0.0, 0.0
    v = np.sqrt(g_phys * m[ok] / r[ok])
    k = int(np.argmax(v))
    return float(v[k]), float(r[ok][k])


def find_subhalos(pos, vel, mass, bounds, *, min_members, link_fraction, energy: _Energy):
    """The subhalos of hosts: for each host ``s`` (rows ``bounds[s]:bounds[s+1]``), a
    list of ``(rows, potentials, is_central, n_candidate)``, the central first, then the
    satellites by decreasing bound count. ``pos`` unwrapped per host (open coordinates),
    float64 arrays. The seeds are found host by host; every host's satellite candidates
    are then unbound together (one potential call per turn for all of them), and every
    host's remainder (its central) after them."""
    sats, sat_host = [], []
    for s in range(len(bounds) - 1):
        rows = np.arange(bounds[s], bounds[s + 1])
        if rows.size < min_members:
            continue
        cores, seeds = _split(pos, vel, rows, np.empty(0, np.int64), min_members,
                              link_fraction, 0)
        xh, vh, sxh, svh = _seed_stats(pos, vel, rows)
        d2 = [((pos[c].mean(axis=0) - xh) ** 2).sum() / sxh**2
              + ((vel[c].mean(axis=0) - vh) ** 2).sum() / svh**2 for c in cores]
        central = int(np.argmin(d2))
        sats += [seed for k, seed in enumerate(seeds) if k != central]
        sat_host += [s] * (len(seeds) - 1)
    out = [[] for _ in range(len(bounds) - 1)]
    taken = np.zeros(len(pos), bool)
    for seed, h, b in zip(sats, sat_host, _unbind(pos, vel, mass, sats, min_members, energy),
                          strict=True):
        if b is not None:
            taken[b[0]] = True
            out[h].append((b[0], b[1], False, len(seed)))
    hosts = [s for s in range(len(bounds) - 1) if bounds[s + 1] - bounds[s] >= min_members]
    rests = [bounds[s] + np.flatnonzero(~taken[bounds[s]:bounds[s + 1]]) for s in hosts]
    for s, rest, cen in zip(hosts, rests, _unbind(pos, vel, mass, rests, min_members, energy),
                            strict=True):
        out[s].sort(key=lambda t: -len(t[0]))
        if cen is not None:
            out[s].insert(0, (cen[0], cen[1], True, len(rest)))
    return out


# ----------------------------------------------------------------------------- graph tasks
def batch_subhalos(box, params, like, *pieces):
    """The subhalos of the hosts gathered in one batch: a dict of catalog columns (rows
    by host, central first) and the bound members' ``(index, row)`` pairs."""
    cols = [np.concatenate([p[k] if p[k] is not None else p["index"] for p in pieces])
            for k in ("label", "index", "pos", "vel", "mass", "ids")]
    order = np.lexsort((cols[1], cols[0]))
    lab, index, pos, vel, mass, ids = (c[order] for c in cols)
    energy = _Energy(params["G"], params["a"], params["a_h"], params["softening"],
                     params["tree_threshold"], params["theta"], like)
    rows = {k: [] for k in ("host", "n_bound", "mass", "position", "velocity", "v_max",
                            "r_max", "mbp_id", "mbp_index", "is_central", "n_candidates")}
    members_index, members_row = [], []
    if lab.size:
        starts = np.flatnonzero(np.r_[True, lab[1:] != lab[:-1]])
        bounds = np.r_[starts, lab.size]
    else:
        starts, bounds = np.empty(0, np.int64), np.zeros(1, np.int64)
    n_rows = 0
    upos = pos.copy()
    if box is not None:  # each host unwrapped around its first member
        first = np.repeat(pos[bounds[:-1]], np.diff(bounds), axis=0)
        d = pos - first
        upos = first + d - box * np.round(d / box)
    found = find_subhalos(upos, vel, mass, bounds, min_members=params["min_members"],
                          link_fraction=params["link_fraction"], energy=energy)
    for s in range(starts.size):
        for r, pot, central, n_cand in found[s]:
            c = r[int(np.argmin(pot))]
            m = mass[r]
            centre = upos[c].copy()
            vmax, rmax = _circular(upos[r], m, centre, energy.g_phys, energy.softening)
            if box is not None:
                centre = np.mod(centre, box)
                centre[centre >= box] = 0.0
            rows["host"].append(int(lab[bounds[s]]))
            rows["n_bound"].append(len(r))
            rows["mass"].append(float(m.sum()))
            rows["position"].append(centre)
            rows["velocity"].append((m[:, None] * vel[r]).sum(axis=0) / m.sum())
            rows["v_max"].append(vmax)
            rows["r_max"].append(rmax)
            rows["mbp_id"].append(int(ids[c]))
            rows["mbp_index"].append(int(index[c]))
            rows["is_central"].append(bool(central))
            rows["n_candidates"].append(int(n_cand))
            members_index.append(index[r])
            members_row.append(np.full(len(r), n_rows, np.int64))
            n_rows += 1
    out = {k: np.asarray(v) for k, v in rows.items()}
    for k in ("position", "velocity"):
        out[k] = out[k].reshape(-1, 3)
    members = (np.concatenate(members_index) if members_index else np.empty(0, np.int64),
               np.concatenate(members_row) if members_row else np.empty(0, np.int64))
    return out, members


def reduce_subhalos(*parts):
    """The batches' rows as one catalog, ordered by host (central first, then by bound
    count), and every bound member's ``(index, subhalo)`` sorted by index."""
    keys = ("host", "n_bound", "mass", "position", "velocity", "v_max", "r_max", "mbp_id",
            "mbp_index", "is_central", "n_candidates")
    empty = {"position": np.empty((0, 3)), "velocity": np.empty((0, 3)),
             "is_central": np.empty(0, bool), "mass": np.empty(0), "v_max": np.empty(0),
             "r_max": np.empty(0)}
    cols = {k: np.concatenate([empty.get(k, np.empty(0, np.int64))]
                              + [p[0][k] for p in parts if p[0]["host"].size])
            for k in keys}
    offsets = np.cumsum([0] + [p[0]["host"].size for p in parts])
    index = np.concatenate([np.empty(0, np.int64)] + [p[1][0] for p in parts])
    sub = np.concatenate([np.empty(0, np.int64)]
                         + [p[1][1] + o for p, o in zip(parts, offsets[:-1], strict=True)])
    order = np.lexsort((-cols["n_bound"], ~cols["is_central"], cols["host"]))
    cols = {k: v[order] for k, v in cols.items()}
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    sub = rank[sub] if sub.size else sub
    by_index = np.argsort(index, kind="stable")
    return cols, (index[by_index], sub[by_index])


def _labels_block(block, members, block_info=None):
    """Subhalo label of each particle of one chunk (-1: bound to none)."""
    start, stop = block_info[0]["array-location"][0]
    index, sub = members
    out = np.full(stop - start, -1, np.int64)
    lo, hi = np.searchsorted(index, [start, stop])
    out[index[lo:hi] - start] = sub[lo:hi]
    return out


# ----------------------------------------------------------------------------- API
def _cosmology_terms(snap) -> tuple[float, float]:
    """``(a, a H(a))``: ``a H(a)`` in the snapshot's velocity per length (0 without a
    cosmology or physical units: no Hubble flow), ``a`` 1 without a scale factor."""
    from ..units.hubble import velocity_to_comoving_length

    a = snap.scale_factor
    if a is None or not a > 0:
        return 1.0, 0.0
    try:
        return float(a), 1.0 / velocity_to_comoving_length(snap.units, a, snap.cosmology,
                                                           what="subhalos")
    except ParameterError:
        return float(a), 0.0


def _open_halos(halos):
    from .result import HaloResult, open_catalog

    if isinstance(halos, HaloResult):
        return halos
    if isinstance(halos, (str, bytes)) or hasattr(halos, "__fspath__"):
        return open_catalog(halos)
    raise ParameterError(f"subhalos: halos must be a HaloResult or a halo store path, got "
                         f"{type(halos).__name__}")


def _check_same_particles(snap, halos, n_check: int = 4) -> None:
    """ParameterError unless the halos were found on these particles: the positions of a
    few halos' most-bound particles (the catalog's ``mbp_index`` rows, read from ``snap``)
    must equal the catalog's ``mbp_position``. Halos of another output of the same run
    have the same particle count and box, so the metadata alone cannot tell them apart.
    Catalogs without most-bound centres are not checked this way."""
    cat = halos.catalog
    if "mbp_index" not in cat or "mbp_position" not in cat or halos.n_halos == 0:
        return
    idx = np.asarray(cat["mbp_index"].values[:n_check], np.int64)
    ok = idx >= 0
    if not ok.any():
        return
    want = np.asarray(cat["mbp_position"].values[:n_check], np.float64)[ok]
    got = np.asarray(host(snap.pos[np.sort(idx[ok])].compute()), np.float64)
    got = got[np.argsort(np.argsort(idx[ok]))]
    scale = float(snap.box_size) if snap.box_size else float(np.abs(want).max() or 1.0)
    if not np.allclose(got, want, rtol=0.0, atol=1e-5 * scale):
        where = halos.parameters.get("snapshot") or "the halo catalog"
        target = snap.source or "the snapshot"
        raise ParameterError(f"subhalos: the halos of {where} were not found on these "
                             f"particles (their most-bound particles sit elsewhere in "
                             f"{target}): give the halos of this snapshot")


def subhalos(snap, halos, *, method: str = "6dfof",
             min_members: int = SUBHALO_MIN_MEMBERS_DEFAULT,
             link_fraction: float = SUBHALO_LINK_FRACTION_DEFAULT,
             softening: float | None = None,
             tree_threshold: int = SUBHALO_TREE_THRESHOLD_DEFAULT,
             n_batches: int | None = None, labels: bool = False) -> SubhaloResult:
    """Bound subhalos inside the friends-of-friends halos of a snapshot.

    A hierarchical phase-space (6-D) FOF inside each host with ROCKSTAR's adaptive
    linking length, then iterative unbinding of each candidate (module docstring):
    chosen over HBT-style tracking because it needs one snapshot and its halos, not
    the earlier outputs.

    Parameters
    ----------
    snap : Snapshot
        With velocities (and ids, else the particle index stands in for them).
    halos : HaloResult or path
        FOF halos of ``snap`` (:func:`cosmo_dask.halos.fof`, or a store written by
        ``HaloResult.to_zarr`` / ``cosmo-dask halos``).
    method : {"6dfof"}
        The finder (the one implemented).
    min_members : int
        Bound particles a subhalo needs (default 20, >= 5); also the smallest 6-D group
        that seeds one.
    link_fraction : float
        In (0, 1): each level's 6-D linking length links this fraction of its particles
        to a friend (default 0.7, ROCKSTAR's).
    softening : float, optional
        Plummer softening of the unbinding potentials, comoving length units (default:
        the catalog's ``potential_softening``).
    tree_threshold : int
        Candidates above this many particles get octree potentials (opening angle
        0.5), smaller ones exact pairwise ones (default 20000).
    n_batches : int, optional
        Batches of hosts (tasks); default the snapshot's chunk count.
    labels : bool
        Also return each particle's subhalo (row of the catalog, -1 for none).

    Returns
    -------
    SubhaloResult
        ``catalog`` over dim ``subhalo`` (and ``axis``), ordered by host, each host's
        central first, then its satellites by decreasing bound count: ``host`` (FOF halo
        index), ``n_bound``, ``mass`` (bound), ``position`` (the most-bound member's,
        in the box), ``velocity`` (bound members' mass-weighted mean, the snapshot's
        velocity unit), ``v_max`` (physical, velocity unit) and ``r_max`` (comoving
        length unit) of the bound members' circular-velocity curve about the
        most-bound member (radii beyond one softening length), ``mbp_id``,
        ``mbp_index``, ``is_central``, ``n_candidates`` (particles before unbinding);
        each with a ``units`` attribute.

    Raises
    ------
    ParameterError
        Before any work: an unknown method, bad numbers, a snapshot without
        velocities, halos of another snapshot (particle count or box differ), no halos.
    """
    halos = _open_halos(halos)
    soft = check_subhalos(snap, halos, method=method, min_members=min_members,
                          link_fraction=link_fraction, softening=softening,
                          tree_threshold=tree_threshold, n_batches=n_batches)
    _check_same_particles(snap, halos)
    t0 = time.perf_counter()
    box = snap.box_size
    G = snap.G if snap.G is not None else 1.0  # noqa: N806
    a, a_h = _cosmology_terms(snap)
    params = {"G": float(G), "a": a, "a_h": a_h, "softening": soft,
              "tree_threshold": int(tree_threshold), "theta": SUBHALO_THETA_DEFAULT,
              "min_members": int(min_members), "link_fraction": float(link_fraction)}
    pos, vel = snap.pos, snap.vel
    chunks = pos.chunks[0]
    lab = halos.labels
    if lab.chunks[0] != chunks:
        lab = lab.rechunk((chunks,))
    mass = snap.particle_masses()
    ids = snap.ids
    n_members = np.asarray(halos.catalog["n_members"].values, np.int64)
    edges = bucket_edges(n_members, int(n_batches) if n_batches is not None
                         else max(1, len(chunks)))
    nb = edges.size - 1
    token = tokenize(lab, pos, vel, mass, ids, params, edges, box)
    like = empty_meta(pos, 1, np.float64)
    inputs = [lab, pos, vel, mass] + ([ids] if ids is not None else [])
    g = TaskGraph(inputs)
    offsets = np.r_[0, np.cumsum(chunks)]
    gathered = [g.add_split((f"subhalo-gather-{token}", c), scatter_members,
                            g.chunk(lab, c), g.chunk(pos, c, 0), g.chunk(vel, c, 0),
                            None if ids is None else g.chunk(ids, c), g.chunk(mass, c),
                            None, edges, int(offsets[c]), n=nb)
                for c in range(len(chunks))]
    batches = [g.add((f"subhalo-batch-{token}", b), batch_subhalos, box, params, like,
                     *[e[b] for e in gathered]) for b in range(nb)]
    reduced = g.add(f"subhalo-reduce-{token}", reduce_subhalos, *batches)
    cols, members = g.compute([reduced.key], label="subhalos")[0]

    units = snap.units or {}
    mass_unit = units.get("mass", "particle masses" if snap.particle_mass is None else None)
    pu = product_units({**units, **({"mass": mass_unit} if mass_unit else {})},
                       g_one=snap.G is None)
    data = {k: ((("subhalo", "axis") if v.ndim == 2 else ("subhalo",)), v,
                {"units": pu[VARIABLE_QUANTITIES[k]]}) for k, v in cols.items()}
    n_sub = int(cols["host"].size)
    catalog = xr.Dataset(data, coords={"subhalo": np.arange(n_sub), "axis": ["x", "y", "z"]})
    attrs = {"method": method, "box_size": box, "length_unit": units.get("length"),
             "mass_unit": mass_unit, "softening": soft, "G": float(G), "scale_factor": a,
             "hubble_a_h": a_h, "min_members": int(min_members),
             "link_fraction": float(link_fraction), "n_hosts": halos.n_halos}
    catalog.attrs = {k: v for k, v in attrs.items() if v is not None}
    parameters = {"method": method, "min_members": int(min_members),
                  "link_fraction": float(link_fraction), "softening": soft,
                  "tree_threshold": int(tree_threshold), "n_batches": nb,
                  "snapshot": snap.source, "halos": halos.parameters.get("snapshot"),
                  "seconds": round(time.perf_counter() - t0, 3)}
    label_array = None
    if labels:
        label_array = lab.map_blocks(_labels_block, members, dtype=np.int64,
                                     meta=np.empty(0, np.int64))
    return SubhaloResult(catalog, label_array, parameters)



# ----------------------------------------------------------------------------- mass function
def subhalo_mass_function(result, *, min_members: int | None = None,
                          relative: bool = False) -> xr.Dataset:
    """The cumulative satellite mass function ``N(> m)`` and its power-law slope.

    Parameters
    ----------
    result : SubhaloResult or xarray.Dataset
        A subhalo catalog (its satellites, ``is_central`` False, are counted).
    min_members : int, optional
        Smallest satellite counted and the fit's lower limit, in bound particles
        (default: the catalog's ``min_members``).
    relative : bool
        Masses relative to each satellite's host central (``m / M_central``) instead of
        in the catalog's mass unit.

    Returns
    -------
    xarray.Dataset
        Over dim ``satellite`` (decreasing mass): ``mass`` and ``n_above`` (satellites of
        at least that mass). Attributes: ``slope`` (the maximum-likelihood slope of
        ``dN/dm ~ m^-alpha`` between ``mass_min`` (the limit, or the smallest satellite
        counted when larger) and the largest satellite, as the
        cumulative slope ``1 - alpha``), ``slope_error`` (its standard error), ``n``,
        ``mass_min``, ``mass_max``, ``mass_unit``.
    """
    cat = result.catalog if hasattr(result, "catalog") else result
    lim = int(cat.attrs.get("min_members", 1) if min_members is None else min_members)
    sat = ~np.asarray(cat["is_central"].values, bool)
    keep = sat & (np.asarray(cat["n_bound"].values) >= lim)
    mass = np.asarray(cat["mass"].values, np.float64)
    unit = cat["mass"].attrs.get("units", cat.attrs.get("mass_unit"))
    per_particle = float(np.median(mass / np.maximum(cat["n_bound"].values, 1))) if \
        mass.size else 1.0
    m_min = lim * per_particle
    if relative:
        host = np.asarray(cat["host"].values)
        central = np.asarray(cat["is_central"].values, bool)
        m_host = dict(zip(host[central], mass[central], strict=True))
        keep &= np.isin(host, host[central])
        ref = np.array([m_host.get(h, np.nan) for h in host])
        mass = mass / ref
        m_min = float(np.nanmin(mass[keep])) if keep.any() else np.nan
        unit = "1"
    m = np.sort(mass[keep])[::-1]
    n = m.size
    if n:  # the fit starts at the limit or the smallest satellite counted, the larger
        m_min = max(m_min, float(m[-1])) if np.isfinite(m_min) else float(m[-1])
    alpha, err = _truncated_power_law(m, m_min)
    ds = xr.Dataset({"mass": ("satellite", m, {"units": unit or ""}),
                     "n_above": ("satellite", np.arange(1, n + 1), {"units": "1"})})
    ds.attrs = {"slope": float(1.0 - alpha), "slope_error": float(err), "n": int(n),
                "mass_min": float(m_min), "mass_max": float(m[0]) if n else np.nan,
                "mass_unit": unit or ""}
    return ds


def _truncated_power_law(m, m_min):
    """``(alpha, error)``: the maximum-likelihood exponent of ``dN/dm ~ m^-alpha`` for
    masses ``m`` in ``[m_min, max(m)]`` (the power law truncated at the largest one, which
    the untruncated estimator ``1 + n / sum ln(m / m_min)`` is biased by), and its standard
    error from the likelihood's curvature; NaN for fewer than 3 masses."""
    from scipy.optimize import minimize_scalar

    n = m.size
    if n < 3 or not m.max() > m_min:
        return np.nan, np.nan
    x = np.log(m / m_min)
    s, top = float(x.sum()), float(x.max())

    def nll(alpha):  # minus the log-likelihood per mass, up to a constant
        k = 1.0 - alpha
        norm = math.log(abs(math.expm1(k * top) / k)) if abs(k) > 1e-12 else math.log(top)
        return alpha * s / n + norm

    res = minimize_scalar(nll, bounds=(0.0, 5.0), method="bounded",
                          options={"xatol": 1e-8})
    a, h = float(res.x), 1e-4
    curv = (nll(a + h) - 2 * nll(a) + nll(a - h)) / h**2 * n
    return a, (1.0 / math.sqrt(curv) if curv > 0 else np.nan)


def plot_subhalo_mass_function(result, *, ax=None, path=None, relative: bool = False):
    """Draw the cumulative satellite mass function and its fitted power law
    (:func:`subhalo_mass_function`, :func:`cosmo_dask.plot.subhalos.draw_subhalo_mass_function`);
    returns the axes (saved to ``path`` as PNG when given)."""
    from ..plot.figure import new_axes
    from ..plot.subhalos import draw_subhalo_mass_function

    ds = subhalo_mass_function(result, relative=relative)
    return draw_subhalo_mass_function(new_axes(ax, path), ds, path=path)
