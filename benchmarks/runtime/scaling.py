"""Strong and weak scaling over the workers of one host (issue 20).

Starts a cluster of 1, 2, 4 (8) workers with :func:`cosmo_dask.connect` — one
worker per GPU (``--gpu``: LocalCUDACluster) or single-threaded CPU workers — and
times, on the same data for every worker count, with each result checked against
the 1-worker run:

* ``fof``     FOF (b = 0.2, >= 20 members) with MBP and MCP centres, from a Zarr store;
* ``treepm``  one TreePM force evaluation (mesh = particles per side, theta 0.5);
* ``pm``      a PM force on an ``--mesh``^3 mesh;
* ``power``   P(k) on an ``--mesh``^3 mesh;
* ``scf``     SCF fit (nmax 8, lmax 4) + accelerations of a Hernquist sphere;
* ``pse``     the phase-space-element density (``max_level`` 3);
* ``pm_step`` / ``treepm_step``  steps of :func:`cosmo_dask.simulation.run` (PM on an
  ``--mesh``^3 mesh, TreePM on a mesh of the particles per side) from 2LPT initial
  conditions at z = 9 (written once per size): the median of the log's step seconds
  after the first (three steps to z = 8), compared by the particles' displacements.

Strong scaling: ``--n-side-strong``^3 particles for every worker count (efficiency
``t_1 / (w t_w)``); weak scaling: about ``--n-side-weak``^3 particles per worker
(``n_side`` the largest FFT-friendly size at most ``n_weak w^(1/3)``, box scaled with it; efficiency
``(t_1 / N_1) / (t_w / N_w) / w``, the time per particle per worker), each size's
result checked against that size on one worker. Each line carries the
bytes the workers received from each other during the task (their transfer logs).
Every timing is the second of two computations (the first warms caches and
compiles kernels); the stores are written once per size before any cluster starts.

    python -m benchmarks scaling --workers 1 2 --n-side-strong 64 --n-side-weak 48
    python -m benchmarks scaling --gpu --workers 1 2 4 8 --n-side-strong 512 \\
        --n-side-weak 256 --mesh 1024

Prints one JSON line per (task, kind, workers), appended to ``<--out>/scaling.jsonl``
(``benchmarks/results/scaling.jsonl`` by default) with the fields the tables read:
``workload`` (the task; ``pm_step``, ``treepm_step``, ``fof``, ``power``, ...), ``n``
(particles), ``gpus`` (workers with ``--gpu``, else 0), ``kind`` (strong or weak),
``seconds``, ``efficiency``, ``device``, ``date``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

TASKS = ("fof", "treepm", "pm", "power", "scf", "pse", "pm_step", "treepm_step")
#: the step workloads: simulation.run from z = STEP_Z0 in STEP_COUNT steps to STEP_Z1
STEP_Z0, STEP_Z1, STEP_COUNT = 9.0, 8.0, 3


#: the workers' transfer logs keep this many entries (dask's default, 1000, dropped the
#: oldest during a 4-GPU PSE run and gave negative differences)
LOG_LENGTH = 10_000_000


def _bytes_received(client) -> int:
    """Bytes all workers have received from other workers so far (their transfer logs,
    kept ``LOG_LENGTH`` entries long)."""
    def total(dask_worker):
        return int(sum(e.get("total", 0) for e in dask_worker.transfer_incoming_log))

    return int(sum(client.run(total).values()))


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _step(task: str, ics, mesh: int):
    """Steps of ``simulation.run`` from ``ics``: ``({"displacement": ...}, seconds)``, the
    particles' minimum-image displacements and the median step time after the first."""
    from cosmo_dask.simulation import run

    n_side = round(ics.n_particles ** (1 / 3))
    method = task.split("_")[0]
    res = run(ics, z_final=STEP_Z1, n_steps=STEP_COUNT, method=method, steps="a",
              n_mesh=mesh if method == "pm" else n_side, precision="float32")
    return ({"displacement": displacements(ics, res.snapshot)},
            float(np.median([r["seconds"] for r in res.log[1:]])))


def displacements(ics, snap) -> np.ndarray:
    """Minimum-image displacements from ``ics`` to ``snap``, float64, in id order (a run
    on several workers keeps its particles in domain order: rows are matched by id)."""
    box = ics.box_size
    pos = []
    for s in (ics, snap):
        ids = _host(s.ids.compute())
        pos.append(_host(s.pos.compute()).astype(np.float64)[np.argsort(ids, kind="stable")])
    d = pos[1] - pos[0]
    d -= box * np.rint(d / box)
    return d


