"""Seconds of ``info``'s full validation, split into its three passes (value statistics of
pos/vel/mass; the duplicate-id check; the CRC-32 of every chunk file), on a local cluster
from ``cosmo_dask.connect``, for the store's chunks and for larger read chunks. One JSON
line per chunking.

    python -m benchmarks info-phases STORE [--device gpu] [--chunks 0 8388608]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def main(argv=None):
    ap = parser(__doc__, device="gpu")
    ap.add_argument("store")
    ap.add_argument("--chunks", type=int, nargs="+", default=[0],
                    help="read chunk rows (0: the store's)")
    args = ap.parse_args(argv)
    start(args, "info-phases")

    import cosmo_dask
    from cosmo_dask.core.progress import compute
    from cosmo_dask.store.validation import _stats, duplicate_ids

    with cosmo_dask.connect(gpu=args.device == "gpu", quiet=True):
        for rows in args.chunks:
            snap = cosmo_dask.open_snapshot(args.store, device=args.device,
                                            chunks=rows or None)
            t0 = time.perf_counter()
            names = [n for n in ("pos", "vel", "mass") if getattr(snap, n) is not None]
            compute(*[_stats(getattr(snap, n), snap.box_size if n == "pos" else None)
                      for n in names], show=False)
            t1 = time.perf_counter()
            n_dup, _ = duplicate_ids(snap.ids)
            t2 = time.perf_counter()
            problems = snap._checksum_problems()
            t3 = time.perf_counter()
            emit({"bench": "info_phases", "device": args.device,
                              "n": snap.n_particles, "chunk_rows": snap.pos.chunks[0][0],
                              "n_chunks": len(snap.pos.chunks[0]), "stats_s": round(t1 - t0, 2),
                              "duplicate_ids_s": round(t2 - t1, 2), "duplicates": n_dup,
                              "checksums_s": round(t3 - t2, 2),
                              "checksum_problems": len(problems)})


if __name__ == "__main__":
    main()
