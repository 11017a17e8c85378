"""Throughput of the exact tetrahedron-cube kernels (CPU numba, GPU CuPy).

Usage: python benchmarks/bench_tet_deposit.py [--device cpu|gpu] [--n-side 64 128]
Prints one JSON line per measurement: tetrahedra per second for the pairwise
volume kernel (each tet against the 27 cells around its first vertex) and for
the deposit of a Zel'dovich snapshot at z=0 (box 100 Mpc/h) onto a periodic
grid of (2 n_side)^3 cells (the 128^3 -> 256^3 configuration of issue 6).
GPU times: CUDA events, after a warm-up, median of --repeat; CPU: wall clock.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from cosmo_dask.density import deposit_tets, snapshot_tetrahedra, tet_cube_volume
from cosmo_dask.models.zeldovich import zeldovich

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import wall_median  # noqa: E402


def _median_gpu(fn, repeat):
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(times))


def bench_one(n, dev, repeat, check_cpu):
    """One JSON record for a Zel'dovich snapshot of n^3 particles."""
    snap = zeldovich(n, box_size=100.0, redshift=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    ng = 2 * n
    cs = 100.0 / ng
    rec = {"n_side": n, "n_tets": len(tets), "grid": ng, "device": dev}
    # spread: mean number of grid cells in each tet's bounding box
    ext = np.floor(tets.max(axis=1) / cs) - np.floor(tets.min(axis=1) / cs) + 1
    rec["mean_bbox_cells"] = float(ext.prod(axis=1).mean())
    # pairwise volume kernel on a subset: each tet vs the 27 cells around vertex 0
    sub = tets[: min(len(tets), 200_000)]
    base = np.floor(sub[:, 0] / cs) * cs
    off = np.stack(np.meshgrid(*[np.arange(-1, 2)] * 3, indexing="ij"), -1).reshape(-1, 3)
    if dev == "gpu":
        import cupy as cp

        from cosmo_dask.density.tet_volume_gpu import deposit_tets_gpu, tet_cube_volume_gpu

        name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        rec["gpu"] = name
        # one cube set for all tets (the kernel is an outer product): a 3x3x3 block
        cubes = base[0] + off * cs
        for dt in (np.float64, np.float32):
            d_sub = cp.asarray(sub.astype(dt))
            ar = np.dtype(dt).name
            t = _median_gpu(lambda d_sub=d_sub, ar=ar: tet_cube_volume_gpu(d_sub, cubes, cs,
                                                                           arithmetic=ar),
                            repeat)
            rec[f"volume_{np.dtype(dt).name}_pairs_per_s"] = len(sub) * 27 / t
            d_t = cp.asarray(tets.astype(dt))
            d_m = cp.asarray(mass)
            for method in ("warp", "thread"):
                grid = cp.zeros((ng,) * 3)

                def run(d_t=d_t, d_m=d_m, method=method, grid=grid):
                    grid[...] = 0
                    deposit_tets_gpu(d_t, d_m, [0, 0, 0], cs, (ng,) * 3, periodic=True,
                                     out=grid, method=method,
                                     arithmetic=np.dtype(d_t.dtype).name)

                t = _median_gpu(run, repeat)
                key = f"deposit_{np.dtype(dt).name}_{method}"
                rec[key + "_s"] = t
                rec[key + "_tets_per_s"] = len(tets) / t
                rec[key + "_mass_rel_err"] = float(abs(grid.sum() / mass.sum() - 1))
                if check_cpu and dt is np.float64 and method == "warp":
                    t0 = time.perf_counter()
                    cpu = deposit_tets(tets, mass, [0, 0, 0], cs, (ng,) * 3, periodic=True)
                    rec["cpu_deposit_s_same_host"] = time.perf_counter() - t0
                    g = cp.asnumpy(grid)
                    rec["gpu_vs_cpu_max_rel"] = float(np.max(np.abs(g - cpu)) / cpu.max())
                if dt is np.float32 and method == "warp":
                    ref = cp.zeros((ng,) * 3)
                    deposit_tets_gpu(cp.asarray(tets), d_m, [0, 0, 0], cs, (ng,) * 3,
                                     periodic=True, out=ref, method="warp")
                    rec["float32_vs_float64_max_rel"] = float(
                        cp.max(cp.abs(grid - ref)) / cp.max(ref))
    else:
        cubes = base[:1] + off * cs
        t = wall_median(lambda: tet_cube_volume(sub, cubes, cs), repeat)
        rec["volume_float64_pairs_per_s"] = len(sub) * 27 / t
        t = wall_median(lambda: deposit_tets(tets, mass, [0, 0, 0], cs, (ng,) * 3,
                                             periodic=True), max(1, repeat // 2))
        rec["deposit_float64_s"] = t
        rec["deposit_float64_tets_per_s"] = len(tets) / t
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--n-side", type=int, nargs="+", default=[32])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--check-cpu", action="store_true",
                    help="compare the GPU deposit with the CPU one (max relative difference)")
    args = ap.parse_args()
    for n in args.n_side:
        print(json.dumps(bench_one(n, args.device, args.repeat, args.check_cpu)), flush=True)


if __name__ == "__main__":
    main()
