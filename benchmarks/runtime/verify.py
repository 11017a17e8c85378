"""Cost of verifying chunk checksums on read: a store read with ``verify=True`` against
``verify=False``.

Workload: 256^3 Zel'dovich ICs (the project's ``zeldovich`` generator), float32
``pos`` and ``vel`` (384 MiB in all, chunks of 2^20 particles), read with
``dask.compute(snap.pos, snap.vel)`` on dask's threaded scheduler (``--threads``,
default 2), the files in the page cache. The value checks of ``open_snapshot`` stay on
in both (they are part of every read). Verified and unverified reads alternate
(which goes first alternates too), so machine load hits both alike; medians are
reported. ``--impl zlib`` times the standard library's CRC-32 in place of the fast one
(``cosmo_dask.store.chunk_manifest.crc32``: ISA-L's or zlib-ng's when installed).

Prints one JSON line per measurement and a summary (overhead = verified / unverified - 1;
goal <= 0.05), and appends them to ``benchmarks/results/verify.jsonl``.

    python -m benchmarks verify [--n-side 256] [--repeat 7] [--threads 2]
                                      [--device gpu]

With ``--device gpu`` the chunks are read into CuPy arrays (the store-to-GPU path,
whose CRC-32 runs on the host bytes before each copy).
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

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def main(argv=None) -> dict:
    ap = parser(__doc__, repeat=7)
    ap.add_argument("--n-side", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--impl", choices=("fast", "zlib"), default="fast",
                    help="CRC-32 implementation: the fastest installed, or zlib's")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--no-save", action="store_true", help="do not append to verify.jsonl")
    args = ap.parse_args(argv)
    start(args, "verify")

    from cosmo_dask import open_snapshot
    from cosmo_dask.models import zeldovich
    from cosmo_dask.store import chunk_manifest, zarr_read

    if args.impl == "zlib":
        import zlib

        chunk_manifest.crc32 = zarr_read.crc32 = zlib.crc32
    crc = zarr_read.crc32
    env = {"bench": "verify", "n_side": args.n_side, "threads": args.threads,
           "device": args.device,
           "crc32": f"{getattr(crc, '__module__', None) or type(crc).__module__}.crc32",
           "host": platform.node(), "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    scratch = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-verify-"))
    lines = []

    def record(**fields):
        line = {**env, **fields}
        emit(line, save=not args.no_save)
        lines.append(line)

    try:
        path = scratch / "lattice.zarr"
        with dask.config.set(scheduler="threads", num_workers=args.threads):
            zeldovich(args.n_side, box_size=float(args.n_side), redshift=19.0, seed=1,
                      precision="float32").to_zarr(path, progress=False)
        snap = open_snapshot(path)
        nbytes = snap.pos.nbytes + snap.vel.nbytes

        def read(verify: bool) -> float:
            s = open_snapshot(path, verify=verify, device=args.device)
            t0 = time.perf_counter()
            with dask.config.set(scheduler="threads", num_workers=args.threads):
                dask.compute(s.pos, s.vel)
            if args.device == "gpu":
                import cupy

                cupy.cuda.Device().synchronize()
            return time.perf_counter() - t0

        read(True), read(False)  # warm: page cache, imports, thread pool
        times = {True: [], False: []}
        for r in range(args.repeat):
            for verify in ((True, False) if r % 2 == 0 else (False, True)):
                t = read(verify)
                times[verify].append(t)
                record(kind="read", verify=verify, seconds=round(t, 4), round=r)
        on, off = statistics.median(times[True]), statistics.median(times[False])
        summary = {"kind": "summary", "bytes": nbytes, "repeat": args.repeat,
                   "median_verify_s": round(on, 4), "median_no_verify_s": round(off, 4),
                   "overhead": round(on / off - 1, 4),
                   "verify_gb_s": round(nbytes / on / 1e9, 3),
                   "no_verify_gb_s": round(nbytes / off / 1e9, 3)}
        record(**summary)
        return summary
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