def _run(task: str, snap, halo, mesh: int):
    """The task's computed result (host arrays) on the current client, and the seconds
    to report instead of the call's wall time (None: the wall time)."""
    if task.endswith("_step"):
        return _step(task, snap, mesh)
    return _result(task, snap, halo, mesh), None


def _result(task: str, snap, halo, mesh: int):
    import dask

    if task == "fof":
        from cosmo_dask.halos import fof

        cat = fof(snap, 0.2, min_members=20, centers=("mbp", "mcp")).catalog
        # members exactly; masses are float64 sums, equal to rounding (summation order)
        return {"n_members": np.sort(_host(cat["n_members"].values)),
                "mass": np.sort(_host(cat["mass"].values)),
                "n_halos": int(cat.sizes.get("halo", 0))}
    if task == "treepm":
        from cosmo_dask.gravity.treepm import treepm_accelerations

        n_side = round(snap.n_particles ** (1 / 3))
        acc, _ = treepm_accelerations(snap.pos, float(snap.particle_mass), G=float(snap.G),
                                      box_size=snap.box_size, n_mesh=n_side,
                                      precision="float32", potential=False)
        return {"acc": _host(acc.compute())}
    if task == "pm":
        from cosmo_dask.gravity.pm import pm_accelerations

        acc, _ = pm_accelerations(snap.pos, float(snap.particle_mass), G=float(snap.G),
                                  box_size=snap.box_size, n_mesh=mesh, precision="float32",
                                  potential=False)
        return {"acc": _host(acc.compute())}
    if task == "power":
        from cosmo_dask.analysis import power_spectrum

        ds = power_spectrum(snap, n_mesh=mesh).compute()
        return {"power": _host(ds["power"].values)}
    if task == "scf":
        from cosmo_dask.expansion import SCF

        scf = SCF(nmax=8, lmax=4, scale_radius=1.0, center="com").fit(halo)
        acc = scf.accelerations(halo.pos)
        coeffs, acc = dask.compute(scf.coefficients, acc)
        return {"coefficients": _host(coeffs.values), "acc": _host(acc)}
    if task == "pse":
        from cosmo_dask.density import pse_density

        octree = pse_density(snap, max_level=3)
        return {"total_mass": np.asarray([octree.total_mass()])}
    raise ValueError(task)


#: relative tolerance of each task's comparison with the 1-worker run (FOF: the halo
#: and member counts exactly, the masses to float64 rounding; the tree and
#: the domain split depend on the worker count through the domain count; the sums of
#: FFTs and reductions only through their order)
TOLERANCE = {"fof": 1e-12, "treepm": 5e-3, "pm": 1e-5, "power": 1e-5, "scf": 1e-5,
             "pse": 1e-6, "pm_step": 1e-4, "treepm_step": 5e-3}


def _max_difference(task: str, ref: dict, got: dict) -> float:
    worst = 0.0
    for key, a in ref.items():
        b = got[key]
        if np.shape(a) != np.shape(b):
            return float("inf")
        if task == "fof" and key != "mass":  # halo and member counts: exactly
            if np.any(np.asarray(a) != np.asarray(b)):
                return float("inf")
            continue
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.size == 0:  # e.g. no halo in a tiny box: nothing to differ
            continue
        scale = float(np.sqrt(np.mean(a * a))) or 1.0
        worst = max(worst, float(np.max(np.abs(a - b))) / scale)
    return worst


