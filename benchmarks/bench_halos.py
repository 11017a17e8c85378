"""Friends-of-friends: cosmo_dask against the scipy reference, GPU throughput, MBP timing.

Workloads (periodic box, b = 0.2 mean spacings, min_members = 20):
  uniform    N random points;
  clustered  half uniform, half in Gaussian blobs (sigma 0.3-1 mean spacing,
             blob sizes from a power law), wrapped into the box.

For each, in one run: cosmo_dask ``fof_labels`` end to end from an in-memory
snapshot on the local threaded scheduler (all cores), then the scipy reference
(cKDTree(boxsize).query_pairs + csgraph.connected_components, what the tests
compare against), and the ratio. Partitions are checked equal. ``--device gpu``
times FOF on CuPy chunks from a Zarr store (particles/s, end to end).
``--mbp`` times exact vs grid most-bound particles on the largest halos.
``--memory`` reports traced peak bytes of one FOF run over the bytes of the
particles (positions + ids) a single domain holds with its ghosts.

Prints one JSON object per measurement.

    python benchmarks/bench_halos.py [--n-side 128 256] [--device cpu|gpu] [--mbp] [--memory]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import dask
import numpy as np


def particles(n_side: int, kind: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    n = n_side**3
    box = float(n_side)  # mean spacing 1
    if kind == "uniform":
        return rng.random((n, 3)) * box, box
    half = n // 2
    pos = [rng.random((n - half, 3)) * box]
    sizes = np.maximum(20, (rng.pareto(1.0, size=half // 50) + 1) * 20).astype(int)
    sizes = sizes[np.cumsum(sizes) <= half]
    sizes = np.r_[sizes, half - sizes.sum()] if sizes.sum() < half else sizes
    centres = rng.random((sizes.size, 3)) * box
    sigma = rng.uniform(0.3, 1.0, sizes.size) * (sizes / 20) ** (1 / 3) * 0.5
    for c, s, k in zip(centres, sigma, sizes, strict=True):
        pos.append(c + rng.normal(scale=s, size=(k, 3)))
    return np.mod(np.concatenate(pos), box), box


def scipy_fof(pos, box, ll, min_members):
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    n = len(pos)
    pairs = cKDTree(pos, boxsize=box).query_pairs(ll, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    sizes = np.bincount(comp)
    return comp, int((sizes >= min_members).sum())


def same_partition(labels, comp, min_members):
    sizes = np.bincount(comp)
    ref = np.where(sizes[comp] >= min_members, comp, -1)
    kept = labels >= 0
    if not np.array_equal(kept, ref >= 0):
        return False
    a, b = labels[kept], ref[kept]
    pairs = np.unique(np.stack([a, b], 1), axis=0)
    return len(pairs) == len(np.unique(a)) == len(np.unique(b))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-side", type=int, nargs="+", default=[128])
    ap.add_argument("--kinds", nargs="+", default=["clustered", "uniform"])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--no-scipy", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of ours (median)")
    ap.add_argument("--mbp", action="store_true")
    ap.add_argument("--check-cpu", action="store_true", help="gpu: compare labels with the CPU")
    ap.add_argument("--memory", action="store_true")
    args = ap.parse_args(argv)

    from cosmo_dask import Snapshot, open_snapshot
    from cosmo_dask.halos.fof import fof_labels

    env = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "numpy": np.__version__,
        "dask": dask.__version__,
    }
    ll, min_members = 0.2, 20
    for n_side in args.n_side:
        for kind in args.kinds:
            pos, box = particles(n_side, kind)
            pos = pos.astype(np.float32)
            pos[pos >= box] = 0.0  # float32 rounding can land on the box edge
            n = len(pos)
            snap = Snapshot.from_arrays(pos, box_size=box, ids=np.arange(n, dtype=np.int64))
            with tempfile.TemporaryDirectory() as tmp:
                if args.device == "gpu":
                    snap.to_zarr(f"{tmp}/s.zarr")
                    run_snap = open_snapshot(f"{tmp}/s.zarr", device="gpu")
                else:
                    run_snap = snap
                fof_labels(run_snap, ll, min_members=min_members)  # warm-up (numba/CUDA)
                times = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    res = fof_labels(run_snap, ll, min_members=min_members)
                    labels = res.labels.compute()
                    times.append(time.perf_counter() - t0)
                t_ours = float(np.median(times))
            row = {
                "workload": f"fof-{kind}",
                "n_particles": n,
                "device": args.device,
                "seconds": t_ours,
                "seconds_all": [round(t, 4) for t in times],
                "particles_per_s": n / t_ours,
                "n_halos": res.n_halos,
                "largest": int(res.n_members[0]) if res.n_halos else 0,
                "domains": res.parameters["n_domains"],
                **env,
            }
            if args.device == "gpu" and args.check_cpu:
                cpu = fof_labels(snap, ll, min_members=min_members).labels.compute()
                row["identical_to_cpu"] = bool(np.array_equal(labels.get(), cpu))
            if not args.no_scipy:
                t0 = time.perf_counter()
                comp, n_ref = scipy_fof(snap.pos.compute().astype(np.float64), box, ll, min_members)
                t_ref = time.perf_counter() - t0
                row.update(
                    scipy_seconds=t_ref,
                    ratio_scipy_over_ours=t_ref / t_ours,
                    identical=bool(
                        same_partition(labels, comp, min_members) and n_ref == res.n_halos
                    ),
                )
            print(json.dumps(row), flush=True)
            if args.mbp and kind == "clustered":
                bench_mbp(snap, res, box, env, args.device)
            if args.memory and kind == "clustered":
                bench_memory(snap, ll, min_members, env)


def bench_mbp(snap, res, box, env, device="cpu"):
    """Exact vs grid MBP on the 20 largest halos (CPU), and the GPU exact kernel."""
    from cosmo_dask.halos.center_kernels import grid_mbp, segment_potentials

    labels = res.labels.compute()
    labels = labels.get() if hasattr(labels, "get") else labels
    pos = snap.pos.compute().astype(np.float64)
    agree, n_test, t_exact, t_grid, t_gpu, excess, gpu_err = 0, 0, 0.0, 0.0, 0.0, [], 0.0
    for h in range(min(20, res.n_halos)):
        mem = np.flatnonzero(labels == h)
        x, m = pos[mem], np.ones(mem.size)
        starts = np.array([0, mem.size])
        t0 = time.perf_counter()
        phi = segment_potentials(x, m, starts, box_size=box, softening=0.02)
        t_exact += time.perf_counter() - t0
        t0 = time.perf_counter()
        g = grid_mbp(x, m, box_size=box, softening=0.02)
        t_grid += time.perf_counter() - t0
        agree += int(g == int(np.argmin(phi)))
        excess.append(float((phi[g] - phi.min()) / abs(phi.min())))
        n_test += 1
        if device == "gpu":
            import cupy

            from cosmo_dask.halos.center_kernels_gpu import segment_potentials_gpu

            args = (cupy.asarray(x), cupy.asarray(m), cupy.asarray(starts))
            segment_potentials_gpu(*args, box_size=box, softening=0.02)  # warm-up
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            phi_g = segment_potentials_gpu(*args, box_size=box, softening=0.02)
            cupy.cuda.Device().synchronize()
            t_gpu += time.perf_counter() - t0
            gpu_err = max(gpu_err, float(abs(phi_g.get() - phi).max() / abs(phi).max()))
    row = {
        "workload": "mbp-largest-halos",
        "halos": n_test,
        "members": int(res.n_members[:n_test].sum()),
        "cpu_exact_seconds": t_exact,
        "cpu_grid_seconds": t_grid,
        "grid_same_particle": agree,
        "grid_potential_excess_max": max(excess, default=0.0),
        "grid_potential_excess_median": float(np.median(excess)) if excess else 0.0,
        **env,
    }
    if device == "gpu":
        row.update(gpu_exact_seconds=t_gpu, gpu_max_rel_err=gpu_err)
    print(json.dumps(row), flush=True)


def bench_memory(snap, ll, min_members, env):
    import tracemalloc

    from cosmo_dask.halos.fof import fof_labels

    with dask.config.set(scheduler="sync"):
        tracemalloc.start()
        res = fof_labels(snap, ll, min_members=min_members, n_domains=1)
        res.labels.compute()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    share = snap.n_particles * (snap.pos.dtype.itemsize * 3 + 8)  # pos + ids of the domain
    print(
        json.dumps(
            {
                "workload": "fof-memory",
                "n_particles": snap.n_particles,
                "domains": 1,
                "peak_traced_bytes": peak,
                "share_bytes": share,
                "ratio": peak / share,
                **env,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
