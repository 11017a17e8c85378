"""Phase-space-element densities: deposit throughput and the gather/reduce comparison.

Workload (issue 6): a Zel'dovich snapshot of ``--n-side``^3 particles at z = 0
in a ``--box`` Mpc/h box, deposited by :func:`cosmo_dask.density.pse_density`
onto an octree of ``--patch-size``^3 patches whose finest level is
``2 * n_side`` cells per side (128^3 -> 256^3 effective), with the default
refinement (``max_tets_per_node = patch^3``).

Measurements, one JSON line each:

* ``deposit``: end-to-end wall time of ``pse_density`` (block columns, octree,
  deposit; the snapshot is generated beforehand and held in memory), median of
  ``--repeat`` after a warm-up. ``tets_per_s`` is the number of tetrahedra over
  that time. CPU: the threaded local scheduler on all cores. GPU
  (``--device gpu``): CuPy chunks, the synchronous scheduler (one task at a time
  on the device, as on a dask-cuda worker), times include a device sync.
* ``strategy`` (``--workers W``): gather and reduce on a ``W``-worker
  ``LocalCluster`` (processes, 1 thread each): wall time, bytes moved between
  workers (the workers' ``transfer_incoming_log`` totals before/after), peak
  cluster memory (distributed ``MemorySampler``: ``managed`` = bytes of task
  results held, ``process`` = RSS of the worker processes), and the maximum
  difference between the two density fields.
* ``paint``: CIC painting throughput of the same particles onto a
  ``(2 n_side)^3`` mesh (``cosmo_dask.density.paint``), for scale.

Usage::

    python -m benchmarks pse --n-side 64 --workers 4
    python -m benchmarks pse --device gpu --n-side 128 --skip-strategy
"""

from __future__ import annotations

import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def _env(device):
    env = {"date": datetime.date.today().isoformat(), "host": platform.node(),
           "device": device}
    if device == "gpu":
        import cupy as cp

        env["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    else:
        import os

        env["cpus"] = os.cpu_count()
    return env


def _snapshot(n, box, device):
    from cosmo_dask.core.backend import to_device
    from cosmo_dask.models.zeldovich_ics import zeldovich
    from cosmo_dask.store.snapshot import Snapshot

    snap = zeldovich(n, box_size=box, redshift=0.0, precision="float64")
    pos, ids = snap.pos.persist(), snap.ids.persist()
    if device == "gpu":
        pos = to_device(pos, "gpu").persist()
    return Snapshot.from_arrays(pos, ids=ids, box_size=box, particle_mass=snap.particle_mass,
                                lagrangian_shape=snap.lagrangian_shape)


def _sync(device):
    if device == "gpu":
        import cupy as cp

        cp.cuda.Device().synchronize()


def bench_deposit(snap, args, env):
    import dask

    from cosmo_dask.density import pse_density

    scheduler = "synchronous" if args.device == "gpu" else "threads"
    times, octree = [], None
    with dask.config.set(scheduler=scheduler):
        for rep in range(args.repeat + 1):
            t0 = time.perf_counter()
            octree = pse_density(snap, patch_size=args.patch_size, strategy="gather")
            _sync(args.device)
            if rep:
                times.append(time.perf_counter() - t0)
        t = float(np.median(times))
        total = octree.total_mass()
    want = snap.n_particles * snap.particle_mass
    n_tets = octree.attrs["n_tets"]
    levels = np.bincount(octree.level, minlength=octree.max_level + 1).tolist()
    if args.profile:
        import cProfile
        import pstats

        with dask.config.set(scheduler=scheduler):
            prof = cProfile.Profile()
            prof.enable()
            pse_density(snap, patch_size=args.patch_size, strategy="gather")
            _sync(args.device)
            prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    emit(env, what="deposit", n_side=args.n_side, box=args.box, n_tets=n_tets,
         patch_size=args.patch_size, leaves=octree.n_leaves, leaves_per_level=levels,
         effective=octree.effective_resolution, scheduler=scheduler, seconds=t,
         all_seconds=times, tets_per_s=n_tets / t, mass_rel_err=abs(total / want - 1))
    return octree


def bench_strategies(snap, args, env):
    from distributed import Client, LocalCluster
    from distributed.diagnostics import MemorySampler

    from cosmo_dask.density import pse_density

    def received(dask_worker):  # worker-to-worker transfers only (not results to the client)
        return sum(e["total"] for e in dask_worker.transfer_incoming_log)

    results = {}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        pse_density(snap, patch_size=args.patch_size, strategy="gather")  # warm-up: compile
        for strategy in ("gather", "reduce"):
            ms = MemorySampler()
            before = sum(client.run(received).values())
            with ms.sample("managed", measure="managed", interval=0.05), \
                    ms.sample("process", measure="process", interval=0.05):
                t0 = time.perf_counter()
                octree = pse_density(snap, patch_size=args.patch_size, strategy=strategy)
                patches = octree.patches.compute()
                t = time.perf_counter() - t0
            moved = sum(client.run(received).values()) - before
            peak = {k: float(max(v for _, v in ms.samples[k])) if ms.samples[k] else None
                    for k in ("managed", "process")}
            results[strategy] = patches
            emit(env, what="strategy", strategy=strategy, workers=args.workers,
                 n_side=args.n_side, box=args.box, n_tets=octree.attrs["n_tets"],
                 leaves=octree.n_leaves, seconds=t, bytes_moved=int(moved),
                 estimated_bytes_moved=octree.attrs["estimated_bytes_moved"],
                 peak_managed_bytes=peak["managed"], peak_process_bytes=peak["process"],
                 auto_would_pick=_auto_pick(octree))
    a, b = results["gather"], results["reduce"]
    emit(env, what="strategy_agreement", max_rel_diff=float(np.max(np.abs(a - b))
                                                           / np.max(np.abs(a))))


def _auto_pick(octree):
    est = octree.attrs["estimated_bytes_moved"]
    return "reduce" if est["reduce"] < est["gather"] else "gather"


def bench_paint(snap, args, env):
    from cosmo_dask.density import paint

    n_mesh = 2 * args.n_side
    mesh = paint(snap, n_mesh=n_mesh, scheme="cic")
    mesh.compute()
    _sync(args.device)
    t0 = time.perf_counter()
    mesh.compute()
    _sync(args.device)
    t = time.perf_counter() - t0
    emit(env, what="paint", n_side=args.n_side, n_mesh=n_mesh, seconds=t,
         particles_per_s=snap.n_particles / t)


def main(argv=None):
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--n-side", type=int, default=64)
    ap.add_argument("--box", type=float, default=100.0)
    ap.add_argument("--patch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--skip-strategy", action="store_true")
    ap.add_argument("--skip-deposit", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile one deposit (stderr)")
    args = ap.parse_args(argv)
    start(args, "pse")
    env = _env(args.device)
    snap = _snapshot(args.n_side, args.box, args.device)
    if not args.skip_deposit:
        bench_deposit(snap, args, env)
    bench_paint(snap, args, env)
    if not args.skip_strategy:
        if args.device == "gpu":
            raise SystemExit("--workers strategies run on CPU workers; pass --skip-strategy")
        bench_strategies(snap, args, env)


if __name__ == "__main__":
    main()
