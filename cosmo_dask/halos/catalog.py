"""Halo catalog: per-domain partial properties reduced per halo, and halo centres.

Works on the per-domain *member tables* that the FOF graph keeps (owned
particles with a halo label >= 0, sorted by label; positions in the domain's
frame, float64). Every task here reads one member table or one batch of
halos; the reductions see one small row per (domain, halo) pair.

* mass, centre of mass (periodic-aware: each domain sums offsets from its own
  reference member; the reduction aligns the references by minimum image),
  mean velocity, most-connected particle (MCP: most friends, ties by smallest
  id), first member id;
* ``r_max``: a second pass (its tasks wait for the reduced centres of mass, in the same
  graph round), the largest member distance from the centre of mass;
* most-bound particle (MBP): halos whose members all sit in one domain are
  done there (``halo-mbp-local``); the others are gathered by halo into
  ``halo-mbp-batch`` tasks. The exact MBP comes from the
  :data:`~cosmo_dask.halos.dispatch.segment_mbp` contract, chosen by the
  snapshot's chunk type (``like``, a zero-size array of it): on CPU
  :func:`center_kernels.segment_mbp` (exact potentials only for the members that
  octree bounds and float32 sums within a rigorous error cannot rule out; the same
  answer as every potential), on GPU
  :func:`center_kernels_gpu.segment_mbp_gpu` (every potential, on the GPU);
  with a ``grid_threshold`` (default None: none), halos above it use the
  grid-Poisson approximation :func:`center_kernels.grid_mbp` (on the host).
"""

from __future__ import annotations

import numpy as np

from ..core.backend import array_module, host
from . import dispatch as kernels
from .center_kernels import grid_mbp, mcp_rows, member_potentials

#: default member count above which "mbp" uses the grid-Poisson approximation: None,
#: every halo's MBP exact (the octree bounds of :func:`center_kernels.segment_mbp` make
#: large halos about ``n log n``)
GRID_THRESHOLD = None


def _segments(labels):
    """Halo ids present in label-sorted ``labels`` and their segment starts (h+1), in
    ``labels``' array module (NumPy or CuPy)."""
    xp = array_module(labels)
    if labels.size == 0:
        return xp.empty(0, np.int64), xp.zeros(1, np.int64)
    starts = xp.flatnonzero(xp.concatenate([xp.ones(1, bool), labels[1:] != labels[:-1]]))
    return labels[starts], xp.concatenate([starts, xp.asarray([labels.size])]).astype(np.int64)


def _segment_of_members(halos, starts, labels):
    """The segment (0 .. h - 1) of each member of label-sorted ``labels``."""
    xp = array_module(labels)
    if xp is np:
        return np.repeat(np.arange(halos.size), np.diff(starts))
    return xp.searchsorted(halos, labels)  # CuPy's repeat takes no array of counts


def _min_image(d, box: float | None):
    return d if box is None else d - box * array_module(d).rint(d / box)


# ----------------------------------------------------------------------------- pass 1
def partial_props(members: dict, box: float | None) -> dict:
    """Per-halo partial sums of one domain's members, computed where the table is (NumPy
    or CuPy); the per-halo rows returned on the host."""
    lab = members["label"]
    xp = array_module(lab)
    halos, starts = _segments(lab)
    m, pos = members["mass"], members["pos"]
    first = starts[:-1]
    ref = pos[first] if halos.size else xp.empty((0, 3))
    seg = _segment_of_members(halos, starts, lab)
    dx = _min_image(pos - ref[seg], box)
    out = {
        "halo": halos,
        "count": xp.diff(starts),
        "mass": xp.add.reduceat(m, first) if halos.size else xp.empty(0),
        "ref": ref,
        "mdx": xp.add.reduceat(m[:, None] * dx, first, axis=0) if halos.size else ref,
    }
    if members.get("vel") is not None:
        v = members["vel"].astype(np.float64)
        out["mv"] = xp.add.reduceat(m[:, None] * v, first, axis=0) if halos.size else ref
    out = {k: host(v) for k, v in out.items()}
    if members.get("friends") is None:  # no friend counts: no MCP asked for
        return out
    # most-connected particle per halo: most friends, ties by smallest id (one pass over
    # the label-sorted members, no sort; on the host)
    friends, ids = host(members["friends"]), host(members["ids"])
    best = mcp_rows(friends, ids, host(starts))
    out["mcp_friends"] = friends[best]
    out["mcp_id"] = ids[best]
    rows = xp.asarray(best)
    out["mcp_index"] = host(members["index"][rows])
    out["mcp_pos"] = host(pos[rows]) if halos.size else np.empty((0, 3))
    return out


