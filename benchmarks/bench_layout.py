"""The graphs that go through the domain layout (issue 15 item 3), timed end to end: FOF
labels and multi-domain tree forces, on CPU or GPU chunks. One JSON line per case
(median of ``--repeat`` runs after a warm-up run), so that a checkout before and after
a change can be run side by side in one session (only public APIs are used).

    python benchmarks/bench_layout.py --device cpu --n 200000 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import dask
import dask.array as da
import numpy as np


def _clustered(n: int, box: float, seed: int) -> np.ndarray:
    """Half uniform, half in 64 Gaussian clumps (periodic box)."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0, box, (n, 3))
    centres = rng.uniform(0, box, (64, 3))
    half = n // 2
    pos[:half] = (centres[rng.integers(0, 64, half)]
                  + 0.01 * box * rng.standard_normal((half, 3))) % box
    return pos


def _timed(fn, repeat: int) -> tuple[float, list[float]]:
    fn()  # warm-up: kernels compiled and loaded
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--chunks", type=int, default=8, help="row chunks of the input")
    ap.add_argument("--domains", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default="fof,tree,treepm-short")
    ap.add_argument("--label", default="", help="free text (e.g. the checkout)")
    args = ap.parse_args()

    from cosmo_dask import Snapshot
    from cosmo_dask.gravity.tree_graph import tree_accelerations
    from cosmo_dask.halos.fof import fof_labels

    box = 100.0
    x = _clustered(args.n, box, 1).astype(np.float32)
    rows = -(-args.n // args.chunks)
    snap = Snapshot.from_arrays(x, box_size=box, ids=np.arange(args.n, dtype=np.int64),
                                chunks=rows)
    pos = da.from_array(x.astype(np.float64), chunks=(rows, 3))
    if args.device == "gpu":
        import cupy

        snap = snap.to_device("gpu")
        pos = pos.map_blocks(cupy.asarray, dtype=np.float64)
    device = args.device
    if device == "gpu":
        import cupy

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    mean_sep = box / args.n ** (1 / 3)
    cases = {
        "fof": lambda: fof_labels(snap, 0.2, n_domains=args.domains).labels.compute(),
        "tree": lambda: dask.compute(*tree_accelerations(
            pos, 1.0, G=1.0, theta=0.6, n_domains=args.domains)),
        "treepm-short": lambda: dask.compute(*tree_accelerations(
            pos, 1.0, G=1.0, theta=0.6, box_size=box, rs=1.25 * mean_sep,
            n_domains=args.domains)),
    }
    for name in args.cases.split(","):
        with dask.config.set(scheduler="threads"):
            median, times = _timed(cases[name], args.repeat)
        print(json.dumps({"bench": "layout", "case": name, "n": args.n,
                          "chunks": args.chunks, "domains": args.domains,
                          "device": device, "host": platform.node(),
                          "median_s": round(median, 4),
                          "times_s": [round(t, 4) for t in times], "label": args.label}),
              flush=True)


if __name__ == "__main__":
    main()
