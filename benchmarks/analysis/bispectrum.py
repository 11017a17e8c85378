"""Bispectrum (FFT shell estimator) timing, and Q of 2LPT ICs against tree-level SPT.

Workload: 2LPT initial conditions of ``--n-side``^3 particles in a ``--box`` Mpc/h box at
redshift ``--redshift`` (fixed amplitudes, EH98 no-wiggle power of the default
cosmology), painted with PCS, interlaced, onto an ``--n-mesh``^3 mesh; ``--bins`` bins of
width ``--width`` fundamental wavenumbers from ``k_f / 2``; every closed triangle bin.

* ``what=time``: :func:`cosmo_dask.analysis.bispectrum` end to end (paint, forward FFTs,
  2 n_bins inverse FFTs, triangle sums), median of ``--repeat`` after ``--warmup``
  (default: dask's local threaded scheduler, all cores; ``--device gpu``: CuPy particles,
  the same path on the GPU, device synchronised by the final host copy); ``time-mesh``:
  the same on the painted mesh (the estimator without the painting);
* ``what=validation``: ``Q`` of ``--seeds`` paired seeds (``delta_L`` and ``-delta_L``;
  the pair's average cancels the Gaussian cubic term) against
  :func:`cosmo_dask.analysis.tree_level_bispectrum` of the linear ``P(k)`` averaged over
  the same triangles (exact enumeration up to ``--max-modes`` modes in the first bin,
  a random ``--max-modes`` of them above); the error of each bin is the standard error
  of the seed mean (the Gaussian ``sigma_Q`` of one unpaired realisation is reported
  beside it).
* ``what=peer``: Pylians' ``Bk`` (if ``Pk_library`` imports) on the same mesh for a few
  configurations, else a row saying it is absent.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start, wall_median  # noqa: E402


def _q(pair):
    b = 0.5 * (pair[0]["bispectrum"].values + pair[1]["bispectrum"].values)
    p = 0.5 * (pair[0]["power"].values + pair[1]["power"].values)
    tri = np.stack([pair[0][c].values for c in ("bin1", "bin2", "bin3")], 1)
    p1, p2, p3 = p[tri[:, 0]], p[tri[:, 1]], p[tri[:, 2]]
    return b / (p1 * p2 + p2 * p3 + p3 * p1)


def main(argv=None):
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--n-side", type=int, default=128)
    ap.add_argument("--n-mesh", type=int, default=128)
    ap.add_argument("--box", type=float, default=1000.0)
    ap.add_argument("--redshift", type=float, default=10.0)
    ap.add_argument("--bins", type=int, default=10)
    ap.add_argument("--width", type=float, default=2.0, help="bin width in k_f")
    ap.add_argument("--seeds", type=int, default=3, help="paired seeds of the validation "
                    "(0: timing only)")
    ap.add_argument("--scheme", default="pcs")
    ap.add_argument("--max-modes", type=int, default=1000,
                    help="tree level: first-bin modes sampled per triangle bin")
    args = ap.parse_args(argv)
    start(args, "bispectrum")

    from cosmo_dask.analysis import bispectrum, linear_power, tree_level_bispectrum
    from cosmo_dask.models import lpt_ics
    from cosmo_dask.models.cosmology import Cosmology

    device = args.device
    kf = 2 * np.pi / args.box
    edges = kf * (0.5 + args.width * np.arange(args.bins + 1))
    rec = dict(n_side=args.n_side, n_mesh=args.n_mesh, box=args.box, z=args.redshift,
               n_bins=args.bins, bin_width_kf=args.width, scheme=args.scheme)

    def ics(seed, paired):
        snap = lpt_ics(args.n_side, box_size=args.box, redshift=args.redshift, order=2,
                       seed=seed, fixed_amplitude=True, paired=paired, device=device)
        return snap.persist() if hasattr(snap, "persist") else snap

    def measure(snap):
        return bispectrum(snap, edges, n_mesh=args.n_mesh, scheme=args.scheme,
                          subtract_shot_noise=False)

    snap = ics(1, False)
    out = {}

    def run():
        out["ds"] = measure(snap)

    t = wall_median(run, args.repeat)
    ds = out["ds"]
    emit(what="time", seconds=t, n_triangle_bins=int(ds.sizes["triangle"]),
         n_triangles=int(ds["n_triangles"].sum()), repeat=args.repeat, **rec)
    # the estimator alone, on the painted mesh (no painting, no interlacing)
    from cosmo_dask.density import paint

    painted = paint(snap, n_mesh=args.n_mesh, scheme=args.scheme).persist()
    t = wall_median(lambda: bispectrum(painted, edges, box_size=args.box,
                                       scheme=args.scheme), args.repeat)
    emit(what="time-mesh", seconds=t, n_triangle_bins=int(ds.sizes["triangle"]),
         repeat=args.repeat, **rec)

    if args.seeds > 0:
        qs, gauss = [], None
        t0 = time.perf_counter()
        for seed in range(1, args.seeds + 1):
            pair = [measure(ics(seed, paired)) for paired in (False, True)]
            qs.append(_q(pair))
            gauss = pair[0]["reduced_error"].values
        t_val = time.perf_counter() - t0
        qs = np.array(qs)
        z = args.redshift
        t0 = time.perf_counter()
        tree = tree_level_bispectrum(pair[0], linear_power(Cosmology(), 1 / (1 + z)),
                                     max_modes=args.max_modes)
        t_tree = time.perf_counter() - t0
        q, q_tree = qs.mean(0), tree["reduced_tree"].values
        err = (qs.std(0, ddof=1) / np.sqrt(len(qs))) if len(qs) > 1 else np.full_like(q, np.nan)
        dev = (q - q_tree) / err
        tri = np.stack([pair[0][c].values for c in ("bin1", "bin2", "bin3")], 1)
        equi = tri[:, 0] == tri[:, 2]
        emit(what="validation", seeds=args.seeds, seconds_measure=t_val,
             seconds_tree=t_tree, mean_ratio=float(np.mean(q / q_tree)),
             median_ratio=float(np.median(q / q_tree)),
             rms_pull=float(np.sqrt(np.mean(dev**2))), max_abs_pull=float(np.max(np.abs(dev))),
             frac_within_2sigma=float(np.mean(np.abs(dev) < 2)),
             median_rel_err=float(np.median(err / np.abs(q_tree))),
             median_gauss_sigma_q=float(np.median(gauss)),
             equilateral_k=[float(v) for v in pair[0]["k1"].values[equi]],
             equilateral_q=[float(v) for v in q[equi]],
             equilateral_q_tree=[float(v) for v in q_tree[equi]],
             equilateral_err=[float(v) for v in err[equi]],
             n_triangle_bins=int(len(tri)), **rec)
    _peer(snap, ds, edges, args)


def _peer(snap, ds, edges, args):
    try:
        import Pk_library as PKL  # noqa: N813  (Pylians)
    except ImportError:
        emit(what="peer", peer="Pylians", available=False,
             note="Pylians (Pk_library) is not installed here")
        return
    from cosmo_dask.core.backend import host
    from cosmo_dask.density import paint

    mesh = np.asarray(host(paint(snap, n_mesh=args.n_mesh, scheme=args.scheme).compute()),
                      dtype=np.float32)
    delta = (mesh / mesh.mean() - 1).astype(np.float32)
    kf = 2 * np.pi / args.box
    k1 = k2 = float(ds["k"].values[2])
    theta = np.array([np.pi / 3])
    t0 = time.perf_counter()
    bk = PKL.Bk(delta, args.box, k1, k2, theta, args.scheme.upper(), 2)
    t = time.perf_counter() - t0
    emit(what="peer", peer="Pylians", available=True, seconds=t, k1=k1, k2=k2,
         pylians_B=[float(v) for v in bk.B], pylians_Q=[float(v) for v in bk.Q],
         kf=kf, n_mesh=args.n_mesh)


if __name__ == "__main__":
    main()