def reduce_props(n_halos: int, box: float | None, *partials: dict) -> dict:
    """Combine partial sums into per-halo mass, centre of mass, velocity and MCP."""
    mass = np.zeros(n_halos)
    ref = np.full((n_halos, 3), np.nan)
    mdx = np.zeros((n_halos, 3))
    mv = np.zeros((n_halos, 3))
    has_vel = all("mv" in p for p in partials) and bool(partials)
    has_mcp = all("mcp_friends" in p for p in partials)
    mcp = np.full(n_halos, -1, np.int64)
    mcp_f = np.full(n_halos, -1, np.int64)
    mcp_id = np.full(n_halos, np.iinfo(np.int64).max)
    mcp_pos = np.full((n_halos, 3), np.nan)
    for p in partials:
        h = p["halo"]
        if h.size == 0:
            continue
        new = np.isnan(ref[h, 0])
        ref[h[new]] = p["ref"][new]
        shift = _min_image(p["ref"] - ref[h], box)  # align this domain's reference
        np.add.at(mdx, h, p["mdx"] + p["mass"][:, None] * shift)
        np.add.at(mass, h, p["mass"])
        if has_vel:
            np.add.at(mv, h, p["mv"])
        if not has_mcp:
            continue
        better = (p["mcp_friends"] > mcp_f[h]) | (
            (p["mcp_friends"] == mcp_f[h]) & (p["mcp_id"] < mcp_id[h]))
        hb = h[better]
        mcp_f[hb], mcp_id[hb] = p["mcp_friends"][better], p["mcp_id"][better]
        mcp[hb], mcp_pos[hb] = p["mcp_index"][better], p["mcp_pos"][better]
    com = ref + mdx / np.where(mass > 0, mass, 1.0)[:, None]
    if box is not None:
        com = np.mod(com, box)
        com[com >= box] = 0.0
    out = {"mass": mass, "center_of_mass": com}
    if has_mcp:
        out.update(mcp_index=mcp, mcp_friends=mcp_f, mcp_position=mcp_pos)
    if has_vel:
        out["velocity"] = mv / np.where(mass > 0, mass, 1.0)[:, None]
    return out


# ----------------------------------------------------------------------------- pass 2
def partial_rmax(members: dict, props: dict, box: float | None) -> tuple:
    """Largest member distance from the centre of mass (``props`` from
    :func:`reduce_props`) of each halo in this domain, computed where the table is; the
    per-halo rows returned on the host."""
    lab = members["label"]
    xp = array_module(lab)
    halos, starts = _segments(lab)
    if halos.size == 0:
        return host(halos), np.empty(0)
    com = xp.asarray(props["center_of_mass"])
    d = _min_image(members["pos"] - com[lab], box)
    r = xp.sqrt((d * d).sum(axis=1))
    return host(halos), host(kernels.segment_max(r, starts))


def reduce_rmax(n_halos: int, *parts) -> np.ndarray:
    out = np.zeros(n_halos)
    for h, r in parts:
        np.maximum.at(out, h, r)
    return out


