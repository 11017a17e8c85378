"""Seconds per simulation step (PM and TreePM) on one device, split into the force and
the kick/drift, with the PM long-range force alone timed on the same particles.

ICs: Zel'dovich at z_i (``--z-init``, default 9) with ``n_side^3`` particles in a box of
``n_side`` Mpc/h (1 Mpc/h mean spacing), float32, in the device's default read chunks;
``--steps`` steps to z = 0 (the first steps' times include compiling the kernels: the
reported step time is the median of the steps after the first). Every step's own
log row comes from ``simulation.run`` (``seconds``, ``force_seconds``).

    python -m benchmarks simulation --device gpu --n-side 256 --method treepm pm
    python -m benchmarks simulation --device cpu --n-side 64
    python -m benchmarks simulation --device gpu --n-side 256 512 --method treepm \
        --steps 5 --split --split-repeat 2 --no-pm-force --split-trees 32:32 16:32

Prints one JSON line per (n_side, method) and one per PM-force timing. PM rows on a GPU
also carry the bytes a PM step must move at least (:func:`pm_step_bytes`) and the time
those take at the device's peak memory bandwidth (from its memory clock and bus width).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--n-side", type=int, nargs="+", default=[64])
    ap.add_argument("--method", nargs="+", choices=("pm", "treepm"), default=["pm", "treepm"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--z-init", type=float, default=9.0)
    ap.add_argument("--pm-mesh-factor", type=int, default=2,
                    help="PM-only runs: mesh = factor x n_side (TreePM: 1 x)")
    ap.add_argument("--schedule", choices=("loga", "a"), default=None,
                    help="step schedule (default: the method's)")
    ap.add_argument("--split", action="store_true",
                    help="gpu TreePM: time the force's pieces on the final state")
    ap.add_argument("--split-repeat", type=int, default=3,
                    help="--split: timed repeats after one warm-up")
    ap.add_argument("--split-trees", nargs="+", default=[],
                    help="--split: also time the GPU tree with these MAX_LEAF:MAX_GROUP")
    ap.add_argument("--no-pm-force", action="store_true",
                    help="skip the PM-force-alone timings on the ICs")
    args = ap.parse_args(argv)
    start(args, "simulation")
    trees = [tuple(int(v) for v in t.split(":")) for t in args.split_trees]

    import dask

    from cosmo_dask.core.progress import persist
    from cosmo_dask.gravity.pm import pm_accelerations
    from cosmo_dask.models import zeldovich
    from cosmo_dask.simulation import run

    name = platform.processor() or platform.machine()
    if args.device == "gpu":
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    env = {"bench": "simulation", "device": args.device, "device_name": name,
           "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
    scheduler = "threads" if args.device == "cpu" else "sync"
    with dask.config.set(scheduler=scheduler):
        for n_side in args.n_side:
            ics = zeldovich(n_side, box_size=float(n_side), redshift=args.z_init, seed=1,
                            precision="float32")
            if args.device == "gpu":
                ics = ics.to_device("gpu")
            t0 = time.perf_counter()
            (pos,) = persist(ics.pos)
            read = time.perf_counter() - t0
            for method in args.method:
                n_mesh = n_side * (args.pm_mesh_factor if method == "pm" else 1)
                t0 = time.perf_counter()
                res = run(ics, z_final=0.0, n_steps=args.steps, method=method, n_mesh=n_mesh,
                          precision="float32", steps=args.schedule)
                total = time.perf_counter() - t0
                later = res.log[1:] or res.log
                step = statistics.median(r["seconds"] for r in later)
                force = statistics.median(r["force_seconds"] for r in later)
                extra = {}
                if method == "pm" and args.device == "gpu":
                    nbytes = pm_step_bytes(n_side**3, n_mesh)
                    bw = peak_bandwidth()
                    extra = {"step_bytes_lower_bound": nbytes, "peak_bandwidth_Bps": bw,
                             "bandwidth_s": round(nbytes / bw, 5),
                             "step_over_bandwidth": round(step / (nbytes / bw), 1)}
                emit(env, n_side=n_side, n_particles=n_side**3, method=method, n_mesh=n_mesh,
                     **extra,
                     steps=len(res.log), run_s=round(total, 3), ics_persist_s=round(read, 3),
                     step_s=round(step, 4), force_s=round(force, 4),
                     kick_drift_s=round(step - force, 4),
                     first_step_s=round(res.log[0]["seconds"], 4),
                     log=[{k: r[k] for k in ("a", "seconds", "force_seconds")}
                          for r in res.log])
                if args.split and method == "treepm" and args.device == "gpu":
                    emit(env, n_side=n_side, what="treepm_split", n_mesh=n_mesh,
                         z=round(1 / res.snapshot.scale_factor - 1, 4), step_s=round(step, 4),
                         **force_split(res.snapshot, n_mesh, res.parameters,
                                       repeat=args.split_repeat, trees=trees))
            # the PM long-range force alone on the ICs, mesh 2 n_side (warm, median of 3)
            for factor in [] if args.no_pm_force else sorted({1, args.pm_mesh_factor}):
                n_mesh = factor * n_side
                times = []
                for _ in range(4):
                    t0 = time.perf_counter()
                    acc, _ = pm_accelerations(pos, float(ics.particle_mass), G=float(ics.G),
                                              box_size=ics.box_size, n_mesh=n_mesh,
                                              precision="float32", potential=False)
                    persist(acc)
                    times.append(time.perf_counter() - t0)
                emit(env, n_side=n_side, n_particles=n_side**3, what="pm_force", n_mesh=n_mesh,
                     seconds=round(statistics.median(times[1:]), 4),
                     first_s=round(times[0], 4))


def pm_step_bytes(n_particles: int, n_mesh: int, *, meshes: int = 2, itemsize: int = 4) -> int:
    """The fewest bytes one PM step (interlaced: ``meshes`` meshes, 3 force components,
    float32 meshes and particles) moves through device memory, each array read or
    written once per pass: per mesh, painting reads the positions and zeroes and writes
    the mesh (12 N + 8 n^3); the r2c FFT reads it and writes the half complex mesh
    (8 n^3); the Green's function and gradients read that and write three (16 n^3); three
    c2r FFTs (24 n^3); the interpolation reads the positions and the three meshes and
    writes three float64 columns (12 N + 12 n^3 + 24 N). The kick and drift read
    positions, velocities and accelerations and write positions and velocities (60 N).
    cuFFT's several passes and painting's atomics move more: a lower bound."""
    n3 = n_mesh**3 * itemsize / 4
    per_mesh = 12 * n_particles + 8 * n3 + 8 * n3 + 16 * n3 + 24 * n3 + 36 * n_particles \
        + 12 * n3
    return int(meshes * per_mesh + 60 * n_particles)


def peak_bandwidth() -> float:
    """The GPU's peak memory bandwidth (bytes/s): double data rate x memory clock x bus."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    return 2.0 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8


