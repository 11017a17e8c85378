"""MEX timings: kernel level (one device, no dask) and end to end through dask.

Workload: a Plummer sphere (scale 1, total mass 1) of N particles, lmax = 6
(``--lmax``), float64 (``--precision``).

GPU: positions and masses are device-resident CuPy arrays. Kernel level is
:func:`cosmo_dask.expansion.mex_kernels_gpu.forces_local_gpu` (radius argsort and
gathers, terms kernel, two ``cupy.cumsum`` scans and transposes, evaluation
kernel, scatter back to input order), timed with CUDA events after two
warm-up calls, median of ``--repeat`` runs, with the per-stage medians. End to
end: ``MEX(lmax).fit(dask array of CuPy chunks)`` plus computing
``accelerations()`` and ``potential()`` (local threaded scheduler, wall clock,
median after one warm-up; on the GPU the synchronous scheduler, one task at a
time as on a dask-cuda worker). CPU: the numba ``forces_local`` and the same
dask path on NumPy chunks.

Run through ``python -m benchmarks expansion --methods mex`` (``bench_mex(args, env)``).
Prints one JSON object per measurement.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit as _emit  # noqa: E402
from benchmarks.common import wall_median as _wall


def plummer(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    u = rng.uniform(1e-6, 1 - 1e-6, n)
    r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    v = rng.normal(size=(n, 3))
    v /= np.linalg.norm(v, axis=1)[:, None]
    return r[:, None] * v, np.full(n, 1.0 / n)


def _dask_end_to_end(pos, mass, lmax, chunks, precision, scheduler=None):
    """``scheduler="sync"`` runs one task at a time, as a dask-cuda worker (one thread
    per GPU) does; the threaded default would run many bucket tasks on one GPU."""
    import dask
    import dask.array as da

    from cosmo_dask.expansion import MEX

    dx = da.from_array(pos, chunks=(chunks, 3), asarray=False)
    dm = da.from_array(mass, chunks=chunks, asarray=False)

    def run():
        with dask.config.set(scheduler=scheduler or dask.config.get("scheduler", None)):
            mex = MEX(lmax=lmax, precision=precision).fit(dx, dm)
            return dask.compute(mex.accelerations(), mex.potential())

    return run


def _gpu_kernel_level(cupy, gpu, pos, mass, lmax, args, env, name, dtype, n):
    for _ in range(2):
        gpu.forces_local_gpu(pos, mass, lmax)
    cupy.cuda.Device().synchronize()
    totals, stages = [], {}
    for _ in range(args.repeat):
        events = [("start", cupy.cuda.Event())]
        events[0][1].record()

        def mark(name, events=events):
            e = cupy.cuda.Event()
            e.record()
            events.append((name, e))

        gpu.forces_local_gpu(pos, mass, lmax, timer=mark)
        events[-1][1].synchronize()
        for (_, a), (stage, b) in zip(events[:-1], events[1:], strict=True):
            stages.setdefault(stage, []).append(cupy.cuda.get_elapsed_time(a, b))
        totals.append(cupy.cuda.get_elapsed_time(events[0][1], events[-1][1]))
    _emit(env, bench="mex", level="kernel", device="gpu", gpu=name, n=n, lmax=lmax,
          precision=dtype.name, ms_median=statistics.median(totals),
          ms_min=min(totals), stages_ms={k: statistics.median(v) for k, v in stages.items()},
          repeat=args.repeat)


def _gpu(n, args, env):
    import cupy

    from cosmo_dask.expansion import mex_kernels_gpu as gpu

    dtype = np.dtype(args.precision)
    x, m = plummer(n)
    pos = cupy.asarray(x, dtype=dtype)
    mass = cupy.asarray(m, dtype=dtype)
    lmax = args.lmax
    dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    name = dev["name"].decode() if isinstance(dev["name"], bytes) else str(dev["name"])
    try:
        _gpu_kernel_level(cupy, gpu, pos, mass, lmax, args, env, name, dtype, n)
    except cupy.cuda.memory.OutOfMemoryError as exc:  # one array of N: too big at large N
        _emit(env, bench="mex", level="kernel", device="gpu", gpu=name, n=n, lmax=lmax,
              precision=dtype.name, skipped=f"out of GPU memory ({exc})")
        cupy.get_default_memory_pool().free_all_blocks()
    chunks = args.chunks or n
    run = _dask_end_to_end(pos, mass, lmax, chunks, dtype.name, scheduler="sync")
    t = _wall(lambda: (run(), cupy.cuda.Device().synchronize()), max(1, args.repeat // 3))
    _emit(env, bench="mex", level="dask_end_to_end", device="gpu", gpu=name, n=n, lmax=lmax,
          precision=dtype.name, chunks=chunks, scheduler="sync (one GPU worker thread)",
          s_median=t)


def _cpu(n, args, env):
    from cosmo_dask.expansion import mex_kernels as cpu

    dtype = np.dtype(args.precision)
    x, m = plummer(n)
    pos, mass = x.astype(dtype), m.astype(dtype)
    lmax = args.lmax
    t = _wall(lambda: cpu.forces_local(pos, mass, lmax), max(1, args.repeat // 3))
    _emit(env, bench="mex", level="kernel", device="cpu", n=n, lmax=lmax,
          precision=dtype.name, s_median=t, threads=1)
    chunks = args.chunks or max(1, n // 8)
    run = _dask_end_to_end(pos, mass, lmax, chunks, dtype.name)
    t = _wall(run, max(1, args.repeat // 3))
    _emit(env, bench="mex", level="dask_end_to_end", device="cpu", n=n, lmax=lmax,
          precision=dtype.name, chunks=chunks, s_median=t)


def bench_mex(args, env):
    """Run the MEX measurements for every N in ``args.n`` on ``args.device``.

    ``args`` needs ``n`` (list of int) and ``device`` ("cpu" | "gpu"); optional
    ``lmax`` (6), ``precision`` ("float64"), ``repeat`` (10), ``chunks`` (dask
    chunk size; default one chunk on the GPU, 8 on the CPU). ``env`` (dict) is
    copied into every JSON line.
    """
    for key, default in (("lmax", 6), ("precision", "float64"), ("repeat", 10),
                         ("chunks", None)):
        if not hasattr(args, key) or getattr(args, key) is None:
            setattr(args, key, default)
    for n in args.n:
        (_gpu if args.device == "gpu" else _cpu)(int(n), args, env)
