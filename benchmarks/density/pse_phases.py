"""Seconds per phase of ``pse_density`` + ``to_zarr`` on a stored snapshot, as the CLI
runs it (a local cluster from ``cosmo_dask.connect``): block columns (id-ordered
read + columns + bounding boxes), octree layout and leaf items, the deposit graph,
and the write. One JSON line.

    python -m benchmarks pse-phases STORE [--device gpu] [--patch-size 32]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def main(argv=None):
    ap = parser(__doc__, device="gpu")
    ap.add_argument("store")
    ap.add_argument("--patch-size", type=int, default=32)
    ap.add_argument("--max-level", type=int, default=None)
    ap.add_argument("--strategy", default="auto")
    args = ap.parse_args(argv)
    start(args, "pse-phases")

    import cosmo_dask
    from cosmo_dask.core.progress import persist
    from cosmo_dask.density import pse as pse_mod
    from cosmo_dask.density.parameters import check_octree_params
    from cosmo_dask.density.pse_octree import build_octree, default_root
    from cosmo_dask.density.pse_schedule import choose_strategy, gather_graph, leaf_items
    from cosmo_dask.density.tessellation import _lagrangian, block_columns

    t = {}
    with cosmo_dask.connect(gpu=args.device == "gpu", quiet=True):
        snap = cosmo_dask.open_snapshot(args.store, device=args.device)
        t0 = time.perf_counter()
        shape, box = _lagrangian(snap)
        p = args.patch_size
        max_level = (pse_mod.default_max_level(shape, p) if args.max_level is None
                     else args.max_level)
        p, max_level, max_tets = check_octree_params(p, max_level, float(p) ** 3)
        cols = block_columns(snap, 8)
        t["columns"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        root_lo, root_size = default_root(cols.blocks.lo, cols.blocks.hi, box)
        layout = build_octree(cols.blocks, root_lo=root_lo, root_size=root_size, box_size=box,
                              max_level=max_level, max_tets_per_node=max_tets)
        workers = pse_mod.column_workers(cols.values)
        items = leaf_items(layout, cols)
        chosen, _ = choose_strategy(cols, items, p, workers)
        t["layout"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        patches = gather_graph(cols, layout, items, p, workers, "prof",
                               gpu=args.device == "gpu")
        (patches,) = persist(patches)
        from distributed import wait
        wait(patches)
        t["deposit"] = time.perf_counter() - t0
        from cosmo_dask.density.octree_model import DensityOctree

        octree = DensityOctree(root_lo, root_size, p, layout.level, layout.origin, patches,
                               box_size=box, attrs={})
        out = tempfile.mkdtemp()
        t0 = time.perf_counter()
        octree.to_zarr(out + "/p.zarr")
        t["write"] = time.perf_counter() - t0
        shutil.rmtree(out)
    emit({"bench": "pse_phases", "store": args.store, "device": args.device,
                      "n_leaves": int(len(layout.level)), "levels": np.bincount(
                          layout.level).tolist(), "strategy_auto": chosen,
                      "n_tets": int(cols.blocks.n_tets.sum()),
                      **{k: round(v, 2) for k, v in t.items()}})


if __name__ == "__main__":
    main()
