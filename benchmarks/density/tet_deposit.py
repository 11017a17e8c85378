"""Throughput of the exact tetrahedron deposit (CPU numba, GPU CuPy).

Usage::

    python -m benchmarks tet-deposit --device gpu --n-side 128 --box 100 250 \
        --patches --check-cpu 20000
    python -m benchmarks tet-deposit --device cpu --n-side 32

Prints one JSON line per (n_side, box): tetrahedra per second for the deposit
of a Zel'dovich snapshot at z=0 (n_side^3 particles, 6 n_side^3 tetrahedra)
onto a periodic grid of (2 n_side)^3 cells (128^3 -> 256^3 is the
configuration of issue 6), and on the GPU also

* ``--patches``: the same tetrahedra deposited patch by patch, one call per
  32^3-cell patch of the grid (512 patches for 256^3) with only the
  tetrahedra whose bounding box overlaps that patch (chosen beforehand with a
  bounding-box test, periodic images shifted into place): the call pattern of
  the adaptive octree. Reports the time of the 512 calls, the per-call mean,
  and the difference between the assembled patches and the periodic grid.
* ``--check-cpu N``: the CPU (numba) deposit of N random tetrahedra of the
  snapshot onto the same grid, compared with each GPU variant's deposit of
  them (max difference / max cell, mass).
* ``--arithmetic float32``: the float-geometry variant, with its largest cell
  difference from float64.
* ``--methods warp thread``: the older per-cell clip kernels
  (``tet_deposit_clip_gpu.py``), timed on the first ``--old-n`` tetrahedra only (they
  are ~60-90x slower).
* ``--variants JSON``: compile-time settings of the lattice kernel to compare
  (tuning; e.g. ``'[{}, {"PQ_SMEM": 0, "WARPS": 4}]'``); ``--settings JSON``
  replaces the kernel defaults for the whole run (patches included).

Every deposit of the full snapshot reports its total-mass error; variants are
also compared with the first one (``vs_v0_max_rel``).

GPU times: CUDA events around the deposit call(s) only (grid zeroing
outside), after a warm-up call, median of --repeat. CPU: wall clock.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from cosmo_dask.density import deposit_tets, snapshot_tetrahedra
from cosmo_dask.models.zeldovich_ics import zeldovich

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import (  # noqa: E402
    cuda_event_seconds,
    emit,
    parser,
    start,
    wall_median,
)
from benchmarks.density.tet_deposit_clip_gpu import deposit_tets_clip_gpu  # noqa: E402


def _median_gpu(fn, repeat, before=None):
    t, times = cuda_event_seconds(fn, repeat, warm=1, before=before)
    return t, [round(x, 5) for x in times]


def _patch_sets(d_t, d_m, cs, ng, P, cp):
    """Tetrahedra of each P^3 patch (bbox test, periodic images shifted in), sorted by patch.

    Returns (tets, mass, offsets (host), n_patch_per_axis)."""
    npa = ng // P
    u = d_t / cs
    lo = cp.floor(u.min(axis=1) / P).astype(cp.int64)  # (T, 3) first patch along each axis
    hi = cp.floor(u.max(axis=1) / P).astype(cp.int64)
    ids, shifts, pid = [], [], []
    tid = cp.arange(len(d_t))
    for d in np.ndindex(2, 2, 2):
        dd = cp.asarray(d)
        ok = cp.all(lo + dd <= hi, axis=1)
        sel = tid[ok]
        p = lo[ok] + dd
        pw = p % npa
        ids.append(sel)
        shifts.append(((pw - p) * P).astype(cp.float64) * cs)  # move the tet into the patch
        pid.append((pw[:, 0] * npa + pw[:, 1]) * npa + pw[:, 2])
    ids, shifts, pid = cp.concatenate(ids), cp.concatenate(shifts), cp.concatenate(pid)
    order = cp.argsort(pid, kind="stable")
    ids, shifts, pid = ids[order], shifts[order], pid[order]
    tets = d_t[ids] + shifts[:, None, :]
    counts = cp.asnumpy(cp.bincount(pid, minlength=npa**3))
    return tets, d_m[ids], np.concatenate([[0], np.cumsum(counts)]), npa


def bench_gpu(rec, tets, mass, cs, ng, args):
    import cupy as cp

    from cosmo_dask.density import tet_volume_gpu as tg

    rec["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    d_t = cp.asarray(tets)
    d_m = cp.asarray(mass)
    total = float(mass.sum())
    shape = (ng,) * 3
    u = d_t / cs
    ext = cp.floor(u.max(axis=1)) - cp.floor(u.min(axis=1)) + 1
    rec["mean_bbox_cells"] = float(cp.prod(ext, axis=1).mean())
    del u, ext
    grid = cp.zeros(shape)
    grids = {}
    cpu_sub = None
    if args.check_cpu:  # CPU deposit of a random subsample, compared with every GPU variant
        try:
            rng = np.random.default_rng(0)
            sub = np.sort(rng.choice(len(tets), min(args.check_cpu, len(tets)), replace=False))
            t0 = time.perf_counter()
            cpu = deposit_tets(tets[sub], mass[sub], [0, 0, 0], cs, shape, periodic=True)
            rec["check_cpu_tets"] = len(sub)
            rec["check_cpu_s"] = time.perf_counter() - t0
            cpu_sub = (cp.asarray(sub), cpu)
        except Exception as e:  # keep the GPU figures when the CPU side fails
            rec["check_cpu_error"] = repr(e)[:500]
    variants = json.loads(args.variants) if args.variants else [{}]
    for ar in args.arithmetic:
        for vi, var in enumerate(variants):
            real = "double" if ar == "float64" else "float"
            key = f"lattice_{ar}" + (f"_v{vi}" if len(variants) > 1 else "")

            def run(var=var, real=real):
                tg._launch_lattice(d_t, d_m, (0.0, 0.0, 0.0), cs, shape, True, grid, real,
                                   tuple(sorted(var.items())))

            try:
                t, ts = _median_gpu(run, args.repeat, before=lambda: grid.fill(0))
            except Exception as e:  # a variant that does not compile or launch
                rec[key] = {"settings": var, "error": repr(e)[:500]}
                print(key, rec[key], flush=True)
                continue
            rec[key] = {"settings": {**tg.LATTICE_DEFAULTS, **var}, "s": t, "all_s": ts,
                        "tets_per_s": len(tets) / t,
                        "mass_rel_err": float(abs(float(grid.sum()) / total - 1)),
                        "min_cell_over_max": float(grid.min() / grid.max())}
            if cpu_sub is not None:
                g = cp.zeros(shape)
                tg._launch_lattice(d_t[cpu_sub[0]], d_m[cpu_sub[0]], (0.0, 0.0, 0.0), cs, shape,
                                   True, g, real, tuple(sorted(var.items())))
                g = cp.asnumpy(g)
                ref = cpu_sub[1]
                rec[key]["gpu_vs_cpu_max_rel"] = float(np.abs(g - ref).max() / np.abs(ref).max())
                rec[key]["gpu_vs_cpu_mass_rel"] = float(abs(g.sum() / ref.sum() - 1))
            if vi == 0:
                grids[ar] = grid.copy()
            elif "float64" in grids and ar == "float64":
                rec[key]["vs_v0_max_rel"] = float(cp.abs(grid - grids[ar]).max() / grid.max())
            print(key, json.dumps(rec[key]), flush=True)
    if "float64" in grids and "float32" in grids:
        g64 = grids["float64"]
        rec["float32_vs_float64_max_rel"] = float(cp.abs(grids["float32"] - g64).max() / g64.max())
    # public entry point, default settings: overhead check against the private launch
    try:
        t, _ = _median_gpu(lambda: deposit_tets(d_t, d_m, [0, 0, 0], cs, shape, periodic=True,
                                                out=grid), args.repeat,
                           before=lambda: grid.fill(0))
        rec["deposit_tets_public_s"] = t
        rec["deposit_tets_public_tets_per_s"] = len(tets) / t
    except Exception as e:
        rec["deposit_tets_public_error"] = repr(e)[:500]
    for method in args.methods:
        n_old = min(args.old_n, len(tets))

        def run_old(method=method, n_old=n_old):
            deposit_tets_clip_gpu(d_t[:n_old], d_m[:n_old], [0, 0, 0], cs, shape,
                                  periodic=True, out=grid, method=method)

        try:
            t, _ = _median_gpu(run_old, 1, before=lambda: grid.fill(0))
            rec[f"{method}_float64_first_{n_old}_tets_per_s"] = n_old / t
        except Exception as e:
            rec[f"{method}_error"] = repr(e)[:500]
    if args.patches:
        try:
            _patches(rec, d_t, d_m, cs, ng, shape, total, grids, args, cp)
        except Exception as e:
            rec["patches_error"] = repr(e)


def _patches(rec, d_t, d_m, cs, ng, shape, total, grids, args, cp):
    P = args.patch_cells
    t0 = time.perf_counter()
    pt, pm, off, npa = _patch_sets(d_t, d_m, cs, ng, P, cp)
    cp.cuda.Device().synchronize()
    rec["patch_prep_s"] = time.perf_counter() - t0
    pg = cp.zeros((npa**3, P, P, P))
    los = [((p // npa // npa) * P * cs, (p // npa % npa) * P * cs, (p % npa) * P * cs)
           for p in range(npa**3)]

    def run_patches():
        for p in range(npa**3):
            deposit_tets(pt[off[p]:off[p + 1]], pm[off[p]:off[p + 1]], los[p], cs,
                         (P, P, P), out=pg[p])

    t, ts = _median_gpu(run_patches, args.repeat, before=lambda: pg.fill(0))
    pg.fill(0)
    cp.cuda.Device().synchronize()
    t1 = time.perf_counter()
    run_patches()
    cp.cuda.Device().synchronize()
    host_s = time.perf_counter() - t1
    full = pg.reshape(npa, npa, npa, P, P, P).transpose(0, 3, 1, 4, 2, 5).reshape(shape)
    ref = grids.get("float64")
    rec["patches"] = {"n_patches": npa**3, "patch_cells": P, "tet_patch_pairs": int(off[-1]),
                      "s": t, "all_s": ts, "host_wall_s": host_s,
                      "per_call_ms": 1e3 * t / npa**3,
                      "tets_per_s": len(d_t) / t, "pairs_per_s": int(off[-1]) / t,
                      "mass_rel_err": float(abs(float(full.sum()) / total - 1))}
    if ref is not None:
        rec["patches"]["vs_periodic_grid_max_rel"] = float(
            cp.abs(full - ref).max() / ref.max())
    print("patches", json.dumps(rec["patches"]), flush=True)


def bench_one(n, box, args):
    """One JSON record for a Zel'dovich snapshot of n^3 particles in a box of side box."""
    t0 = time.perf_counter()
    snap = zeldovich(n, box_size=box, redshift=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    ng = 2 * n
    cs = box / ng
    rec = {"n_side": n, "box": box, "n_tets": len(tets), "grid": ng, "device": args.device,
           "tets_setup_s": time.perf_counter() - t0}
    if args.device == "gpu":
        bench_gpu(rec, tets, mass, cs, ng, args)
    else:
        ext = np.floor(tets.max(axis=1) / cs) - np.floor(tets.min(axis=1) / cs) + 1
        rec["mean_bbox_cells"] = float(ext.prod(axis=1).mean())
        t = wall_median(lambda: deposit_tets(tets, mass, [0, 0, 0], cs, (ng,) * 3,
                                             periodic=True), max(1, args.repeat // 2))
        rec["deposit_float64_s"] = t
        rec["deposit_float64_tets_per_s"] = len(tets) / t
    return rec


def main(argv=None):
    ap = parser(__doc__, repeat=5)
    ap.add_argument("--n-side", type=int, nargs="+", default=[32])
    ap.add_argument("--box", type=float, nargs="+", default=[100.0],
                    help="box sides in Mpc/h (default 100)")
    ap.add_argument("--arithmetic", nargs="+", default=["float64"],
                    choices=["float64", "float32"])
    ap.add_argument("--methods", nargs="*", default=[], choices=["warp", "thread"],
                    help="older GPU kernels to time as well (on the first --old-n tets)")
    ap.add_argument("--old-n", type=int, default=1_000_000)
    ap.add_argument("--variants", default="", help="JSON list of lattice kernel settings")
    ap.add_argument("--settings", default="",
                    help="JSON dict replacing lattice kernel defaults for the whole run")
    ap.add_argument("--patches", action="store_true",
                    help="also deposit patch by patch (32^3 cells, one call per patch)")
    ap.add_argument("--patch-cells", type=int, default=32, help="patch side in cells (32)")
    ap.add_argument("--check-cpu", type=int, default=0, metavar="N",
                    help="compare GPU and CPU deposits of N random tetrahedra")
    args = ap.parse_args(argv)
    start(args, "tet-deposit")
    if args.settings and json.loads(args.settings):
        from cosmo_dask.density import tet_volume_gpu as tg

        tg.LATTICE_DEFAULTS.update(json.loads(args.settings))
    for n in args.n_side:
        for box in args.box:
            emit(bench_one(n, box, args))


if __name__ == "__main__":
    main()
