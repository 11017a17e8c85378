"""Expansion timings: SCF (here) and MEX (``--methods mex``, in ``benchmarks/expansion/mex.py``).

SCF workload: a Hernquist sphere (scale 1, mass 1, ``cosmo_dask.models.hernquist``)
of N particles expanded about its true centre with nmax = 10, lmax = 6
(``--nmax``, ``--lmax``), scale radius 1; "fit + forces" is the coefficient fit
plus the accelerations at every particle.

CPU: kernel level (numba :func:`~cosmo_dask.expansion.scf_kernels.scf_coefficient_sums`
+ :func:`~cosmo_dask.expansion.scf_kernels.scf_evaluate`, all cores numba has),
end to end through dask (``SCF.fit`` on a dask array of ``--chunks``-row NumPy
chunks + ``accelerations().compute()``, local threaded scheduler), and with
``--gala`` the same fit + forces by gala (``compute_coeffs_discrete`` +
``SCFPotential.acceleration``, single-threaded C) with the time ratio and the
relative difference of the two force fields. Wall clock, median of ``--repeat``
after one warm-up (gala: one run).

GPU: device-resident CuPy input; kernel level (coefficient kernel + block sum
+ force kernel) timed with CUDA events after two warm-ups, median of
``--repeat``; float32 and float64; the float32 force error against float64
(median, 90th, 99th percentile, max); then end to end through dask on CuPy
chunks (wall clock).

Prints one JSON object per measurement (with host, cpus, date).
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import cuda_event_seconds, parser, start
from benchmarks.common import emit as _emit  # noqa: E402
from benchmarks.common import wall_median as _wall


def _particles(n, seed=0):
    from cosmo_dask.models import hernquist

    x = np.ascontiguousarray(hernquist(n, seed=seed).pos.compute(), dtype=np.float64)
    return x, np.full(n, 1.0 / n)


def _rel_err(a, ref):
    e = np.linalg.norm(a - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return {"median": float(np.median(e)), "p90": float(np.percentile(e, 90)),
            "p99": float(np.percentile(e, 99)), "max": float(e.max())}


# ----------------------------------------------------------------------------- SCF CPU
def _scf_cpu(n, args, env):
    import dask
    import dask.array as da
    import numba

    from cosmo_dask.expansion import SCF
    from cosmo_dask.expansion.scf_kernels import scf_coefficient_sums, scf_evaluate, unpack_sums

    nmax, lmax = args.nmax, args.lmax
    x, m = _particles(n)
    base = dict(bench="scf", device="cpu", n=n, nmax=nmax, lmax=lmax,
                numba_threads=numba.get_num_threads())

    def kernels():
        sums, msum, _ = unpack_sums(scf_coefficient_sums(x, m, nmax, lmax, 1.0), nmax, lmax)
        return scf_evaluate(x, sums[0] / msum, sums[1] / msum, 1.0, msum, "acceleration")

    t = _wall(kernels, args.repeat)
    _emit(env, **base, level="kernel", what="fit+forces", s_median=t)

    chunks = args.chunks or max(1, n // 4)
    dx = da.from_array(x, chunks=(chunks, 3))
    dm = da.from_array(m, chunks=chunks)

    def end_to_end():
        scf = SCF(nmax, lmax, center=(0.0, 0.0, 0.0)).fit(dx, dm)
        return scf, scf.accelerations(dx).compute()

    with dask.config.set(scheduler="threads"):
        t_e2e = _wall(end_to_end, args.repeat)
        scf, acc = end_to_end()
    _emit(env, **base, level="dask_end_to_end", what="fit+forces", chunks=chunks,
          s_median=t_e2e)

    if args.precision_check:
        with dask.config.set(scheduler="threads"):
            f32 = SCF(nmax, lmax, center=(0.0, 0.0, 0.0), precision="float32").fit(dx, dm)
            a32 = f32.accelerations(dx).compute()
        _emit(env, **base, level="accuracy", what="float32 vs float64 forces",
              rel_err=_rel_err(a32.astype(np.float64), acc))

    if args.gala:
        if importlib.util.find_spec("gala") is None:
            _emit(env, **base, level="gala", skipped="gala not installed")
            return
        from gala.potential.scf import SCFPotential, compute_coeffs_discrete

        def gala_run():
            S, T = compute_coeffs_discrete(x, m / m.sum(), nmax, lmax, 1.0)
            pot = SCFPotential(m=m.sum(), r_s=1.0, Snlm=S, Tnlm=T, units=None)
            return S, T, np.asarray(pot.acceleration(x.T)).T

        t0 = time.perf_counter()
        S, T, ag = gala_run()
        t_gala = time.perf_counter() - t0
        _emit(env, **base, level="gala", what="fit+forces (gala, 1 thread)", s=t_gala,
              ratio_vs_dask_end_to_end=t_gala / t_e2e, ratio_vs_kernel=t_gala / t,
              coef_max_abs_diff=float(max(np.abs(scf.S - S).max(), np.abs(scf.T - T).max())),
              force_rel_diff=_rel_err(acc, ag))


# ----------------------------------------------------------------------------- SCF GPU
def _scf_gpu_one(prec, x, m, n, args, env, dev):
    import cupy

    from cosmo_dask.expansion.scf_kernels import unpack_sums
    from cosmo_dask.expansion.scf_kernels_gpu import scf_coefficient_sums_gpu, scf_evaluate_gpu

    nmax, lmax = args.nmax, args.lmax
    dt = np.dtype(prec)
    gx = cupy.asarray(x, dtype=dt)
    gm = cupy.asarray(m, dtype=dt)
    base = dict(bench="scf", device="gpu", gpu=dev, n=n, nmax=nmax, lmax=lmax,
                precision=prec)

    def fit():
        v = scf_coefficient_sums_gpu(gx, gm, nmax, lmax, 1.0)
        sums, msum, _ = unpack_sums(cupy.asnumpy(v), nmax, lmax)
        return sums[0] / msum, sums[1] / msum, msum

    def fit_device():  # no host copy: what the timed kernel level includes
        return scf_coefficient_sums_gpu(gx, gm, nmax, lmax, 1.0)

    S, T, msum = fit()

    def forces():
        return scf_evaluate_gpu(gx, S, T, 1.0, msum, "acceleration")

    def both():
        v = fit_device()
        return v, forces()

    def timed(fn):  # milliseconds
        return cuda_event_seconds(fn, args.repeat, warm=2)[0] * 1e3

    t_fit, t_force, t_both = timed(fit_device), timed(forces), timed(both)
    _emit(env, **base, level="kernel", ms_fit=t_fit, ms_forces=t_force,
          ms_fit_plus_forces=t_both,
          note="fit = coefficient kernel + block sum on the device; forces at all N")
    out = cupy.asnumpy(forces()).astype(np.float64)

    import dask
    import dask.array as da

    from cosmo_dask.expansion import SCF

    chunks = args.chunks or n
    dx = da.from_array(gx, chunks=(chunks, 3), asarray=False)
    dm = da.from_array(gm, chunks=chunks, asarray=False)

    def end_to_end():
        scf = SCF(nmax, lmax, center=(0.0, 0.0, 0.0), precision=prec).fit(dx, dm)
        a = scf.accelerations(dx).compute()
        cupy.cuda.Device().synchronize()
        return a

    with dask.config.set(scheduler="threads"):
        t = _wall(end_to_end, max(3, args.repeat // 2))
    _emit(env, **base, level="dask_end_to_end", what="fit+forces", chunks=chunks,
          ms_median=1e3 * t)
    return out


def _scf_gpu(n, args, env):
    import cupy

    from cosmo_dask.expansion.scf_kernels import unpack_sums

    nmax, lmax = args.nmax, args.lmax
    x, m = _particles(n)
    dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    results = {prec: _scf_gpu_one(prec, x, m, n, args, env, dev)
               for prec in ("float64", "float32")}
    _emit(env, bench="scf", device="gpu", gpu=dev, n=n, nmax=nmax, lmax=lmax,
          level="accuracy", what="float32 vs float64 GPU forces",
          rel_err=_rel_err(results["float32"], results["float64"]))
    if args.cpu_check:
        from cosmo_dask.expansion.scf_kernels import (
            scf_coefficient_sums,
            scf_evaluate,
        )

        k = slice(0, min(n, 200_000))
        sums, msum, _ = unpack_sums(scf_coefficient_sums(x, m, nmax, lmax, 1.0), nmax, lmax)
        a_cpu = scf_evaluate(x[k], sums[0] / msum, sums[1] / msum, 1.0, msum, "acceleration")
        _emit(env, bench="scf", device="gpu", gpu=dev, n=n, level="accuracy",
              what="GPU float64 vs CPU float64 forces (first 2e5 particles)",
              rel_err=_rel_err(results["float64"][k], a_cpu))


def bench_scf(args, env):
    for n in args.n:
        (_scf_gpu if args.device == "gpu" else _scf_cpu)(int(n), args, env)


def main(argv=None):
    p = parser(__doc__, repeat=5)
    p.add_argument("--n", type=int, nargs="+", default=[100_000])
    p.add_argument("--methods", nargs="+", choices=["scf", "mex"], default=["scf"])
    p.add_argument("--nmax", type=int, default=10)
    p.add_argument("--lmax", type=int, default=6)
    p.add_argument("--chunks", type=int, default=None)
    p.add_argument("--precision", default="float64", help="MEX precision")
    p.add_argument("--gala", action="store_true", help="CPU: compare with gala")
    p.add_argument("--precision-check", action="store_true",
                   help="CPU: float32 vs float64 force error")
    p.add_argument("--cpu-check", action="store_true", help="GPU: compare with the CPU kernels")
    args = p.parse_args(argv)
    start(args, "expansion")
    env = {"host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    if "scf" in args.methods:
        bench_scf(args, env)
    if "mex" in args.methods:
        from benchmarks.expansion.mex import bench_mex

        bench_mex(args, env)


if __name__ == "__main__":
    main()
