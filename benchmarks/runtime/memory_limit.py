"""Memory-limited workers: FOF with MBP/MCP centres and P(k) of an N^3 Zel'dovich snapshot
read from Zarr, on a 2-process LocalCluster whose workers may hold ``--memory-limit``
each (dask's spill/pause/terminate thresholds at their defaults: 60/70/80/95 %).

Records, per analysis: wall time, each worker's peak process memory (the scheduler's
heartbeat metrics, sampled every 0.2 s, and the workers' own peak RSS from
``resource.getrusage``), bytes spilled to disk, and whether any worker process was
replaced (killed by its nanny for exceeding the limit). One JSON line per analysis.

    python -m benchmarks memory-limit --n-side 256 --memory-limit 2GB \\
        --store /tmp/z256.zarr
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class Sampler:
    """Per-worker maximum of the scheduler's memory and spilled-bytes metrics."""

    def __init__(self, client, every: float = 0.2):
        self.client, self.every = client, every
        self.peak: dict[str, int] = {}
        self.spilled: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for addr, w in self.client.scheduler_info(n_workers=-1)["workers"].items():
                m = w.get("metrics", {})
                self.peak[addr] = max(self.peak.get(addr, 0), int(m.get("memory", 0)))
                disk = m.get("spilled_bytes", {}).get("disk", 0)
                self.spilled[addr] = max(self.spilled.get(addr, 0), int(disk))
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run(name, client, work) -> dict:
    pids = client.run(os.getpid)
    with Sampler(client) as s:
        t0 = time.perf_counter()
        summary = work()
        wall = time.perf_counter() - t0
    after = client.run(os.getpid)
    rss = client.run(_peak_rss_bytes)
    gib = 2**30
    return {"analysis": name, "wall_s": round(wall, 1), **summary,
            "peak_memory_gib_per_worker": sorted(round(v / gib, 2) for v in s.peak.values()),
            "peak_rss_gib_per_worker": sorted(round(v / gib, 2) for v in rss.values()),
            "spilled_gib_per_worker": sorted(round(v / gib, 2) for v in s.spilled.values()),
            "workers_replaced": len(set(pids.values()) - set(after.values()))}


def main(argv=None):
    ap = parser(__doc__, devices=("cpu",))
    ap.add_argument("--n-side", type=int, default=256)
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n-mesh", type=int, default=256)
    ap.add_argument("--store", default=None, help="snapshot store (written if absent)")
    ap.add_argument("--centers", default="mbp,mcp")
    args = ap.parse_args(argv)
    start(args, "memory-limit")

    from distributed import Client, LocalCluster

    import cosmo_dask
    from cosmo_dask import open_snapshot
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.halos import fof

    store = args.store or f"/tmp/bench_memory_{args.n_side}.zarr"
    meta = {"bench": "memory_limit", "n_side": args.n_side, "memory_limit": args.memory_limit,
            "workers": args.workers, "host": platform.node(), "cpus": os.cpu_count(),
            "cosmo_dask": cosmo_dask.__version__, "date": time.strftime("%Y-%m-%d")}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      memory_limit=args.memory_limit, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        if not os.path.exists(store):
            from cosmo_dask.models import zeldovich

            t0 = time.perf_counter()
            zeldovich(args.n_side, box_size=args.n_side * 1.0, redshift=0.0,
                      seed=1).to_zarr(store)
            emit({**meta, "analysis": "generate",
                  "wall_s": round(time.perf_counter() - t0, 1)})
        snap = open_snapshot(store)
        centers = tuple(c for c in args.centers.split(",") if c)

        def halos():
            res = fof(snap, 0.2, centers=centers)
            n = int(res.catalog["n_members"].size)
            return {"halos": n, "largest": int(res.catalog["n_members"].max()) if n else 0}

        def power():
            pk = power_spectrum(snap, n_mesh=args.n_mesh)
            return {"n_mesh": args.n_mesh, "k_bins": int(pk.sizes["k"])}

        for name, work in (("fof+" + "+".join(centers), halos), ("power", power)):
            emit({**meta, **run(name, client, work)})


if __name__ == "__main__":
    main()
