"""Direct-summation gravity throughput (issue 4, benchmark part (a)).

Prints one JSON object per measurement:

* ``p2p_gpu``: all-pairs P2P on one GPU (``p2p_block_gpu``, whole call: packing,
  kernel, split reduction), pair interactions per second = N * N / seconds,
  float32 and float64, N = 2**18 and 2**20, Plummer softening, with and without
  the potential; CUDA events, warm-up, median of ``--repeat``. The float32
  accuracy against the float64 kernel (validated against NumPy in the tests) is
  given on a subsample of targets.
* ``p2p_gpu_sweep`` (``--sweep``): launch shapes (threads, targets per thread).
* ``truncated_gpu`` / ``truncated_cpu``: the truncated TreePM kernel with exact
  erfc vs the 512-node table at Taylor levels 0..4 (speed gain = exact time /
  table time), with every pair inside the table (x <= 1.8), force only.
* ``truncated_table_error``: the table's max relative error per level on [0, 3].

    python -m benchmarks gravity-direct [--sweep] [--repeat 5] [--no-cpu]
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import cuda_event_seconds, emit, parser, start  # noqa: E402


def plummer_sphere(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = 1.0 / np.sqrt(rng.uniform(1e-4, 1.0, n) ** (-2.0 / 3.0) - 1.0)
    v = rng.normal(size=(n, 3))
    x = v / np.linalg.norm(v, axis=1)[:, None] * r[:, None]
    return x, np.full(n, 1.0 / n)


def bench_gpu(env, args):
    import cupy

    from cosmo_dask.gravity.dispatch import p2p_block  # p2p_block_gpu on CuPy arrays

    env = dict(env, device=cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for logn in (18, 20):
        n = 2 ** logn
        x, m = plummer_sphere(n)
        xd, md = cupy.asarray(x), cupy.asarray(m)
        ref = None
        for prec in ("float64", "float32"):
            for pot in (True, False):
                if prec == "float64" and not pot and logn == 20:
                    continue

                def call(prec=prec, pot=pot, xd=xd, md=md):
                    return p2p_block(xd, xd, md, softening=1e-3, precision=prec,
                                     potential=pot, exclude="index")

                rep = args.repeat if prec == "float32" or logn == 18 else 3
                t = cuda_event_seconds(call, rep, warm=1)[0]
                fields = dict(workload="p2p_gpu", n=n, precision=prec, potential=pot,
                              kernel="plummer", seconds=t, pairs_per_s=n * n / t)
                if pot:
                    a, p = call()
                    if prec == "float64":
                        ref = (a[::997].get(), p[::997].get())
                    else:
                        ea = np.linalg.norm(a[::997].get() - ref[0], axis=1) / \
                            np.linalg.norm(ref[0], axis=1)
                        ep = np.abs(p[::997].get() - ref[1]) / np.abs(ref[1])
                        fields.update(acc_rel_err_median=float(np.median(ea)),
                                      acc_rel_err_max=float(ea.max()),
                                      pot_rel_err_max=float(ep.max()))
                emit(env, **fields)
        if (args.sweep or args.shapes) and logn == args.sweep_logn:
            sweeps = (("float32", [(64, 8), (128, 2), (128, 4), (128, 8),
                                   (256, 4), (256, 8), (512, 4)]),
                      ("float64", [(128, 1), (128, 2), (128, 4), (256, 2)]))
            if not args.sweep:
                sweeps = (("float32", [tuple(int(v) for v in sh.split("x"))
                                       for sh in args.shapes.split(",")]),)
            for prec, shapes in sweeps:
                for threads, per in shapes:
                    for unroll in (4, 8, 16) if args.sweep and prec == "float32" and \
                            (threads, per) == (128, 4) else (8,):
                        def call(prec=prec, threads=threads, per=per, unroll=unroll, xd=xd,
                                 md=md):
                            return p2p_block(xd, xd, md, softening=1e-3, precision=prec,
                                                 potential=True, exclude="index",
                                                 threads=threads, per_thread=per,
                                                 unroll=unroll)
                        t = cuda_event_seconds(call, 3, warm=1)[0]
                        emit(env, workload="p2p_gpu_sweep", n=n, precision=prec, potential=True,
                             threads=threads, per_thread=per, unroll=unroll, seconds=t,
                             pairs_per_s=n * n / t)
        del xd, md
        cupy.get_default_memory_pool().free_all_blocks()

    # truncated kernel: exact erfc vs table levels, every pair inside the table
    n = 2 ** 18
    rng = np.random.default_rng(2)
    x = rng.uniform(0.0, 1.0, size=(n, 3))
    xd, md = cupy.asarray(x), cupy.asarray(np.full(n, 1.0 / n))
    for prec in ("float32", "float64"):
        base = None
        for level in (None, 0, 1, 2, 3, 4):
            def call(prec=prec, level=level):
                return p2p_block(xd, xd, md, softening=1e-4, precision=prec,
                                 potential=False, box_size=1.0, rs=0.25, r_cut=1.2,
                                 table_level=level, exclude="index")
            t = cuda_event_seconds(call, args.repeat, warm=1)[0]
            base = t if level is None else base
            emit(env, workload="truncated_gpu", n=n, precision=prec, potential=False,
                 table_level=level, seconds=t, pairs_per_s=n * n / t,
                 speedup_vs_exact=base / t)


def bench_cpu(env, args):
    import numba

    from cosmo_dask.gravity.p2p_kernels import p2p_block

    env = dict(env, device="cpu", threads=numba.get_num_threads())
    n = 4096
    rng = np.random.default_rng(2)
    x = rng.uniform(0.0, 1.0, size=(n, 3))
    m = np.full(n, 1.0 / n)
    for prec in ("float32", "float64"):
        base = None
        for level in (None, 0, 1, 2, 3, 4):
            def call(prec=prec, level=level):
                return p2p_block(x, x, m, softening=1e-4, precision=prec, potential=False,
                                 box_size=1.0, rs=0.25, r_cut=1.2, table_level=level,
                                 exclude="index")
            call()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t0)
            t = statistics.median(ts)
            base = t if level is None else base
            emit(env, workload="truncated_cpu", n=n, precision=prec, potential=False,
                 table_level=level, seconds=t, pairs_per_s=n * n / t,
                 speedup_vs_exact=base / t)


def main(argv=None):
    ap = parser(__doc__, repeat=5, devices=("gpu", "cpu"))  # cpu: the CPU rows only
    ap.add_argument("--sweep", action="store_true", help="also sweep GPU launch shapes")
    ap.add_argument("--sweep-logn", type=int, default=20)
    ap.add_argument("--shapes", default="", help="float32 launch shapes to time, e.g. 256x4,128x4")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    start(args, "gravity-direct")
    env = dict(bench="gravity_direct", date=datetime.date.today().isoformat())

    from cosmo_dask.gravity.truncated import table_relative_errors

    for dt in ("float64", "float32"):
        err = table_relative_errors(dtype=np.dtype(dt))
        emit(env, workload="truncated_table_error", precision=dt, n_samples=2**20 + 1,
             **{f"max_rel_err_level{lv}": e for lv, e in err.items()})
    if not args.no_gpu and args.device == "gpu":
        from cosmo_dask.core.backend import gpu_available

        if gpu_available():
            bench_gpu(env, args)
        else:
            emit(env, workload="p2p_gpu", skipped="no GPU")
    if not args.no_cpu:
        bench_cpu(env, args)


if __name__ == "__main__":
    main()
