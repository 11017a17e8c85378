"""Friends-of-friends: cosmo_dask against the scipy reference, GPU throughput, MBP timing.

Workloads (periodic box, b = 0.2 mean spacings, min_members = 20):
  uniform    N random points;
  clustered  half uniform, half in Gaussian blobs (sigma 0.3-1 mean spacing,
             blob sizes from a power law), wrapped into the box;
  plummer    15% uniform, the rest in 400 Plummer spheres with power-law sizes
             (2^21: 500 halos of >= 20, the largest 320k, 1.7e8 friend pairs;
             spheres on faces and an edge), wrapped into the box;
  zeldovich  Zel'dovich-approximation particles at z = 0 (cosmo_dask.models), box
             N^(1/3) Mpc/h;
  evolved    a simulated box at z = 0 (2LPT from z = 19, 40 PM steps, FastPM factors,
             mesh 2 N^(1/3)), box N^(1/3) Mpc/h.

For each, in one run: cosmo_dask ``fof_labels`` end to end from an in-memory
snapshot on the local threaded scheduler (all cores), then the scipy reference
(cKDTree(boxsize).query_pairs + csgraph.connected_components, what the tests
compare against), and the ratio. Partitions are checked equal.

``--device gpu`` (one GPU, float32 positions, medians of ``--repeat`` runs after a
warm-up, synchronised) prints three rows per set: ``fof-gpu-kernel``, the kernel
``fof_local_gpu`` alone on device-resident positions (CUDA events; the dense-cell
path that ``fof_labels`` runs, with stage times and peak GPU memory, and the
friend-counting pair path beside it), ``fof-gpu-device``, ``fof_labels`` from a
snapshot already on the GPU (one 2^24-row chunk per GPU read, as a store opened on
the GPU), and ``fof-gpu-store``, end to end from a Zarr store opened with
``device="gpu"``, with the store read (read, value checks, copy to the GPU) timed
alone, beside the former read (NumPy chunks copied with ``cupy.asarray``), and the peak
GPU memory of the run. ``--check-cpu`` compares the kernel's labels with the CPU kernel's and the
halo labels with the CPU ``fof_labels`` (``--check-cpu kernel``: the kernel's only);
``--no-store`` skips the store row.
``--mbp`` times exact vs grid most-bound particles on the largest halos.
``--kdcount`` adds, in the same process, kdcount's FOF (``kdcount.cluster.fof``, one
thread, checked to give the same partition) and ratios ours / kdcount for: the full
``fof_labels`` (threaded, all cores, and the synchronous scheduler, one thread), and
the single-threaded kernel ``fof_local`` on the whole box (the dense-cell path,
``count_friends=False``, and the exact pair path that counts friends).
``--catalog`` times, instead of the above, side by side on the same snapshot,
alternated, medians of ``--repeat`` runs each after a warm-up (numba warm): kdcount's
``cluster.fof`` (labels only, one thread; ``--no-kdcount`` skips it), ``fof_labels``,
and ``fof`` with no centres, the MCP, the MBP, and both (labels computed in each); it
prints the ratios to ``fof_labels``, the process CPU seconds (less sensitive to other
load on a shared machine) and the seconds per task kind of the last full catalog run,
and appends the row to ``benchmarks/results/halos_catalog.jsonl``. The issue-30 set:
``--kinds blobs --particles 1048576`` (300 Plummer halos of ``halo_blobs``, member
counts dN/dn ~ n^-2.1, i.e. Pareto index 1.1, scale radius ~ n^(1/3); the largest FOF
halo 72k members); ``--kinds evolved --n-side 128`` a simulated box at z = 0 (the
positions cached in the temporary directory after the first run). With ``--device gpu``
the snapshot is resident on the GPU (fof on CuPy chunks; kdcount on the host copy).
``--threads N`` runs the local threaded scheduler and numba with N threads (default: all
cores).
``--memory`` reports the peak memory of FOF runs from a Zarr store (1 and 8
domains, each in a fresh single-threaded process that holds every domain): the
traced peak (tracemalloc) and the sampled resident-set peak over the bytes of
the particles held with their ghosts (positions + ids; + velocities for the
full ``fof`` with its catalog).

Prints one JSON object per measurement.

    python -m benchmarks halos [--n-side 128 256] [--device cpu|gpu] [--mbp] [--memory]
        [--kinds plummer blobs zeldovich uniform clustered evolved] [--kdcount]
        [--check-cpu] [--no-store] [--catalog [--no-kdcount]] [--particles N] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, gpu_seconds, parser, start  # noqa: E402

#: seed of the ``blobs`` set (2^20 particles: the largest FOF halo 72k members)
BLOBS_SEED = 6
#: central densities of the Plummer spheres: 10^RHO_LO .. 10^RHO_HI mean densities
RHO_LO, RHO_HI = 3.0, 5.0


def plummer_spheres(n: int, box: float, rng, n_spheres: int = 400, background: float = 0.15,
                    largest: float = 0.165):
    """``n`` points: ``background`` of them uniform, the rest in ``n_spheres`` Plummer
    spheres with power-law (Zipf) sizes, the largest holding ``largest`` of all points
    (~350k of 2^21, ~320k in its FOF halo), wrapped into the periodic box. Scale radii
    give central densities log-uniform in 10^RHO_LO-10^RHO_HI mean densities; the
    largest sphere sits on an edge of the box and a tenth of the others on a face.
    With b = 0.2 and 2^21 points (seed 1): 500 halos of >= 20 members, 397 of >= 100
    (about one per sphere; the rest are small groups at the spheres' rims), the largest
    319,882, and 1.7e8 friend pairs."""
    n_bg = int(round(background * n))
    n_sph = n - n_bg
    top = largest * n
    # Zipf exponent p with sum_k top k^-p = n_sph
    k = np.arange(1, n_spheres + 1, dtype=np.float64)
    lo_p, hi_p = 0.1, 4.0
    for _ in range(60):
        p = 0.5 * (lo_p + hi_p)
        if (top * k**-p).sum() > n_sph:
            lo_p = p
        else:
            hi_p = p
    sizes = np.floor(top * k**-p).astype(np.int64)
    sizes[0] += n_sph - sizes.sum()
    centres = rng.random((n_spheres, 3)) * box
    on_face = rng.random(n_spheres) < 0.1
    centres[on_face, rng.integers(0, 3, on_face.sum())] = 0.0
    centres[0] = (0.3, 0.2, 0.5 * box)  # the largest straddles an edge (two faces)
    rho0 = 10 ** rng.uniform(RHO_LO, RHO_HI, n_spheres)  # central density / mean density
    a = (3 * sizes / (4 * np.pi * rho0)) ** (1 / 3)  # Plummer: rho0 = 3 M / (4 pi a^3)
    pos = [rng.random((n_bg, 3)) * box]
    for c, s, r in zip(centres, sizes, a, strict=True):
        u = rng.uniform(0.0, 0.985, s)  # mass fraction, truncated at ~10 a
        rad = r / np.sqrt(u ** (-2 / 3) - 1)
        v = rng.normal(size=(s, 3))
        pos.append(c + v * (rad / np.linalg.norm(v, axis=1))[:, None])
    return np.mod(np.concatenate(pos), box)


def particles(n_side: int, kind: str, seed: int = 1, n: int | None = None):
    """Positions and box (mean spacing 1) of ``n_side^3`` points, or of ``n`` points
    (box ``n^(1/3)``; not for the zeldovich and evolved sets)."""
    rng = np.random.default_rng(seed)
    box = float(n_side) if n is None else n ** (1 / 3)  # mean spacing 1
    n = n_side**3 if n is None else n
    if kind == "uniform":
        return rng.random((n, 3)) * box, box
    if kind == "plummer":
        return plummer_spheres(n, box, rng), box
    if kind == "blobs":  # 300 Plummer halos, dN/dn ~ n^-2.1 (Pareto 1.1), a ~ n^(1/3)
        from cosmo_dask.models import halo_blobs

        snap = halo_blobs(n, box_size=box, n_halos=300, halo_fraction=0.85, slope=-2.1,
                          seed=BLOBS_SEED, precision="float64")
        return np.mod(snap.pos.compute(), box), box
    if kind == "zeldovich":  # Zel'dovich ICs at z = 0 (shell crossing: pancakes, filaments)
        from cosmo_dask.models import zeldovich

        snap = zeldovich(n_side, box_size=box, redshift=0.0, seed=seed, precision="float64")
        return np.mod(snap.pos.compute(), box), box
    if kind == "evolved":  # a simulated box at z = 0: 2LPT from z = 19, 40 PM steps
        cache = os.path.join(tempfile.gettempdir(), f"cosmo_dask_evolved_{n_side}_{seed}.npy")
        if os.path.exists(cache):  # the same run's positions, saved by an earlier call
            return np.load(cache), box
        from cosmo_dask.models import lpt_ics
        from cosmo_dask.simulation import run

        ics = lpt_ics(n_side, box_size=box, redshift=19.0, seed=seed, precision="float32")
        snap = run(ics, z_final=0.0, n_steps=40, method="pm", precision="float32").snapshot
        pos = np.mod(snap.pos.compute().astype(np.float64), box)
        np.save(cache + ".tmp.npy", pos)
        os.replace(cache + ".tmp.npy", cache)
        return pos, box
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
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--n-side", type=int, nargs="+", default=[128])
    ap.add_argument("--kinds", nargs="+", default=["clustered", "uniform"],
                    choices=("clustered", "uniform", "plummer", "blobs", "zeldovich",
                             "evolved"))
    ap.add_argument("--kdcount", action="store_true",
                    help="side-by-side kdcount FOF and single-thread kernel timings")
    ap.add_argument("--no-scipy", action="store_true")
    ap.add_argument("--mbp", action="store_true")
    ap.add_argument("--check-cpu", nargs="?", const="all", choices=("all", "kernel"),
                    help="gpu: compare labels with the CPU (kernel: the kernel's only)")
    ap.add_argument("--no-store", action="store_true", help="gpu: skip the Zarr store row")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--catalog", action="store_true",
                    help="kdcount, fof_labels and fof (no centres, mcp, mbp, both) side "
                         "by side")
    ap.add_argument("--particles", type=int, default=None,
                    help="this many particles instead of n_side^3 (box N^(1/3); not for "
                         "zeldovich, evolved)")
    ap.add_argument("--no-kdcount", action="store_true", help="--catalog without kdcount")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of the local scheduler and numba (default: all cores)")
    ap.add_argument("--memory-child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    start(args, "halos")
    if args.memory_child:
        return _memory_child(*args.memory_child)

    from cosmo_dask import Snapshot
    from cosmo_dask.halos.fof_graph import fof_labels

    env = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "numpy": np.__version__,
        "dask": dask.__version__,
    }
    ll, min_members = 0.2, 20
    if args.threads is not None:
        import numba

        dask.config.set(scheduler="threads", num_workers=args.threads)
        numba.set_num_threads(args.threads)
        env["threads"] = args.threads
    for n_side in args.n_side:
        for kind in args.kinds:
            t0 = time.perf_counter()
            pos, box = particles(n_side, kind, n=args.particles)
            pos = pos.astype(np.float32)
            pos[pos >= box] = 0.0  # float32 rounding can land on the box edge
            n = len(pos)
            snap = Snapshot.from_arrays(pos, box_size=box, ids=np.arange(n, dtype=np.int64))
            if args.catalog:
                cenv = {**env, "device": args.device}
                if args.device == "gpu":  # the snapshot resident on the GPU, as a user has it
                    from cosmo_dask.store.snapshot import GPU_READ_ROWS

                    snap = Snapshot.from_arrays(pos, box_size=box,
                                                ids=np.arange(n, dtype=np.int64),
                                                chunks=GPU_READ_ROWS).to_device("gpu").persist()
                bench_catalog(snap, kind, ll, min_members, args.repeat, cenv,
                              kdcount=not args.no_kdcount)
                continue
            setup_s = time.perf_counter() - t0
            if args.device == "gpu":
                res = bench_gpu(snap, kind, ll, min_members, args, {**env, "setup_s": setup_s})
                if args.mbp and kind == "clustered":
                    bench_mbp(snap, res, box, env, args.device)
                if args.memory and kind == "clustered":
                    bench_memory(snap, ll, min_members, env, device=args.device)
                continue
            fof_labels(snap, ll, min_members=min_members)  # warm-up (numba)
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                res = fof_labels(snap, ll, min_members=min_members)
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
            if args.kdcount and args.device == "cpu":
                row.update(bench_kdcount(snap, box, ll, min_members, labels, t_ours,
                                         args.repeat))
            emit(row)
            if args.mbp and kind == "clustered":
                bench_mbp(snap, res, box, env, args.device)
            if args.memory and kind == "clustered":
                bench_memory(snap, ll, min_members, env, device=args.device)


def gpu_memory_hook():
    """A CuPy memory hook counting the bytes of GPU memory in use (every pool allocation
    and release) and their peak since it was entered: ``with hook: ...; hook.peak``."""
    from cupy.cuda.memory_hook import MemoryHook

    class InUse(MemoryHook):
        name = "in-use"

        def __init__(self):
            self.now = self.peak = 0

        def malloc_postprocess(self, **kw):
            self.now += kw["mem_size"]
            self.peak = max(self.peak, self.now)

        def free_postprocess(self, **kw):
            self.now -= kw["mem_size"]

    return InUse()


def _pool_peak(pool, fn) -> int:
    """Bytes CuPy's memory pool held at most while ``fn()`` ran: the pool's size after
    it, its cached blocks freed before (it keeps what it allocated; a memory hook would
    see only this thread's allocations, not those of dask's worker threads)."""
    pool.free_all_blocks()
    fn()
    return int(pool.total_bytes())


def bench_gpu(snap, kind, ll, min_members, args, env):
    """The GPU rows of one set (see the module docstring); returns the device-resident
    ``fof_labels`` result."""
    import cupy

    from cosmo_dask import Snapshot, open_snapshot
    from cosmo_dask.halos.fof_graph import fof_labels
    from cosmo_dask.halos.fof_kernels import fof_local
    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu
    from cosmo_dask.store.snapshot import GPU_READ_ROWS

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    env = {**env, "gpu": name, "cupy": cupy.__version__}
    pos = snap.pos.compute()
    n = len(pos)
    box = float(snap.box_size)
    periods = (box, box, box)
    base = {"set": kind, "n_particles": n, "linking_length": ll, "min_members": min_members}
    pool = cupy.get_default_memory_pool()

    # 1. the kernel alone on device-resident positions: CUDA events around each stage
    d_pos = cupy.asarray(pos)
    fof_local_gpu(d_pos, periods, ll, count_friends=False)  # compiles the kernels
    fof_local_gpu(d_pos, periods, ll)
    stages, totals = [], []
    for _ in range(args.repeat):
        marks = []

        def mark(stage, marks=marks):
            ev = cupy.cuda.Event()
            ev.record()
            marks.append((stage, ev))

        mark("start")
        root, _ = fof_local_gpu(d_pos, periods, ll, count_friends=False, events=mark)
        marks[-1][1].synchronize()
        st = {b[0]: cupy.cuda.get_elapsed_time(a[1], b[1])
              for a, b in zip(marks[:-1], marks[1:], strict=True)}
        stages.append(st)
        totals.append(cupy.cuda.get_elapsed_time(marks[0][1], marks[-1][1]) / 1e3)
    t_kernel = float(np.median(totals))
    t_count, _, (root_c, friends) = gpu_seconds(
        lambda: fof_local_gpu(d_pos, periods, ll), args.repeat)
    hook = gpu_memory_hook()
    with hook:
        fof_local_gpu(d_pos, periods, ll, count_friends=False)
    sizes = cupy.bincount(root)
    row = {"workload": "fof-gpu-kernel", **base,
           "seconds": t_kernel, "seconds_all": [round(t, 5) for t in totals],
           "particles_per_s": n / t_kernel,
           "stages_ms": {k: round(float(np.median([s[k] for s in stages])), 3)
                         for k in stages[0]},
           "peak_gpu_bytes_over_input": round(hook.peak / d_pos.nbytes, 2),
           "peak_gpu_bytes": int(hook.peak) + int(d_pos.nbytes),
           "count_path_seconds": t_count, "count_path_particles_per_s": n / t_count,
           "paths_agree": bool((root == root_c).all()),
           "mean_friends": float(friends.mean()),
           "groups_ge2": int((sizes >= 2).sum()), "in_groups": int(sizes[sizes >= 2].sum())}
    if args.check_cpu:
        root_cpu, _ = fof_local(pos, periods, ll, count_friends=False)
        row["identical_to_cpu_kernel"] = bool(np.array_equal(cupy.asnumpy(root), root_cpu))
        del root_cpu
    del root, root_c, friends, sizes
    d_pos = None  # frees the device copy
    emit({**row, **env})

    # 2. fof_labels from a snapshot already on the GPU
    cpu_labels = None
    if args.check_cpu == "all":
        cpu_labels = fof_labels(snap, ll, min_members=min_members).labels.compute()
    d_snap = Snapshot.from_arrays(pos, ids=snap.ids.compute(), box_size=box,
                                  chunks=GPU_READ_ROWS).to_device("gpu").persist()

    def run_device():
        res = fof_labels(d_snap, ll, min_members=min_members)
        return res, res.labels.compute()

    t_dev, times, (res, labels) = gpu_seconds(run_device, args.repeat)
    resident = pool.used_bytes()
    peak = _pool_peak(pool, run_device)
    row = {"workload": "fof-gpu-device", **base, "seconds": t_dev,
           "seconds_all": [round(t, 4) for t in times], "particles_per_s": n / t_dev,
           "kernel_share": round(t_kernel / t_dev, 3),
           "resident_gpu_bytes": int(resident), "peak_gpu_bytes": peak,
           "n_halos": res.n_halos, "largest": int(res.n_members[0]) if res.n_halos else 0,
           "domains": res.parameters["n_domains"]}
    if cpu_labels is not None:
        row["identical_to_cpu"] = bool(np.array_equal(cupy.asnumpy(labels), cpu_labels))
    del labels
    d_snap = None  # frees the resident copy
    emit({**row, **env})

    # 3. end to end from a Zarr store opened on the GPU; the store read alone
    if not args.no_store:
        with tempfile.TemporaryDirectory() as tmp:
            snap.to_zarr(f"{tmp}/s.zarr")
            store = open_snapshot(f"{tmp}/s.zarr", device="gpu")
            t_read, _, _ = gpu_seconds(lambda: dask.compute(store.pos, store.ids),
                                        args.repeat)
            # the former GPU read, for comparison: NumPy chunks, then cupy.asarray per chunk
            host_read = open_snapshot(f"{tmp}/s.zarr").to_device("gpu")
            t_host_read, _, _ = gpu_seconds(
                lambda: dask.compute(host_read.pos, host_read.ids), args.repeat)

            def run_store():
                r = fof_labels(store, ll, min_members=min_members)
                return r.labels.compute()

            t_e2e, times, labels = gpu_seconds(run_store, args.repeat)
            peak = _pool_peak(pool, run_store)
            row = {"workload": "fof-gpu-store", **base, "seconds": t_e2e,
                   "seconds_all": [round(t, 4) for t in times], "particles_per_s": n / t_e2e,
                   "store_read_seconds": t_read, "after_read_seconds": t_e2e - t_read,
                   "store_read_GB_per_s": (pos.nbytes + n * 8) / t_read / 1e9,
                   "host_then_copy_read_seconds": t_host_read,
                   "peak_gpu_bytes": peak}
            if cpu_labels is not None:
                row["identical_to_cpu"] = bool(np.array_equal(cupy.asnumpy(labels), cpu_labels))
            del labels
            emit({**row, **env})
    pool.free_all_blocks()
    return res




def bench_catalog(snap, kind, ll, min_members, repeat, env, kdcount=True):
    """Side by side on one snapshot, alternated runs after a warm-up of each (numba
    warm), medians: kdcount's ``cluster.fof`` (labels only, one thread), ``fof_labels``,
    ``fof`` with no centres, with the MCP only, the MBP only, and both; wall and process
    CPU seconds, ratios to ``fof_labels``, and the task time per task kind of the last
    full catalog run. The row is printed and appended to ``<--out>/halos_catalog.jsonl``."""
    from dask.callbacks import Callback
    from dask.utils import key_split

    from cosmo_dask.core.backend import host
    from cosmo_dask.halos import fof
    from cosmo_dask.halos.fof_graph import fof_labels

    class TaskTimes(Callback):
        def __init__(self):
            super().__init__()
            self.start, self.total = {}, {}

        def _pretask(self, key, dsk, state):
            self.start[key] = time.perf_counter()

        def _posttask(self, key, result, dsk, state, worker_id):
            kind_ = key_split(key)
            self.total[kind_] = (self.total.get(kind_, 0.0)
                                 + time.perf_counter() - self.start.pop(key))

    def labels():
        res = fof_labels(snap, ll, min_members=min_members)
        res.labels.compute()
        return res

    def catalog(centers):
        def run():
            res = fof(snap, ll, min_members=min_members, centers=centers)
            res.labels.compute()
            return res
        return run

    runs = {"labels": labels, "catalog_none": catalog(()), "catalog_mcp": catalog(("mcp",)),
            "catalog_mbp": catalog(("mbp",)), "catalog_mbp_mcp": catalog(("mbp", "mcp"))}
    if kdcount:
        from kdcount.cluster import dataset
        from kdcount.cluster import fof as kd_fof

        pos64 = host(snap.pos.compute()).astype(np.float64)  # kdcount works in float64
        box = snap.box_size

        def kd():
            return kd_fof(dataset(pos64, boxsize=box), linking_length=ll)
        runs = {"kdcount": kd, **runs}
    out = {name: fn() for name, fn in runs.items()}  # warm-up: numba compilation
    times = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    tasks = TaskTimes()
    for i in range(repeat):
        for name, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            if name == "catalog_mbp_mcp" and i == repeat - 1:
                with tasks:
                    fn()
            else:
                fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    med_cpu = {k: float(np.median(v)) for k, v in cpu.items()}
    res = out["catalog_mbp_mcp"]
    row = {
        "workload": f"catalog-{kind}",
        "n_particles": snap.n_particles,
        "seconds": {k: round(v, 4) for k, v in med.items()},
        "ratio_over_labels": {k: round(v / med["labels"], 3) for k, v in med.items()},
        "seconds_all": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "cpu_seconds": {k: round(v, 4) for k, v in med_cpu.items()},
        "cpu_ratio_over_labels": {k: round(v / med_cpu["labels"], 3)
                                  for k, v in med_cpu.items()},
        "catalog_mbp_mcp_task_seconds": {k: round(v, 3) for k, v in
                                         sorted(tasks.total.items(), key=lambda kv: -kv[1])},
        "n_halos": res.n_halos,
        "largest": int(res.catalog["n_members"][0]) if res.n_halos else 0,
        "domains": res.parameters["n_domains"],
        "repeat": repeat,
        **env,
    }
    if kdcount:
        lab = host(out["labels"].labels.compute())
        row["identical_kdcount"] = bool(same_partition(lab, out["kdcount"].labels,
                                                       min_members))
    emit(row, file="halos_catalog")


def bench_kdcount(snap, box, ll, min_members, labels, t_ours, repeat):
    """kdcount's FOF beside ours (medians of ``repeat`` runs): the full ``fof_labels`` on
    the synchronous scheduler, and the kernel alone (one domain, one thread), the
    dense-cell path and the friend-counting pair path."""
    from kdcount.cluster import dataset
    from kdcount.cluster import fof as kd_fof

    from cosmo_dask.halos.fof_graph import fof_labels
    from cosmo_dask.halos.fof_kernels import fof_local

    pos32 = snap.pos.compute()
    pos = pos32.astype(np.float64)  # the same values; kdcount works in float64
    periods = (box, box, box)

    def median_time(fn):
        times, out = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)), out

    t_kd, kd = median_time(lambda: kd_fof(dataset(pos, boxsize=box), linking_length=ll))
    fof_local(pos32[:1000], periods, ll, count_friends=False)  # numba warm-up
    t_kernel, (root, _) = median_time(
        lambda: fof_local(pos32, periods, ll, count_friends=False))
    t_pairs, (root_p, friends) = median_time(lambda: fof_local(pos32, periods, ll))
    with dask.config.set(scheduler="sync"):
        t_sync, _ = median_time(
            lambda: fof_labels(snap, ll, min_members=min_members).labels.compute())
    return {
        "kdcount_seconds": t_kd,
        "identical_kdcount": bool(same_partition(labels, kd.labels, min_members)),
        "ratio_ours_over_kdcount": t_ours / t_kd,
        "sync_seconds": t_sync,
        "ratio_sync_over_kdcount": t_sync / t_kd,
        "kernel_seconds": t_kernel,
        "ratio_kernel_over_kdcount": t_kernel / t_kd,
        "kernel_pairs_seconds": t_pairs,
        "ratio_kernel_pairs_over_kdcount": t_pairs / t_kd,
        "kernel_paths_agree": bool(np.array_equal(root, root_p)),
        "friend_pairs": int(friends.sum(dtype=np.int64) // 2),
    }


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
    emit(row)


def bench_memory(snap, ll, min_members, env, domains=(1, 8), device="cpu"):
    """Peak memory of FOF runs from a Zarr store, each in a fresh process (see _memory_child)."""
    import subprocess
    import sys

    from cosmo_dask import Snapshot

    pos = snap.pos.compute()
    vel = np.random.default_rng(2).normal(size=pos.shape).astype(np.float32)
    snap = Snapshot.from_arrays(pos, vel=vel, box_size=snap.box_size, ids=snap.ids.compute())
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/s.zarr"
        snap.to_zarr(path)
        for n_domains in domains:
            for what in ("fof_labels", "fof"):
                row = {}
                # one probe per process: tracemalloc's own bookkeeping inflates the RSS
                for probe in ("trace", "rss") if device == "cpu" else ("gpu",):
                    out = subprocess.run(
                        [sys.executable, __file__, "--memory-child", path, str(n_domains),
                         what, str(ll), str(min_members), probe],
                        check=True, capture_output=True, text=True).stdout
                    row.update(json.loads(out.strip().splitlines()[-1]))
                emit({**row, **env})


def _memory_child(path, n_domains, what, ll, min_members, probe):
    """One FOF run in this (fresh) process on the synchronous scheduler, so that the
    process is one worker thread that holds the whole share: every domain with its
    ghosts. Reports, per task name and overall, the traced peak (tracemalloc: every
    NumPy and numba allocation, including the Zarr read) and the resident-set peak
    above the level just before the run (sampled every 2 ms), both over the share
    (positions + ids of all domains with their ghosts; plus velocities for ``fof``,
    whose catalog reads them). ``probe`` is "trace" or "rss": one measurement per
    process, as tracemalloc's own bookkeeping would inflate the resident set; "gpu"
    runs on CuPy chunks and reports the peak of GPU memory in use (a CuPy memory
    hook counting every pool allocation and release) over the same share."""
    import threading
    import tracemalloc

    from dask.callbacks import Callback

    from cosmo_dask import Snapshot, open_snapshot
    from cosmo_dask.halos import fof
    from cosmo_dask.halos.fof_graph import fof_labels
    from cosmo_dask.halos.parameters import check_linking_length
    from cosmo_dask.spatial import decompose, domain_grid

    n_domains, ll, min_members = int(n_domains), float(ll), int(min_members)
    # compile/load every kernel on a small snapshot first
    rng = np.random.default_rng(0)
    warm = Snapshot.from_arrays(rng.random((4096, 3)).astype(np.float32) * 16, box_size=16.0,
                                vel=np.zeros((4096, 3), np.float32),
                                ids=np.arange(4096, dtype=np.int64))
    gpu = probe == "gpu"
    if gpu:
        warm = warm.to_device("gpu")
    with dask.config.set(scheduler="sync"):
        fof(warm, ll, min_members=5)
    snap = open_snapshot(path, device="gpu" if gpu else "cpu")
    # the share: rows every domain holds (owned + ghosts), counted without tracing
    ghost = check_linking_length(snap, ll, False)
    grid = domain_grid(n_domains, box_size=snap.box_size)
    with dask.config.set(scheduler="sync"):
        parts = dask.compute(*decompose(snap.pos, grid, ghost_width=ghost).exchange())
    rows = sum(p.index.size for p in parts)
    del parts
    per_row = snap.pos.dtype.itemsize * 3 + snap.ids.dtype.itemsize
    if what == "fof":
        per_row += snap.vel.dtype.itemsize * 3
    share = rows * per_row

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    tasks: dict = {}

    class Peaks(Callback):
        def _pretask(self, key, dsk, state):
            if probe == "trace":
                tracemalloc.reset_peak()
            elif gpu:
                hook.peak = hook.now

        def _posttask(self, key, result, dsk, state, id):
            if probe == "rss":
                return
            name = key[0] if isinstance(key, tuple) else key
            name = str(name).rsplit("-", 2)[0] if "-" in str(name) else str(name)
            peak = hook.peak if gpu else tracemalloc.get_traced_memory()[1]
            tasks[name] = max(tasks.get(name, 0), peak)

    high = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            high[0] = max(high[0], rss())
            time.sleep(0.002)

    hook = None
    if gpu:
        import cupy

        hook = gpu_memory_hook()
        hook.__enter__()
    base_rss = rss()
    if probe == "rss":
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    else:
        tracemalloc.start()
    t0 = time.perf_counter()
    with dask.config.set(scheduler="sync"), Peaks():
        if what == "fof":
            res = fof(snap, ll, min_members=min_members, n_domains=n_domains)
            res.labels.compute()
        else:
            fof_labels(snap, ll, min_members=min_members, n_domains=n_domains).labels.compute()
    seconds = time.perf_counter() - t0
    row = {"workload": f"memory-{what}", "n_particles": snap.n_particles,
           "domains": n_domains, "rows_with_ghosts": rows, "share_bytes": share,
           "bytes_per_row": per_row}
    if gpu:
        cupy.cuda.Device().synchronize()
        hook.__exit__(None, None, None)
        worst = max(tasks, key=tasks.get)
        row.update(gpu_peak_ratio=round(tasks[worst] / share, 3), gpu_peak_task=worst,
                   per_task_ratio={k: round(v / share, 2) for k, v in sorted(tasks.items())},
                   seconds=round(seconds, 2))
    elif probe == "rss":
        stop.set()
        sampler.join()
        row.update(rss_peak_ratio=round((high[0] - base_rss) / share, 3),
                   seconds=round(seconds, 2))
    else:
        tracemalloc.stop()
        worst = max(tasks, key=tasks.get)
        row.update(traced_peak_ratio=round(tasks[worst] / share, 3), traced_peak_task=worst,
                   per_task_ratio={k: round(v / share, 2) for k, v in sorted(tasks.items())})
    emit(row)


if __name__ == "__main__":
    main()
