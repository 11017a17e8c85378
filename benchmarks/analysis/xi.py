"""Pair counts: cosmo_dask's correlation_function against Corrfunc's theory.DD, side by side.

Usage::

    python -m benchmarks xi [--n 1000000] [--box 500] [--r-max 20] [--bins 20]
                            [--threads 2] [--repeat 3] [--device cpu|gpu]

The same uniform random particles (float64, seed 1) and the same bins (``--bins``
logarithmic bins from ``r_max / 40`` to ``--r-max``) for both. One line per run to stdout
and to ``benchmarks/results/xi.jsonl``:

* ``xi-cpu`` (``--device cpu``): seconds (median of ``--repeat`` after one warm-up run, so
  numba's compile or cache load is excluded; the first call's seconds are stated as
  ``first_call_s``) of :func:`cosmo_dask.analysis.correlation_function` (the whole call:
  graph, domain exchange, counts) and of its per-domain kernel alone
  (:func:`~cosmo_dask.analysis.pair_count_kernels.pair_count` on one domain), both with
  ``--threads`` numba threads, and of Corrfunc's ``DD(autocorr=1, nthreads=--threads)``;
  the ratios Corrfunc / ours; ``identical``: Corrfunc's ``npairs`` equal ``2 dd`` bin for
  bin (Corrfunc counts ordered pairs).
* ``xi-gpu`` (``--device gpu``): the same call on CuPy positions (seconds with the device
  synchronised), its ratio to Corrfunc's ``--threads``-thread time measured in the same run,
  and ``identical``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start, stderr, wall_median  # noqa: E402


def main(argv=None):
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--box", type=float, default=500.0)
    ap.add_argument("--r-max", type=float, default=20.0)
    ap.add_argument("--bins", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corrfunc-s", type=float, default=None,
                    help="gpu without Corrfunc: Corrfunc's --threads time measured elsewhere "
                    "(same --n, --box, --r-max, --bins), for the ratio")
    args = ap.parse_args(argv)
    cfg = start(args, "xi")

    import numba

    from cosmo_dask.analysis import correlation_function
    from cosmo_dask.analysis import pair_count_kernels as pk

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    pos = np.random.default_rng(1).random((args.n, 3)) * args.box
    edges = np.geomspace(args.r_max / 40, args.r_max, args.bins + 1)
    row = {"workload": f"xi-{cfg.device}", "n_particles": args.n, "box": args.box,
           "r_max": args.r_max, "bins": args.bins, "threads": args.threads,
           "cpus": os.cpu_count(), "load_avg_1min": os.getloadavg()[0]}

    x, y, z = (np.ascontiguousarray(pos[:, a]) for a in range(3))
    ref = {}
    try:
        from Corrfunc.theory.DD import DD
    except ImportError:  # a GPU host without Corrfunc: our numba counts (equal to
        DD = None        # Corrfunc's, tests/analysis/test_correlation.py) and --corrfunc-s
        if cfg.device == "cpu":
            raise

    def corrfunc():
        ref["npairs"] = DD(1, args.threads, edges, x, y, z, periodic=True, boxsize=args.box,
                           verbose=False)["npairs"]

    if cfg.device == "cpu":
        out = {}

        def ours():
            out["dd"] = correlation_function(pos, edges, box_size=args.box)["dd"].values

        t0 = time.perf_counter()
        ours()
        row["first_call_s"] = time.perf_counter() - t0
        geo = pk.cell_geometry(args.box, args.r_max, (0, 0, 0), (args.box,) * 3, (1, 1, 1),
                               args.n)

        def kernel():
            out["kernel"] = pk.pair_count(pos, args.n, geo, edges, None, None, args.box)

        # interleaved: ours, the kernel, Corrfunc, so that a load change hits all three
        times = {"ours": [], "kernel": [], "corrfunc": []}
        for fn in (ours, kernel, corrfunc):
            fn()
        for _ in range(args.repeat):
            for name, fn in (("ours", ours), ("kernel", kernel), ("corrfunc", corrfunc)):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) for k, v in times.items()}
        row.update({"ours_s": med["ours"], "kernel_s": med["kernel"],
                    "corrfunc_s": med["corrfunc"], "ratio": med["corrfunc"] / med["ours"],
                    "ratio_kernel": med["corrfunc"] / med["kernel"],
                    "times": {k: [round(t, 4) for t in v] for k, v in times.items()},
                    "pairs": int(out["dd"].sum()),
                    "identical": bool(np.array_equal(ref["npairs"], 2 * out["dd"])
                                      and np.array_equal(out["kernel"][:, 0],
                                                         2 * out["dd"]))})
    else:
        import cupy

        from benchmarks.common import gpu_seconds

        pos_d = cupy.asarray(pos)
        out = {}

        def ours():
            out["dd"] = correlation_function(pos_d, edges, box_size=args.box)["dd"].values

        t0 = time.perf_counter()
        ours()
        cupy.cuda.Device().synchronize()
        row["first_call_s"] = time.perf_counter() - t0
        med, times, _ = gpu_seconds(ours, args.repeat)
        if DD is not None:
            cpu = wall_median(corrfunc, args.repeat)
        else:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
            geo = pk.cell_geometry(args.box, args.r_max, (0, 0, 0), (args.box,) * 3,
                                   (1, 1, 1), args.n)
            ref["npairs"] = pk.pair_count(pos, args.n, geo, edges, None, None,
                                          args.box)[:, 0]
            cpu = args.corrfunc_s
            row["reference"] = "numba pair_count (Corrfunc absent); corrfunc_s from --corrfunc-s"
        row.update({"ours_s": med, "corrfunc_s": cpu, "ratio": cpu / med if cpu else None,
                    "times": [round(t, 4) for t in times], "pairs": int(out["dd"].sum()),
                    "identical": bool(np.array_equal(ref["npairs"], 2 * out["dd"]))})
    emit(**row)
    stderr(f"xi {cfg.device}: ours {row['ours_s']:.3f} s, Corrfunc {row['corrfunc_s']} s "
           f"({args.threads} threads), ratio {row['ratio']}, identical {row['identical']}")


if __name__ == "__main__":
    main()