def force_split(snap, n_mesh: int, params: dict, repeat: int = 3, trees=()) -> dict:
    """Seconds of the TreePM force's pieces on one GPU (medians of ``repeat`` after a
    warm-up): the PM long range, the GPU tree's phases (CUDA events: build, walk,
    forces = M2P + P2P in one kernel, with the interaction counts per particle), the
    whole ``treepm_accelerations`` graph, and what is left (the chunks' concatenation
    and slices, the sum). ``trees``: further ``(max_leaf, max_group)`` of the GPU tree
    timed alone (``tree_variants``)."""
    import cupy

    from cosmo_dask.core.progress import persist
    from cosmo_dask.gravity.parameters import (
        R_SPLIT_CELLS,
        TREEPM_MAX_GROUP,
        TREEPM_MAX_LEAF,
        default_r_cut,
    )
    from cosmo_dask.gravity.pm import pm_accelerations
    from cosmo_dask.gravity.tree.forces_gpu import _forces, _Timer
    from cosmo_dask.gravity.treepm import treepm_accelerations

    box, m, G = snap.box_size, float(snap.particle_mass), float(snap.G)
    rs = R_SPLIT_CELLS * box / n_mesh
    kw = dict(G=G, theta=params["theta"], softening=params["softening"],
              precision="float32", potential=False)
    sync = cupy.cuda.get_current_stream().synchronize

    def timed(fn):
        times = []
        for _ in range(repeat + 1):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    pos = snap.pos
    flat = pos.compute()
    out = {"pm_s": timed(lambda: persist(pm_accelerations(
               pos, m, G=G, box_size=box, n_mesh=n_mesh, r_split=rs, precision="float32",
               potential=False)[0], label=None, show=False)),
           "force_s": timed(lambda: persist(treepm_accelerations(
               pos, m, box_size=box, n_mesh=n_mesh, **kw)[0], label=None, show=False))}
    tree_kw = dict(softening_kernel="plummer", quadrupole=True, box_size=box, rs=rs,
                   r_cut=default_r_cut(rs), **kw)

    def tree(max_leaf, max_group):
        stats = {}
        _forces(flat, m, stats=stats, max_leaf=max_leaf, max_group=max_group, **tree_kw)
        phases = []
        for _ in range(repeat):
            timer = _Timer()
            _forces(flat, m, timer=timer, max_leaf=max_leaf, max_group=max_group, **tree_kw)
            phases.append(timer.phases())
        ph = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
        n = flat.shape[0]
        return {"max_leaf": max_leaf, "max_group": max_group,
                "tree_build_s": round(sum(v for k, v in ph.items() if k.startswith("build")), 4),
                "tree_walk_s": round(ph.get("walk_count", 0.0) + ph.get("walk_write", 0.0), 4),
                "tree_forces_s": round(ph.get("forces", 0.0), 4),
                "tree_s": round(sum(ph.values()), 4),
                "tree_phases_s": {k: round(v, 4) for k, v in ph.items()},
                "interactions": {k: int(v) for k, v in stats.items()},
                "p2p_per_particle": round(stats["p2p"] / n, 1),
                "m2p_per_particle": round(stats["m2p"] / n, 1)}

    main = tree(TREEPM_MAX_LEAF, TREEPM_MAX_GROUP)
    out["rest_s"] = out["force_s"] - out["pm_s"] - main["tree_s"]
    out = {k: round(v, 4) for k, v in out.items()}
    out.update(main)
    out["tree_variants"] = [tree(*t) for t in trees if t != (TREEPM_MAX_LEAF, TREEPM_MAX_GROUP)]
    return out


if __name__ == "__main__":
    main()
