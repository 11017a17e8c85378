"""Write/read throughput of a snapshot store against numpy.save/numpy.load.

Workload: N = 2^24 particles (pos, vel float32; ids int64: 512 MiB), written
with ``Snapshot.to_zarr`` and with ``numpy.save`` (one .npy per array), read
back with ``open_snapshot(path).pos.compute()`` and with ``numpy.load`` of
``pos.npy``. Each repetition runs the two side by side (alternating which goes
first) and the medians are reported, so the ratio holds on a noisy machine.

Reads are timed with the files in the page cache (as right after writing; an
eviction with posix_fadvise(DONTNEED) was tried and had no effect on the VMs
measured, so no "cold" figure is claimed). The dask side uses the local
threaded scheduler (dask's default without a distributed Client).

Prints one JSON object per line: each measurement, then a summary with ratios
(cosmo_dask time / numpy time; < 2 is the target).

    python -m benchmarks io [--log2n 24] [--repeat 7] [--dir DIR]
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

from cosmo_dask import Snapshot, open_snapshot

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> dict:
    ap = parser(__doc__, repeat=7)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    start(args, "io")

    n = 2**args.log2n
    rng = np.random.default_rng(0)
    pos = (rng.random((n, 3), dtype=np.float32) * 1000).astype(np.float32)
    vel = rng.standard_normal((n, 3), dtype=np.float32) * 300
    ids = rng.permutation(n).astype(np.int64)
    arrays = {"pos": pos, "vel": vel, "ids": ids}
    nbytes = sum(a.nbytes for a in arrays.values())
    snap = Snapshot.from_arrays(pos, vel, ids, box_size=1000.0, particle_mass=1.0)

    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench-io-"))
    scratch.mkdir(parents=True, exist_ok=True)
    store, npy = scratch / "s.zarr", scratch / "npy"
    npy.mkdir(exist_ok=True)

    def write_zarr():
        snap.to_zarr(store, overwrite=True)

    def write_npy():
        for k, a in arrays.items():
            np.save(npy / f"{k}.npy", a)

    if args.device == "gpu":
        import cupy

        sync = cupy.cuda.Device().synchronize

        def read_zarr():
            out = open_snapshot(store, device="gpu").pos.compute()
            sync()
            return out.get()

        def read_npy():
            out = cupy.asarray(np.load(npy / "pos.npy"))
            sync()
            return out.get()

        def run_read(fn):  # time to data on the device, not the copy back
            t0 = time.perf_counter()
            if fn is read_zarr:
                open_snapshot(store, device="gpu").pos.compute()
            else:
                cupy.asarray(np.load(npy / "pos.npy"))
            sync()
            return time.perf_counter() - t0
    else:
        def read_zarr():
            return open_snapshot(store).pos.compute()

        def read_npy():
            return np.load(npy / "pos.npy")

        def run_read(fn):
            return timed(fn)[0]

    times = {k: [] for k in ("write_zarr", "write_npy", "read_zarr", "read_npy")}
    with dask.config.set(scheduler="threads"):
        write_zarr(), write_npy()  # warm-up (imports, first allocation)
        assert np.array_equal(read_zarr(), pos) and np.array_equal(read_npy(), pos)
        for r in range(args.repeat):
            order = [("zarr", write_zarr), ("npy", write_npy)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[f"write_{name}"].append(timed(fn)[0])
            order = [("zarr", read_zarr), ("npy", read_npy)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                fn()  # bring it into the page cache
                times[f"read_{name}"].append(run_read(fn))

    med = {k: statistics.median(v) for k, v in times.items()}
    pos_bytes = pos.nbytes
    env = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "numpy": np.__version__, "dask": dask.__version__,
           "date": time.strftime("%Y-%m-%d")}
    import zarr

    env["zarr"] = zarr.__version__
    for k, v in times.items():
        kind, lib = k.split("_")[0], k.split("_")[1]
        size = nbytes if kind == "write" else pos_bytes
        emit({"workload": k, "library": "cosmo_dask" if lib == "zarr" else "numpy",
                          "n_particles": n, "bytes": size, "seconds_median": med[k],
                          "seconds_all": [round(t, 5) for t in v],
                          "throughput_GBps": size / med[k] / 1e9,
                          "device": args.device if kind == "read" else "cpu"})
    summary = {
        "workload": "summary", "n_particles": n, "repeat": args.repeat, "device": args.device,
        "write_ratio": med["write_zarr"] / med["write_npy"],
        "read_ratio": med["read_zarr"] / med["read_npy"],
        "store_bytes": sum(p.stat().st_size for p in store.rglob("*") if p.is_file()),
        **env,
    }
    emit(summary)
    if args.dir is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return summary


if __name__ == "__main__":
    main()
