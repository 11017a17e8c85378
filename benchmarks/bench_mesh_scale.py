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
printed). Per run: wall seconds, the peak memory of each worker (the
scheduler's heartbeat RSS, sampled every 0.5 s) as a fraction of the mesh
(``n^3 * itemsize``), the bytes spilled to disk; at the end the largest
relative difference between the clusters' results (P(k): max |dP| / max |P|;
PM: max |da| / max |a|). The runs are sequential; nothing else should run.

    python benchmarks/bench_mesh_scale.py                                  # item 6 (heavy)
    python benchmarks/bench_mesh_scale.py --n-side 64 --n-mesh 256 --memory-limit 1GB \\
        --single-memory 2GB                                                # a quick check

Prints one JSON line per measurement and a summary line.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing import emit  # noqa: E402


class PeakMemory:
    """The largest RSS each worker reported to the scheduler while running."""

    def __init__(self, client, interval: float = 0.5):
        self.client, self.interval = client, interval
        self.peak: dict[str, int] = {}
        self.spilled: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            try:
                info = self.client.scheduler_info(n_workers=-1)["workers"]
            except Exception:  # the cluster is closing
                break
            for addr, w in info.items():
                metrics = w.get("metrics", {})
                self.peak[addr] = max(self.peak.get(addr, 0), int(metrics.get("memory", 0)))
                disk = metrics.get("spilled_bytes", {}).get("disk", 0)
                self.spilled[addr] = max(self.spilled.get(addr, 0), int(disk))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _snapshot(path: Path, n_side: int, box: float, seed: int) -> str:
    from cosmo_dask import Snapshot

    if (path / "zarr.json").exists():
        return str(path)
    rng = np.random.default_rng(seed)
    pos = (rng.random((n_side**3, 3), dtype=np.float64) * box).astype(np.float32)
    pos[pos >= box] = 0.0  # float32 rounding of values just below the box
    Snapshot.from_arrays(pos=pos, box_size=box, particle_mass=1.0).to_zarr(path)
    return str(path)


def _run(label: str, args, store: str, slabs: int | None, workers: int, memory: str,
         env: dict):
    import dask
    from distributed import Client, LocalCluster

    from cosmo_dask import open_snapshot
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density.paint import mesh_slabs
    from cosmo_dask.gravity.pm import pm_accelerations

    out = {}
    itemsize = np.dtype(args.precision).itemsize
    mesh_bytes = args.n_mesh**3 * itemsize
    for what in args.what:  # every measurement on a fresh cluster
        with LocalCluster(n_workers=workers, threads_per_worker=1, memory_limit=memory,
                          processes=True, dashboard_address=":0",
                          local_directory=args.work) as cluster, Client(cluster) as client:
            if slabs is None:
                slabs = mesh_slabs(args.n_mesh, args.precision, gpu=False, what="bench")
            snap = open_snapshot(store)
            t0 = time.perf_counter()
            with PeakMemory(client) as mem:
                if what == "power":
                    ds = power_spectrum(snap, n_mesh=args.n_mesh, precision=args.precision,
                                        slabs=slabs)
                    result = ds["power"].values
                else:
                    acc, _ = pm_accelerations(snap.pos, float(snap.particle_mass), G=1.0,
                                              box_size=snap.box_size, n_mesh=args.n_mesh,
                                              precision=args.precision, potential=False,
                                              slabs=slabs)
                    result = acc.compute()
            dt = time.perf_counter() - t0
        out[what] = result
        peaks = sorted(mem.peak.values())
        emit(env, run=label, workload=what, workers=workers, memory_limit=memory,
             slabs=slabs, seconds=round(dt, 2),
             peak_worker_gib=[round(p / 2**30, 2) for p in peaks],
             peak_fraction_of_mesh=[round(p / mesh_bytes, 3) for p in peaks],
             spilled_gib=[round(s / 2**30, 2) for s in sorted(mem.spilled.values())],
             dask=dask.__version__)
    return out, slabs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    env = {"bench": "mesh_scale", "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
           "machine": platform.node(), "n_side": args.n_side, "n_mesh": args.n_mesh,
           "precision": args.precision}
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
