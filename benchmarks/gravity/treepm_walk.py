"""TreePM short-range walk on the CPU: interaction counts and force accuracy on one state.

What the GPU TreePM step's cost follows (pairs and multipoles per particle) and what its
accuracy is, measured with the CPU walk (:mod:`cosmo_dask.gravity.tree.walk`, the same
acceptance rule as the CUDA walk) on a cosmological state, so a walk change can be judged
without a GPU. Box of ``n_side`` Mpc/h with ``n_side^3`` particles (mean spacing 1 Mpc/h),
mesh ``n_side``, ``rs = 1.2`` cells, ``r_cut = 4.5 rs``, TreePM's ``max_leaf`` and
``max_group``, Plummer softening 1/30 of the spacing (the simulation's defaults). States:

* ``ics``: Zel'dovich at ``--z-init`` (default 9; the ICs of ``python -m benchmarks simulation``);
* ``evolved``: 2LPT from z = 19 and ``--steps`` PM steps (mesh ``2 n_side``) to z = 0,
  float32 (the evolved set of ``python -m benchmarks halos``), cached in ``--cache``.

Lines printed (JSON):

* ``counts``: groups, P2P pairs per particle (group size x particles of its list leaves),
  M2P particle-cell interactions per particle, pairs per particle closer than ``r_cut``
  (the least a pair method can do), for each ``--theta``;
* ``short_error``: the CPU tree's short range (``tree_forces``, float32 and float64
  arithmetic) against a float64 sum over every pair closer than ``r_cut`` (cKDTree
  neighbours, minimum image) on ``--targets`` random particles: relative error median,
  90th, 99th percentile and max, relative to the short-range force and to the total
  (Ewald) force;
* ``treepm_error``: ``treepm_accelerations`` (PM + CPU tree, float32, no softening:
  the Ewald sum is Newtonian) against the Ewald sum of ``tests/support/ewald_reference.py``
  (tolerance 1e-8) on the same targets.

``--max-leaf`` / ``--max-group`` change the tree of the counts and of the short-range
error (the TreePM graph keeps its defaults).

    python -m benchmarks treepm-walk --state evolved --n-side 128 --theta 0.5 0.3
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


from cosmo_dask.gravity.parameters import TREEPM_MAX_GROUP, TREEPM_MAX_LEAF  # noqa: E402
from cosmo_dask.simulation.parameters import SOFTENING_SPACINGS  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def state(kind: str, n_side: int, z_init: float, steps: int, cache: str | None):
    """Positions (float64, wrapped), box, particle mass and G of the state."""
    path = None
    if cache:
        path = Path(cache) / f"treepm_walk_{kind}_{n_side}_z{z_init:g}_s{steps}.npz"
        if path.exists():
            d = np.load(path)
            return d["pos"], float(d["box"]), float(d["mass"]), float(d["G"])
    box = float(n_side)
    if kind == "ics":
        from cosmo_dask.models import zeldovich

        snap = zeldovich(n_side, box_size=box, redshift=z_init, seed=1, precision="float32")
    else:
        from cosmo_dask.models import lpt_ics
        from cosmo_dask.simulation import run

        ics = lpt_ics(n_side, box_size=box, redshift=19.0, seed=1, precision="float32")
        snap = run(ics, z_final=0.0, n_steps=steps, method="pm",
                   precision="float32").snapshot
    pos = np.mod(np.asarray(snap.pos.compute(), dtype=np.float64), box)
    pos[pos >= box] = 0.0
    out = pos, box, float(snap.particle_mass), float(snap.G)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, pos=pos, box=box, mass=out[2], G=out[3])
    return out


def counts(pos, box, theta, rs, r_cut, max_leaf, max_group):
    """Interaction counts per particle of the CPU walk (the GPU walk's rule)."""
    from cosmo_dask.gravity.tree.walk import interaction_lists
    from cosmo_dask.spatial.octree import build_octree

    tree = build_octree(pos, 1.0, max_leaf=max_leaf, max_group=max_group, box_size=box)
    g = tree.groups
    t0 = time.perf_counter()
    lists = interaction_lists(tree.lo[g], tree.hi[g], tree, theta, box_size=box, r_cut=r_cut,
                              rs=rs)
    walk_s = time.perf_counter() - t0
    gcount = tree.count[g]
    n_leaf_p = np.add.reduceat(np.r_[tree.count[lists.leaves], 0], lists.leaf_ptr[:-1])
    n_leaf_p[np.diff(lists.leaf_ptr) == 0] = 0
    n_cells = np.diff(lists.cell_ptr)
    n = pos.shape[0]
    # the CUDA walk's P2P ranges: runs of list leaves contiguous in sorted order
    st, ct = tree.start[lists.leaves], tree.count[lists.leaves]
    first = np.zeros(st.size, dtype=bool)
    first[lists.leaf_ptr[:-1][np.diff(lists.leaf_ptr) > 0]] = True
    new_range = first | np.r_[True, st[1:] != st[:-1] + ct[:-1]]
    return {"groups": int(g.size), "nodes": int(tree.n_nodes),
            "particles_per_group": float(gcount.mean()),
            "p2p_per_particle": float((gcount * n_leaf_p).sum() / n),
            "m2p_per_particle": float((gcount * n_cells).sum() / n),
            "leaves_per_group": float(np.diff(lists.leaf_ptr).mean()),
            "ranges_per_group": float(new_range.sum() / g.size),
            "particles_per_range": float(ct.sum() / max(1, new_range.sum())),
            "cells_per_group": float(n_cells.mean()), "walk_s": round(walk_s, 3)}


def pairs_inside(pos, box, r_cut, idx):
    """Mean number of neighbours closer than r_cut of the targets idx (periodic)."""
    from scipy.spatial import cKDTree

    kd = cKDTree(pos, boxsize=box)
    return float(np.mean(kd.query_ball_point(pos[idx], r_cut, return_length=True)) - 1)


def short_reference(pos, mass, box, G, rs, r_cut, eps, idx):
    """float64 truncated short-range force on pos[idx] from every pair closer than r_cut."""
    from scipy.spatial import cKDTree
    from scipy.special import erfc

    kd = cKDTree(pos, boxsize=box)
    acc = np.zeros((idx.size, 3))
    for k, nb in enumerate(kd.query_ball_point(pos[idx], r_cut)):
        d = pos[idx[k]] - pos[np.asarray(nb)]
        d -= box * np.rint(d / box)
        r2 = (d * d).sum(1)
        keep = (r2 > 0) & (r2 < r_cut * r_cut)
        d, r2 = d[keep], r2[keep]
        r = np.sqrt(r2)
        x = r / (2 * rs)
        t = erfc(x) + 2 * x / np.sqrt(np.pi) * np.exp(-x * x)
        acc[k] = -G * mass * ((t * (r2 + eps * eps) ** -1.5)[:, None] * d).sum(0)
    return acc


def stats(err) -> dict:
    return {"median": float(np.median(err)), "p90": float(np.percentile(err, 90)),
            "p99": float(np.percentile(err, 99)), "max": float(err.max())}


def main(argv=None):
    ap = parser(__doc__, devices=("cpu",))
    ap.add_argument("--state", choices=("ics", "evolved"), default="evolved")
    ap.add_argument("--n-side", type=int, default=64)
    ap.add_argument("--z-init", type=float, default=9.0, help="ics: redshift")
    ap.add_argument("--steps", type=int, default=40, help="evolved: PM steps")
    ap.add_argument("--theta", type=float, nargs="+", default=[0.5])
    ap.add_argument("--targets", type=int, default=300)
    ap.add_argument("--cache", default=os.environ.get("BENCH_CACHE", "/tmp/bench_cache"))
    ap.add_argument("--precision", nargs="+", default=["float32"],
                    choices=("float32", "float64"), help="short_error arithmetic")
    ap.add_argument("--max-leaf", type=int, default=TREEPM_MAX_LEAF)
    ap.add_argument("--max-group", type=int, default=TREEPM_MAX_GROUP)
    ap.add_argument("--no-forces", action="store_true", help="counts only")
    ap.add_argument("--no-ewald", action="store_true", help="no treepm_error")
    args = ap.parse_args(argv)
    start(args, "treepm-walk")

    import dask
    import dask.array as da

    from cosmo_dask.gravity.tree.forces import tree_forces
    from cosmo_dask.gravity.treepm import treepm_accelerations
    from tests.support.ewald_reference import ewald

    pos, box, mass, G = state(args.state, args.n_side, args.z_init,
                              args.steps if args.state == "evolved" else 0, args.cache)
    n = pos.shape[0]
    rs = 1.2 * box / args.n_side
    r_cut = 4.5 * rs
    eps = SOFTENING_SPACINGS * box / args.n_side
    env = {"bench": "treepm_walk", "device": "cpu",
           "device_name": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d"), "state": args.state, "n_side": args.n_side,
           "rs": rs, "r_cut": r_cut, "softening": eps, "max_leaf": args.max_leaf,
           "max_group": args.max_group}
    idx = np.random.default_rng(0).choice(n, args.targets, replace=False)
    inside = pairs_inside(pos, box, r_cut, idx)
    for theta in args.theta:
        emit(env, what="counts", theta=theta, pairs_inside_r_cut=round(inside, 1),
             **counts(pos, box, theta, rs, r_cut, args.max_leaf, args.max_group))
    if args.no_forces:
        return
    t0 = time.perf_counter()
    ref_tot, _ = ewald(pos, mass, box, G=G, targets=idx, tol=1e-8)
    ewald_s = time.perf_counter() - t0
    # the short-range error relative to the total force: the softened long range is the
    # Newtonian one (eps << rs), so the Ewald force stands for the total
    ref_short = short_reference(pos, mass, box, G, rs, r_cut, eps, idx)
    n_ref = np.linalg.norm(ref_short, axis=1)
    n_tot = np.linalg.norm(ref_tot, axis=1)
    for theta in args.theta:
        for precision in args.precision:
            t0 = time.perf_counter()
            acc, _ = tree_forces(pos, mass, G=G, theta=theta, softening=eps,
                                 precision=precision, potential=False, box_size=box, rs=rs,
                                 r_cut=r_cut, max_leaf=args.max_leaf,
                                 max_group=args.max_group)
            sec = time.perf_counter() - t0
            diff = np.linalg.norm(acc[idx].astype(np.float64) - ref_short, axis=1)
            emit(env, what="short_error", theta=theta, precision=precision,
                 seconds=round(sec, 2), vs_short=stats(diff / n_ref),
                 vs_total=stats(diff / n_tot))
        if args.no_ewald:
            continue
        with dask.config.set(scheduler="threads"):
            p = da.from_array(pos, chunks=(1 << 18, 3))
            acc, _ = treepm_accelerations(p, mass, G=G, box_size=box, n_mesh=args.n_side,
                                          theta=theta, softening=0.0, precision="float32",
                                          potential=False)
            t0 = time.perf_counter()
            acc = np.asarray(acc[idx].compute(), dtype=np.float64)
            sec = time.perf_counter() - t0
        emit(env, what="treepm_error", theta=theta, precision="float32",
             seconds=round(sec, 2), ewald_s=round(ewald_s, 1),
             vs_ewald=stats(np.linalg.norm(acc - ref_tot, axis=1) / n_tot))


if __name__ == "__main__":
    main()
