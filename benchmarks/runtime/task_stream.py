"""Draw the task stream of a real run (FOF with centres, tree gravity, a PSE deposit)
on a 2-worker LocalCluster, coloured by task kind, as the dashboard shows it.

    python -m benchmarks task-stream docs/img/task_stream.png

Writes the PNG used by docs/dashboard.md and prints one JSON line per task kind
(count, total seconds).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from dask.utils import key_split  # noqa: E402
from distributed import get_task_stream  # noqa: E402

import cosmo_dask  # noqa: E402
from cosmo_dask.density import pse_density  # noqa: E402
from cosmo_dask.gravity import accelerations  # noqa: E402
from cosmo_dask.halos import fof  # noqa: E402
from cosmo_dask.models import halo_blobs, plummer, zeldovich  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def main(argv=None) -> None:
    ap = parser(__doc__, devices=("cpu",))
    ap.add_argument("png", nargs="?", default="task_stream.png", help="the figure's path")
    args = ap.parse_args(argv)
    start(args, "task-stream")
    path = args.png
    with cosmo_dask.connect(gpu=False, n_workers=2, threads_per_worker=1, quiet=True) as client:
        blobs = halo_blobs(2**18, box_size=100.0, n_halos=400, seed=2, chunks=2**16)
        # warm-up: compile every kernel on both workers first, so the stream shows the work
        for _ in range(2):
            fof(blobs, 0.2, min_members=20, centers=("mbp", "mcp")).labels.compute()
            accelerations(plummer(4000, seed=1, chunks=1000), method="tree",
                          softening=0.01)[0].compute()
            pse_density(zeldovich(16, box_size=50.0, redshift=0.0, seed=1),
                        patch_size=16).total_mass()
        with get_task_stream(client) as stream:
            fof(blobs, 0.2, min_members=20, centers=("mbp", "mcp")).catalog.load()
            sphere = plummer(50_000, seed=3, chunks=12_500)
            acc, _ = accelerations(sphere, method="tree", softening=0.01)
            acc.compute()
            pse_density(zeldovich(32, box_size=50.0, redshift=0.0, seed=1),
                        patch_size=16).total_mass()
    tasks = stream.data
    t0 = min(s["start"] for t in tasks for s in t["startstops"] if s["action"] == "compute")
    lanes = sorted({(t["worker"], t["thread"]) for t in tasks})
    colours = plt.get_cmap("tab20")
    kinds: dict[str, list] = defaultdict(list)
    for t in tasks:
        for s in t["startstops"]:
            if s["action"] == "compute":
                kinds[key_split(t["key"])].append(
                    (lanes.index((t["worker"], t["thread"])), s["start"] - t0,
                     s["stop"] - s["start"]))
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ranked = sorted(kinds, key=lambda k: -sum(d for _, _, d in kinds[k]))
    for i, kind in enumerate(ranked):
        bars = kinds[kind]
        ax.broken_barh([(s, max(d, 2e-3)) for _, s, d in bars], (0, 0.8), alpha=0)  # extent
        for lane, s, d in bars:
            ax.broken_barh([(s, max(d, 2e-3))], (lane + 0.1, 0.8), color=colours(i % 20),
                           label=kind if (lane, s, d) == bars[0] and i < 14 else None)
        emit({"kind": kind, "tasks": len(bars),
                          "seconds": round(sum(d for _, _, d in bars), 3)})
    ax.set_yticks([i + 0.5 for i in range(len(lanes))],
                  [f"worker {i // 1 + 1}" for i in range(len(lanes))])
    ax.set_xlabel("seconds since the first task")
    ax.set_title("task stream: FOF with MBP/MCP centres, then tree gravity, then a PSE deposit "
                 "(2 workers x 1 thread)")
    ax.legend(ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
