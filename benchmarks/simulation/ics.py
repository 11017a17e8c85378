"""Initial-condition generation: `lpt_ics` slab by slab, against another checkout.

Workload: ``lpt_ics(n_side, box_size=n_side Mpc/h, redshift=49, order=...)``,
float32 positions and velocities (``--precision``), seed 1. Measured per run, each
run in a fresh subprocess (so peak memory is the run's own):

* ``generate``: the particles computed and reduced (a sum of pos and vel per
  chunk, so no array of all particles is held) on the local threaded scheduler
  (all cores) -- the IC work alone;
* ``zarr`` (``--zarr DIR``): ``snapshot.to_zarr`` of the same ICs (generation plus
  the write, uncompressed, as ``cosmo-dask ics`` does);
* ``peak_rss_gib``: the subprocess's peak resident memory (host).

``--peer PATH`` runs the same measurement with the cosmo_dask of another checkout
(e.g. ``/work/main`` before this change) on ``PYTHONPATH``, alternating with this
one, so the ratio holds on a noisy machine. Arguments a checkout does not know
(``slabs``, ``device``) are only passed when given.

``--compare-workers 1,2`` (CPU): the acceptance check of issue 19 instead -- the
same ICs computed on a ``LocalCluster`` of 1 and of 2 worker processes (the host's
cores split between them), compared by a BLAKE2 digest of every chunk of pos, vel
and ids (no particle array is gathered); prints the time of each and whether all
digests agree.

GPU (``--device gpu``): CuPy chunks, the threaded scheduler in-process; one 64^3
warm-up run first (CuPy kernels, cuFFT plans), then ``--repeat`` timed runs, whose
end is the host copy of the reduced sums (a device synchronisation).

Prints one JSON object per measurement and one summary (medians, ratio).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _one(args) -> dict:
    """One measurement in this process (the child side)."""
    import resource
    import shutil

    import dask

    import cosmo_dask
    from cosmo_dask.core.backend import host
    from cosmo_dask.models import lpt_ics

    try:  # this checkout's slab count (None for a checkout without slabs)
        from cosmo_dask.models.lpt_fields import ics_slab_count

        slabs = ics_slab_count(args.n_side, args.slabs, args.device)
    except ImportError:
        slabs = None

    extra = {}
    if args.slabs:
        extra["slabs"] = args.slabs
    if args.device != "cpu":
        extra["device"] = args.device

    def make(n):
        return lpt_ics(n, box_size=float(n), redshift=49.0, order=args.order, seed=1,
                       precision=args.precision, chunks=args.chunks, **extra)

    def reduce(snap):
        sums = [x.sum(axis=0) for x in (snap.pos, snap.vel)]
        out = dask.compute(*sums, scheduler="threads")
        return [float(host(o)[0]) for o in out]

    if args.device == "gpu":
        reduce(make(64))  # warm-up: kernels, cuFFT plans
    snap = make(args.n_side)
    t0 = time.perf_counter()
    if args.zarr:
        path = Path(args.zarr) / f"ics_{os.getpid()}.zarr"
        snap.to_zarr(path, overwrite=True, progress=False)
        check = None
        shutil.rmtree(path, ignore_errors=True)
    else:
        check = reduce(snap)
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"seconds": round(dt, 3), "peak_rss_gib": round(rss, 2), "check": check,
            "code": str(Path(cosmo_dask.__file__).resolve().parents[1]),
            "slabs_used": slabs, "n_chunks": len(snap.pos.chunks[0])}


def _digest_block(block):
    import hashlib

    import numpy as np

    from cosmo_dask.core.backend import host

    data = np.ascontiguousarray(host(block)).tobytes()
    return np.array([int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")],
                    dtype=np.uint64)


def compare_workers(args, env: dict) -> None:
    """Digests of every chunk of the same ICs on LocalClusters of each worker count."""
    import numpy as np
    from distributed import Client, LocalCluster

    from cosmo_dask.models import lpt_ics

    cpus = os.cpu_count() or 1
    digests = {}
    for workers in (int(w) for w in args.compare_workers.split(",")):
        with LocalCluster(n_workers=workers, threads_per_worker=max(1, cpus // workers),
                          processes=True, dashboard_address=":0") as cluster, \
                Client(cluster) as client:
            warm = lpt_ics(8, box_size=8.0, redshift=49.0, order=args.order)
            client.compute(warm.pos.sum(), sync=True)  # imports on the workers
            snap = lpt_ics(args.n_side, box_size=float(args.n_side), redshift=49.0,
                           order=args.order, seed=1, precision=args.precision,
                           chunks=args.chunks, slabs=args.slabs)
            arrays = [snap.pos, snap.vel, snap.ids]
            sums = [a.map_blocks(_digest_block, chunks=((1,) * a.numblocks[0],),
                                 drop_axis=list(range(1, a.ndim)), dtype=np.uint64)
                    for a in arrays]
            t0 = time.perf_counter()
            out = client.compute(sums, sync=True)
            dt = time.perf_counter() - t0
        digests[workers] = [np.asarray(o) for o in out]
        emit({**env, "what": "compare-workers", "workers": workers,
                          "threads_per_worker": max(1, cpus // workers),
                          "seconds": round(dt, 2), "n_chunks": int(arrays[0].numblocks[0])})
    first = next(iter(digests.values()))
    same = all(all(np.array_equal(a, b) for a, b in zip(d, first, strict=True))
               for d in digests.values())
    emit({**env, "what": "compare-workers", "summary": True,
                      "workers": list(digests), "identical": bool(same)})


def main(argv=None) -> None:
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--n-side", type=int, default=256)
    ap.add_argument("--order", type=int, choices=(1, 2), default=2)
    ap.add_argument("--precision", choices=("float32", "float64"), default="float32")
    ap.add_argument("--chunks", type=int, default=None, help="particles per chunk")
    ap.add_argument("--slabs", type=int, default=None)
    ap.add_argument("--zarr", default=None, help="time to_zarr into this directory")
    ap.add_argument("--peer", default=None, help="another checkout to time alternately")
    ap.add_argument("--compare-workers", default=None, metavar="1,2",
                    help="CPU: digests of the ICs on LocalClusters of these worker counts")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    start(args, "ics")
    if args.child:
        emit(_one(args), save=False)  # the parent saves the rows
        return
    env = {"bench": "ics", "n_side": args.n_side, "order": args.order,
           "precision": args.precision, "device": args.device, "chunks": args.chunks,
           "slabs": args.slabs, "what": "zarr" if args.zarr else "generate",
           "cpus": os.cpu_count(), "host": platform.node(),
           "date": datetime.date.today().isoformat()}
    if args.compare_workers:
        compare_workers(args, env)
        return
    if args.device == "gpu":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            env["gpu"] = out.stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            env["gpu"] = None
    codes = {"this": str(ROOT)} | ({"peer": str(Path(args.peer).resolve())} if args.peer else {})
    child = [sys.executable, __file__, "--child"] + [a for a in (argv or sys.argv[1:])
                                                   if a != "--child"]
    if args.peer:
        i = child.index("--peer")
        del child[i:i + 2]
    times: dict[str, list[float]] = {k: [] for k in codes}
    for rep in range(args.repeat):
        for label, path in codes.items():
            extra = os.environ.get("PYTHONPATH", "")  # e.g. the GPU host's /tmp/site wheels
            run_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [path] + [p for p in extra.split(os.pathsep) if p and p != str(ROOT)]))
            res = subprocess.run(child, capture_output=True, text=True, env=run_env, cwd=path)
            if res.returncode != 0:
                emit({**env, "code": label, "error": res.stderr[-2000:]})
                continue
            row = json.loads(res.stdout.strip().splitlines()[-1])
            times[label].append(row["seconds"])
            emit({**env, "code": label, "rep": rep, **row})
    summary = {**env, "summary": True}
    for label, ts in times.items():
        if ts:
            summary[f"median_s_{label}"] = round(statistics.median(ts), 3)
    if args.peer and times["this"] and times["peer"]:
        summary["ratio_this_over_peer"] = round(statistics.median(times["this"])
                                                / statistics.median(times["peer"]), 3)
    emit(summary)


if __name__ == "__main__":
    main()