def _datasets(args, workdir, steps: bool):
    """{(kind, workers): (snapshot path, n_side, initial conditions path or None)} and the
    SCF halo path, written once (the initial conditions of the step workloads with
    ``steps``)."""
    from cosmo_dask.models import hernquist, lpt_ics, zeldovich
    from cosmo_dask.spatial.fft import smooth_size_below

    paths = {}
    sizes = {("strong", w): args.n_side_strong for w in args.workers}
    # the largest valid mesh side (prime factors <= 7) at or below n_weak w^(1/3)
    sizes.update({("weak", w): max(4, smooth_size_below(args.n_side_weak * w ** (1 / 3)))
                  for w in args.workers})
    written = {}
    for key, n_side in sizes.items():
        if n_side not in written:
            path = os.path.join(workdir, f"zeldovich{n_side}.zarr")
            # z = 0: pancakes and filaments, FOF finds halos; 1 Mpc/h mean spacing
            # (generated on the GPU with --gpu: minutes on the host at 512^3)
            zeldovich(n_side, box_size=float(n_side), redshift=0.0, seed=1,
                      precision="float32", device="gpu" if args.gpu else "cpu",
                      ).to_zarr(path, progress=False)
            ics = None
            if steps:
                ics = os.path.join(workdir, f"ics{n_side}.zarr")
                lpt_ics(n_side, box_size=float(n_side), redshift=STEP_Z0, seed=1,
                        precision="float32", device="gpu" if args.gpu else "cpu",
                        ).to_zarr(ics, progress=False)
            written[n_side] = (path, ics)
        paths[key] = (written[n_side][0], n_side, written[n_side][1])
    halo_path = os.path.join(workdir, "hernquist.zarr")
    hernquist(args.n_scf, seed=2, precision="float64").to_zarr(halo_path, progress=False)
    if args.gpu:  # give GPU 0 back to its worker
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    return paths, halo_path


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--gpu", action="store_true",
                    help="LocalCUDACluster, one worker per GPU (= --device gpu)")
    ap.add_argument("--protocol", default=None,
                    help="worker transport, e.g. 'ucx' (NVLink between GPUs; needs "
                         "distributed-ucxx); default: dask's TCP")
    ap.add_argument("--n-side-strong", type=int, default=64)
    ap.add_argument("--n-side-weak", type=int, default=48)
    ap.add_argument("--mesh", type=int, default=128)
    ap.add_argument("--n-scf", type=int, default=200_000, help="SCF halo particles")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    ap.add_argument("--memory-limit", default="auto", help="per CPU worker")
    args = ap.parse_args(argv)
    if args.gpu or args.device == "gpu":  # --gpu: the former spelling of --device gpu
        args.gpu, args.device = True, "gpu"
    start(args, "scaling")
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = set(tasks) - set(TASKS)
    if unknown or 1 not in args.workers:
        raise SystemExit(f"tasks must be among {TASKS} and --workers must include 1 "
                         f"(the reference); got {tasks}, {args.workers}")
    workers = sorted(set(args.workers))
    # read by the worker processes when they start
    os.environ["DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH"] = str(LOG_LENGTH)

    import cosmo_dask
    from cosmo_dask import open_snapshot

    env = {"bench": "scaling", "date": time.strftime("%Y-%m-%d"), "gpu": args.gpu,
           "protocol": args.protocol or "tcp",
           "host_cpus": os.cpu_count(), "mesh": args.mesh}
    if args.gpu:
        import cupy

        env["device_name"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
        paths, halo_path = _datasets(args, workdir, any(t.endswith("_step") for t in tasks))
        reference, first_time = {}, {}
        for w in workers:
            kw = {} if args.gpu else {"threads_per_worker": 1, "processes": True,
                                      "memory_limit": args.memory_limit}
            if args.protocol:
                kw["protocol"] = args.protocol
            with cosmo_dask.connect(gpu=True if args.gpu else False, n_workers=w,
                                    quiet=True, dashboard_address=":0", **kw) as client:
                device = "gpu" if args.gpu else "cpu"
                halo = open_snapshot(halo_path, device=device)
                # with one worker: every size any worker count uses (the references)
                runs = [(kind, w, paths[(kind, w)]) for kind in ("strong", "weak")]
                if w == 1:
                    runs += [("reference", v, paths[("weak", v)]) for v in workers if v > 1]
                for kind, _w, (path, n_side, ics_path) in runs:
                    snap = open_snapshot(path, device=device)
                    ics = None if ics_path is None else open_snapshot(ics_path, device=device)
                    for task in tasks:
                        if kind != "strong" and task == "scf":
                            continue  # one halo: strong scaling only
                        data = ics if task.endswith("_step") else snap
                        _run(task, data, halo, args.mesh)  # warm-up
                        before = _bytes_received(client)
                        t0 = time.perf_counter()
                        got, seconds = _run(task, data, halo, args.mesh)
                        seconds = time.perf_counter() - t0 if seconds is None else seconds
                        moved = _bytes_received(client) - before
                        n = snap.n_particles if task != "scf" else halo.n_particles
                        ref_key = (task, n if task != "scf" else -1)
                        if w == 1:
                            reference.setdefault(ref_key, got)
                            first_time.setdefault((task, kind), (seconds, n))
                        if kind == "reference":
                            continue
                        diff = _max_difference(task, reference[ref_key], got)
                        t1, n1 = first_time[(task, kind)]
                        eff = (t1 / (w * seconds) if kind == "strong"
                               else (t1 / n1) / (seconds / n) / w)
                        emit(env, workload=task, n=n, gpus=w if args.gpu else 0,
                             kind=kind, seconds=round(seconds, 4),
                             efficiency=round(eff, 3), device=env.get("device_name", "cpu"),
                             task=task, workers=w, n_side=n_side, n_particles=n,
                             bytes_moved=moved,
                             max_rel_difference_vs_1=diff,
                             equal_to_1_worker=bool(diff <= TOLERANCE[task]))


if __name__ == "__main__":
    main()
