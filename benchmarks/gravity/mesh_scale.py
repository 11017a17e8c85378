"""Issue 19, item 6: the mesh path on two small CPU workers against one worker.

Workload: ``--n-side``^3 particles (default 256^3), uniform random float32
positions in a ``--box`` Mpc/h box, mass 1 each, written once to a Zarr
snapshot under ``--work`` (the workers read their chunks from it). Then, on
each cluster in turn,

* ``two``: a ``LocalCluster`` of ``--workers`` (2) worker processes, one thread
  each, ``memory_limit=--memory-limit`` (4GB) each;
* ``one``: a ``LocalCluster`` of one worker process, one thread,
  ``memory_limit=--single-memory`` (default 8GB: one 4 GB worker cannot hold a
  1024^3 float32 mesh, which the mesh path refuses before any work),

it computes

* ``power``: :func:`cosmo_dask.analysis.power_spectrum` (CIC, interlaced,
  ``--precision``) on an ``--n-mesh``^3 mesh (default 1024);
* ``pm``: :func:`cosmo_dask.gravity.pm.pm_accelerations` (plain PM, ``r_split = 0``,
  interlaced, no potential, ``--precision``) of the particles on the same mesh,
  the accelerations gathered to the client.

Both clusters use the same slab count (the two-worker cluster's default,
printed). Per run (``bench_memory_limit.run``): wall seconds, each worker's
peak memory (the scheduler's heartbeat, sampled every 0.2 s) and peak RSS
(``getrusage``: each run has fresh workers), the latter also as a fraction of
the mesh (``n^3 * itemsize``), the bytes spilled to disk, workers replaced
(killed for exceeding their limit); at the end the largest
relative difference between the clusters' results (P(k): max |dP| / max |P|;
PM: max |da| / max |a|). The runs are sequential; nothing else should run.

    python -m benchmarks mesh-scale                                  # item 6 (heavy)
    python -m benchmarks mesh-scale --n-side 64 --n-mesh 256 --memory-limit 1GB \\
        --single-memory 2GB                                                # a quick check

GPU (``--device gpu``, one GPU, the local synchronous scheduler): the same two
workloads on CuPy chunks (``--n-side`` uniform random float32 particles made on
the GPU, chunks of 2^24 rows), default ``--n-mesh 2048 --n-side 512``, after a
warm-up at 128^3 (kernel compilation): seconds (CUDA stream synchronised) and
the peak GPU memory (CuPy's memory pool, emptied before each run: its size at
the end is the largest it held), the slab count the mesh path chose
(``--slabs`` to force one); ``--no-interlace`` for a P(k) of one mesh (half
the memory). A run that runs out of GPU memory is reported as such.
``--chunk-rows`` sets the GPU chunks' rows.

``--two-stage`` forces the two-stage particle <-> slab exchange
(:mod:`cosmo_dask.spatial.slabs`; by default only above 16,384 (chunk, slab) pairs),
to time it against the one-stage exchange at small sizes.

Prints one JSON line per measurement and a summary line.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402
from benchmarks.runtime.memory_limit import run as measured  # noqa: E402


def _snapshot(path: Path, n_side: int, box: float, seed: int) -> str:
    from cosmo_dask import Snapshot

    if (path / "zarr.json").exists():
        return str(path)
    rng = np.random.default_rng(seed)
    pos = (rng.random((n_side**3, 3), dtype=np.float64) * box).astype(np.float32)
    pos[pos >= box] = 0.0  # float32 rounding of values just below the box
    Snapshot.from_arrays(pos=pos, box_size=box, particle_mass=1.0).to_zarr(path)
    return str(path)


def _workload(what: str, snap, args, slabs: int, out: dict) -> dict:
    """One measured computation: its result goes to ``out[what]``."""
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.gravity.pm import pm_accelerations

    if what == "power":
        ds = power_spectrum(snap, n_mesh=args.n_mesh, precision=args.precision, slabs=slabs)
        out[what] = ds["power"].values
    else:
        acc, _ = pm_accelerations(snap.pos, float(snap.particle_mass), G=1.0,
                                  box_size=snap.box_size, n_mesh=args.n_mesh,
                                  precision=args.precision, potential=False, slabs=slabs)
        out[what] = acc.compute()
    return {}


def _run(label: str, args, store: str, slabs: int | None, workers: int, memory: str,
         env: dict):
    import dask
    from distributed import Client, LocalCluster

    from cosmo_dask import open_snapshot
    from cosmo_dask.density.painting import mesh_slabs

    out = {}
    itemsize = np.dtype(args.precision).itemsize
    mesh_bytes = args.n_mesh**3 * itemsize
    for what in args.what:  # every measurement on a fresh cluster: its peak RSS is its own
        with LocalCluster(n_workers=workers, threads_per_worker=1, memory_limit=memory,
                          processes=True, dashboard_address=":0",
                          local_directory=args.work) as cluster, Client(cluster) as client:
            if slabs is None:
                slabs = mesh_slabs(args.n_mesh, args.precision, gpu=False, what="bench")
            work = functools.partial(_workload, what, open_snapshot(store), args, slabs, out)
            rec = measured(what, client, work)
        rss = rec["peak_rss_gib_per_worker"]
        emit(env, run=label, workload=what, workers=workers, memory_limit=memory,
             slabs=slabs, seconds=rec["wall_s"],
             peak_worker_gib=rec["peak_memory_gib_per_worker"], peak_rss_gib=rss,
             peak_rss_fraction_of_mesh=[round(r * 2**30 / mesh_bytes, 3) for r in rss],
             spilled_gib=rec["spilled_gib_per_worker"],
             workers_replaced=rec["workers_replaced"], dask=dask.__version__)
    return out, slabs


def _gpu(args, env) -> None:
    import cupy
    import dask
    import dask.array as da

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density.painting import mesh_slabs
    from cosmo_dask.gravity.pm import pm_accelerations

    pool = cupy.get_default_memory_pool()
    dev = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    env = {**env, "device": dev, "interlace": not args.no_interlace}

    def particles(n_side):
        rng = cupy.random.default_rng(1)
        pos = rng.random((n_side**3, 3), dtype=np.float32) * np.float32(args.box)
        pos[pos >= args.box] = 0.0
        return da.from_array(pos, chunks=(min(args.chunk_rows, n_side**3), 3), asarray=False)

    def run(what, pos, n_mesh, slabs):
        if what == "power":
            ds = power_spectrum(pos, n_mesh=n_mesh, box_size=args.box, precision=args.precision,
                                interlace=not args.no_interlace, slabs=slabs)
            return ds["power"].values
        acc, _ = pm_accelerations(pos, 1.0, G=1.0, box_size=args.box, n_mesh=n_mesh,
                                  precision=args.precision, potential=False, slabs=slabs)
        out = acc.compute()
        cupy.cuda.get_current_stream().synchronize()
        return out

    with dask.config.set(scheduler="synchronous"):
        small = particles(32)
        for what in args.what:  # warm-up: kernel compilation, FFT plans
            run(what, small, 128, 2)
        del small
        pos = particles(args.n_side).persist()
        slabs = args.slabs or mesh_slabs(args.n_mesh, args.precision, gpu=True, what="bench")
        for what in args.what:
            pool.free_all_blocks()
            base = pool.used_bytes()
            t0 = time.perf_counter()
            try:
                result = run(what, pos, args.n_mesh, slabs)
                ok = True
            except cupy.cuda.memory.OutOfMemoryError as exc:
                result, ok = None, f"out of GPU memory: {exc}"
            dt = time.perf_counter() - t0
            mesh_bytes = args.n_mesh**3 * np.dtype(args.precision).itemsize
            emit(env, run="gpu", workload=what, slabs=slabs, seconds=round(dt, 2),
                 chunks=len(pos.chunks[0]), two_stage=args.two_stage,
                 ok=ok, peak_gpu_gib=round((pool.total_bytes() - base) / 2**30, 2),
                 peak_fraction_of_mesh=round((pool.total_bytes() - base) / mesh_bytes, 3),
                 finite=None if result is None else bool(cupy.isfinite(
                     cupy.asarray(result)).all()))
            del result


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--n-side", type=int, default=256)
    ap.add_argument("--n-mesh", type=int, default=1024)
    ap.add_argument("--box", type=float, default=1000.0)
    ap.add_argument("--precision", choices=("float32", "float64"), default="float32")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--single-memory", default="8GB")
    ap.add_argument("--slabs", type=int, default=None)
    ap.add_argument("--what", nargs="+", choices=("power", "pm"), default=["power", "pm"])
    ap.add_argument("--work", default="/tmp/bench_mesh_scale")
    ap.add_argument("--skip-single", action="store_true",
                    help="only the multi-worker cluster (no comparison)")
    ap.add_argument("--no-interlace", action="store_true", help="GPU: P(k) of one mesh")
    ap.add_argument("--chunk-rows", type=int, default=2**24, help="GPU: rows per chunk")
    ap.add_argument("--two-stage", action="store_true",
                    help="force the two-stage particle <-> slab exchange")
    args = ap.parse_args(argv)
    start(args, "mesh-scale")
    if args.two_stage:  # the graphs are built here, in this process
        import cosmo_dask.spatial.domains as sd

        sd.TWO_STAGE_PAIRS = 0
    if args.device == "gpu":
        if "--n-mesh" not in sys.argv:
            args.n_mesh = 2048
        if "--n-side" not in sys.argv:
            args.n_side = 512
        env = {"bench": "mesh_scale", "date": time.strftime("%Y-%m-%d"),
               "machine": platform.node(), "n_side": args.n_side, "n_mesh": args.n_mesh,
               "precision": args.precision}
        _gpu(args, env)
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    env = {"bench": "mesh_scale", "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
           "machine": platform.node(), "n_side": args.n_side, "n_mesh": args.n_mesh,
           "precision": args.precision, "two_stage": args.two_stage}
    t0 = time.perf_counter()
    store = _snapshot(Path(args.work) / f"uniform_{args.n_side}.zarr", args.n_side, args.box, 1)
    emit(env, step="snapshot", seconds=round(time.perf_counter() - t0, 2), path=store)
    two, slabs = _run("two", args, store, args.slabs, args.workers, args.memory_limit, env)
    if args.skip_single:
        return
    one, _ = _run("one", args, store, slabs, 1, args.single_memory, env)
    diffs = {}
    for what in args.what:
        a, b = np.asarray(two[what], np.float64), np.asarray(one[what], np.float64)
        good = np.isfinite(b)
        diffs[what] = float(np.abs(a[good] - b[good]).max() / np.abs(b[good]).max())
    emit(env, step="summary", slabs=slabs, max_relative_difference=diffs,
         bitwise_equal={w: bool(np.array_equal(two[w], one[w], equal_nan=True))
                        for w in args.what})


if __name__ == "__main__":
    main()
