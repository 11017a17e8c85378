"""Where the time of a GPU ``fof_labels`` goes beyond the kernel (issue 18, item 3).

On one GPU, for the clustered set of ``python -m benchmarks halos``: the store read alone (pos and
ids, the GPU reader of ``zarr_read``) with its bandwidth; then ``fof_labels`` on
device-resident particles and end to end from the store, each with a cProfile of one
warm run (``fof_labels`` computes its catalog when called, so the profile, not a graph
split, says where the time goes).

    python -m benchmarks fof-profile-gpu [--n-side 256] [--kind clustered] [--repeat 5]

Prints JSON lines; on the GPU host: `WORKLOADS=... benchmarks/device.sh`.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

from cosmo_dask import Snapshot, open_snapshot  # noqa: E402
from cosmo_dask.halos import fof_labels  # noqa: E402
from cosmo_dask.store.snapshot import GPU_READ_ROWS  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, gpu_seconds, parser, start  # noqa: E402
from benchmarks.halos.fof import particles  # noqa: E402


def _profile(fn, n=25):
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


def main(argv=None):
    ap = parser(__doc__, repeat=5, devices=("gpu",))
    ap.add_argument("--n-side", type=int, default=256)
    ap.add_argument("--kind", default="clustered")
    ap.add_argument("--min-members", type=int, default=20)
    args = ap.parse_args(argv)
    start(args, "fof-profile-gpu")
    import cupy

    pos, box = particles(args.n_side, args.kind)
    pos = pos.astype(np.float32)
    pos[pos >= box] = 0.0  # float32 rounding can land on the box edge (as bench_halos)
    n = len(pos)
    ids = np.arange(n, dtype=np.int64)
    snap = Snapshot.from_arrays(pos, box_size=box, ids=ids)
    ll = 0.2 * box / args.n_side
    env = {"n": n, "kind": args.kind, "device": cupy.cuda.runtime.getDeviceProperties(0)[
        "name"].decode(), "date": time.strftime("%Y-%m-%d")}
    d_snap = Snapshot.from_arrays(pos, ids=ids, box_size=box,
                                  chunks=GPU_READ_ROWS).to_device("gpu").persist()
    run_dev = lambda: fof_labels(d_snap, ll, min_members=args.min_members).labels.compute()  # noqa: E731
    t_dev, times, _ = gpu_seconds(run_dev, args.repeat)
    emit({"what": "fof_labels, device-resident", "seconds": t_dev,
                      "particles_per_s": n / t_dev, "all": times,
                      **env})
    print(_profile(run_dev), flush=True)
    d_snap = None
    with tempfile.TemporaryDirectory() as tmp:
        snap.to_zarr(f"{tmp}/s.zarr")
        store = open_snapshot(f"{tmp}/s.zarr", device="gpu")
        nbytes = pos.nbytes + ids.nbytes
        t_read, times, _ = gpu_seconds(lambda: dask.compute(store.pos, store.ids), args.repeat)
        t_pos, _, _ = gpu_seconds(lambda: store.pos.compute(), args.repeat)
        emit({"what": "store read, pos and ids", "seconds": t_read,
                          "pos_alone_s": t_pos, "bytes": nbytes,
                          "GB_per_s": nbytes / t_read / 1e9, "all": times, **env})
        run_store = lambda: fof_labels(store, ll, min_members=args.min_members).labels.compute()  # noqa: E731
        t_e2e, times, _ = gpu_seconds(run_store, args.repeat)
        emit({"what": "fof_labels from the store", "seconds": t_e2e,
                          "particles_per_s": n / t_e2e, "all": times,
                          **env})
        print(_profile(run_store), flush=True)


if __name__ == "__main__":
    main()
