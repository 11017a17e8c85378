"""Issue 4 benchmark (b): CPU tree forces vs pytreegrav at matched median force error.

Plummer and Hernquist spheres of N = 1e5 (equal masses, no softening). For each
model both codes scan ``theta``; each point reports the median wall time of
``--repeat`` calls (numba compilation excluded: both codes are warmed up first)
and the median / 99th-percentile relative force error against a float64 direct
sum on a random subsample of ``--sample`` particles. Then, for every pytreegrav
point, the fastest cosmo_dask point with an equal or lower median error gives a
time ratio ``t_pytreegrav / t_cosmo_dask`` (> 1: cosmo_dask faster). Both codes
run in the same process, interleaved, on the same cores.

One JSON object per line. Usage::

    python -m benchmarks gravity-tree-cpu [--n 100000] [--repeat 3]
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from cosmo_dask.gravity.tree.forces import tree_forces  # noqa: E402
from cosmo_dask.models import hernquist, plummer  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start, wall_median  # noqa: E402


def direct_sample(pos: np.ndarray, mass: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """float64 Newtonian accelerations (G = 1) at ``pos[idx]`` from all particles."""
    out = np.zeros((idx.size, 3))
    for a in range(0, idx.size, 200):
        d = pos[idx[a:a + 200], None, :] - pos[None, :, :]
        r2 = (d * d).sum(-1)
        r2[r2 == 0] = np.inf
        out[a:a + 200] = -((mass * r2 ** -1.5)[..., None] * d).sum(1)
    return out


def med_p99(acc: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    e = np.linalg.norm(acc - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return float(np.median(e)), float(np.percentile(e, 99))


def main(argv=None) -> None:
    ap = parser(__doc__, repeat=3, devices=("cpu",))
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=2000)
    ap.add_argument("--models", default="plummer,hernquist")
    ap.add_argument("--ours", default="0.5,0.6,0.7,0.8,0.9,1.0",
                    help="theta values for cosmo_dask")
    ap.add_argument("--theirs", default="0.3,0.4,0.5,0.6,0.7,0.8,1.0",
                    help="theta values for pytreegrav")
    ap.add_argument("--max-leaf", type=int, default=64)
    ap.add_argument("--max-group", type=int, default=64)
    args = ap.parse_args(argv)
    start(args, "gravity-tree-cpu")
    import numba
    import pytreegrav

    env = {"bench": "gravity_tree_cpu", "date": time.strftime("%Y-%m-%d"),
           "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "numba_threads": numba.config.NUMBA_NUM_THREADS,
           "pytreegrav": getattr(pytreegrav, "__version__", "?"), "n": args.n}
    ours_th = [float(t) for t in args.ours.split(",")]
    theirs_th = [float(t) for t in args.theirs.split(",")]
    models = {"plummer": plummer, "hernquist": hernquist}

    # warm up (compile) both codes on a small set
    rng = np.random.default_rng(0)
    wp = rng.standard_normal((5000, 3))
    wm = np.full(5000, 1.0 / 5000)
    tree_forces(wp, wm, theta=0.7, potential=False, max_leaf=args.max_leaf,
                max_group=args.max_group)
    pytreegrav.Accel(wp, wm, theta=0.7, quadrupole=True, parallel=True)

    for name in args.models.split(","):
        snap = models[name](args.n, seed=42)
        pos = snap.pos.compute().astype(np.float64)
        mass = np.full(args.n, snap.particle_mass)
        idx = np.random.default_rng(1).choice(args.n, args.sample, replace=False)
        ref = direct_sample(pos, mass, idx)
        ours, theirs = [], []
        for k in range(max(len(ours_th), len(theirs_th))):  # interleave the two codes
            if k < len(ours_th):
                th = ours_th[k]

                def run_ours(th=th, pos=pos, mass=mass):
                    return tree_forces(pos, mass, theta=th, potential=False,
                                       max_leaf=args.max_leaf, max_group=args.max_group)[0]
                t = wall_median(run_ours, args.repeat, warm=0)
                med, p99 = med_p99(run_ours()[idx], ref)
                ours.append((th, t, med))
                emit(env, model=name, code="cosmo_dask", theta=th, seconds=round(t, 4),
                     median_err=med, p99_err=p99, max_leaf=args.max_leaf,
                     max_group=args.max_group)
            if k < len(theirs_th):
                th = theirs_th[k]

                def run_theirs(th=th, pos=pos, mass=mass):
                    return pytreegrav.Accel(pos, mass, theta=th, quadrupole=True, parallel=True)
                t = wall_median(run_theirs, args.repeat, warm=0)
                med, p99 = med_p99(run_theirs()[idx], ref)
                theirs.append((th, t, med))
                emit(env, model=name, code="pytreegrav", theta=th, seconds=round(t, 4),
                     median_err=med, p99_err=p99)
        for th_t, t_t, med_t in theirs:
            ok = [(t, th, med) for th, t, med in ours if med <= med_t]
            if not ok:
                emit(env, model=name, match="none", pytreegrav_theta=th_t,
                     pytreegrav_median_err=med_t)
                continue
            t_o, th_o, med_o = min(ok)
            emit(env, model=name, match="equal_or_lower_error", pytreegrav_theta=th_t,
                 pytreegrav_seconds=round(t_t, 4), pytreegrav_median_err=med_t,
                 cosmo_dask_theta=th_o, cosmo_dask_seconds=round(t_o, 4),
                 cosmo_dask_median_err=med_o, speedup=round(t_t / t_o, 3))


if __name__ == "__main__":
    main()