# ----------------------------------------------------------------------------- MBP
def _mbp_rows(lab, index, pos, mass, box, softening, G, grid_threshold, mode, like):
    """(halo, particle index, position, exact potential) of each halo's most-bound member;
    the exact MBPs computed where chunks like ``like`` (a zero-size array) live."""
    order = np.argsort(lab, kind="stable")
    lab, index, pos, mass = lab[order], index[order], pos[order], mass[order]
    halos, starts = _segments(lab)
    if halos.size == 0:
        return (np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, 3)), np.empty(0))
    sizes = np.diff(starts)
    if mode == "grid":
        use_grid = np.ones(halos.size, bool)
    elif mode == "exact" or grid_threshold is None:
        use_grid = np.zeros(halos.size, bool)
    else:
        use_grid = sizes > grid_threshold
    rows = np.empty(halos.size, np.int64)
    pot_best = np.empty(halos.size)
    exact = np.flatnonzero(~use_grid)
    if exact.size:
        sel = np.flatnonzero(np.repeat(~use_grid, sizes))
        sub_starts = np.r_[0, np.cumsum(sizes[exact])].astype(np.int64)
        xp = array_module(like)
        best, pot = kernels.segment_mbp(xp.asarray(pos[sel]), xp.asarray(mass[sel]),
                                        xp.asarray(sub_starts), box_size=box,
                                        softening=softening, G=G)
        rows[exact] = sel[host(best)]
        pot_best[exact] = host(pot)
    for s in np.flatnonzero(use_grid):
        a, b = starts[s], starts[s + 1]
        r = grid_mbp(pos[a:b], mass[a:b], box_size=box, softening=softening, G=G)
        rows[s] = a + r
        pot_best[s] = member_potentials(pos[a:b], mass[a:b], np.array([r]), box_size=box,
                                        softening=softening, G=G)[0]
    return halos, index[rows], pos[rows], pot_best


def _split_halo_rows(members: dict, n_members: np.ndarray):
    """Rows (in the table's array module) of the members whose halo lies wholly in this
    domain, and of those whose halo is split across domains."""
    lab = members["label"]
    xp = array_module(lab)
    halos, starts = _segments(lab)
    whole = xp.zeros(lab.size, bool)
    if halos.size:
        complete = xp.diff(starts) == xp.asarray(n_members)[halos]
        whole = complete[_segment_of_members(halos, starts, lab)]
    return xp.flatnonzero(whole), xp.flatnonzero(~whole)


def _host_rows(members: dict, rows) -> tuple:
    """(label, index, pos, mass) of ``rows`` of a member table, on the host."""
    return tuple(host(members[k][rows]) for k in ("label", "index", "pos", "mass"))


def mbp_local(members: dict, n_members: np.ndarray, box, softening, G, grid_threshold, mode,
              like) -> tuple:
    """MBP of the halos whose members all live in this domain (exact MBPs computed where
    chunks like ``like``, a zero-size NumPy or CuPy array, live)."""
    whole, _ = _split_halo_rows(members, n_members)
    return _mbp_rows(*_host_rows(members, whole), box, softening, G, grid_threshold, mode,
                     like)


def mbp_export(members: dict, n_members: np.ndarray, n_batches: int) -> list:
    """Members of halos split across domains, cut into ``n_batches`` pieces by halo id."""
    _, part = _split_halo_rows(members, n_members)
    lab, idx, pos, mass = _host_rows(members, part)
    batch = lab % n_batches
    return [(lab[batch == b], idx[batch == b], pos[batch == b], mass[batch == b])
            for b in range(n_batches)]


def mbp_batch(box, softening, G, grid_threshold, mode, like, *pieces) -> tuple:
    """MBP of the gathered split halos of one batch (``like`` as for :func:`mbp_local`)."""
    cat = [np.concatenate([p[k] for p in pieces]) for k in range(4)]
    return _mbp_rows(*cat, box, softening, G, grid_threshold, mode, like)


def reduce_mbp(n_halos: int, *rows) -> dict:
    idx = np.full(n_halos, -1, np.int64)
    pos = np.full((n_halos, 3), np.nan)
    pot = np.full(n_halos, np.nan)
    for h, i, x, p in rows:
        idx[h], pos[h], pot[h] = i, x, p
    return {"mbp_index": idx, "mbp_position": pos, "mbp_potential": pot}
