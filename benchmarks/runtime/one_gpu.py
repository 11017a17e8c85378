"""One GPU end to end: each workload's kernel alone against the public call on device data.

For SCF fit + forces (Hernquist, nmax 10, lmax 6, float64), MEX fit + accelerations +
potentials (Plummer, lmax 6, float64), FOF with its catalog (the ``clustered`` set of
``python -m benchmarks halos``, b = 0.2, min_members 20, ``halos.fof(centers=())``) and
tree forces (Hernquist truncated at 100 a, theta 0.5, quadrupole, float32, potentials
too), one row each in ``<out>/one_gpu.jsonl``::

    {workload, n, device, date, kernel_s, end_to_end_s, ...stage split...}

``kernel_s``: the kernel functions alone on device-resident arrays (the ``*_gpu``
functions on CuPy arrays, CUDA events after two warm-ups; on ``--device cpu`` the numba
kernels on NumPy arrays, wall clock), median of ``--repeat``. ``end_to_end_s``: the
public call as a user makes it on arrays already on the device (CuPy arrays passed
straight in; FOF on a persisted device snapshot), result computed and the device
synchronised, wall clock after ``--warmup`` calls, median. The stage split of the end to
end comes from a dask callback around every local-scheduler run during the call:
``scheduler_s`` (inside ``compute``/``persist``: task execution, kernels included, and
the scheduler's own work), ``outside_scheduler_s`` (the rest: graph building,
tokenisation, graph optimisation, host code and host synchronisations between rounds),
``rounds`` (scheduler round trips per call) and ``tasks`` (tasks run per call);
``overhead_s = end_to_end_s - kernel_s``; on the CPU also the process CPU seconds
(``kernel_cpu_s``, ``end_to_end_cpu_s``, ``overhead_cpu_s``: less sensitive to other load
on a shared machine; with ``NUMBA_NUM_THREADS=1 DASK_SCHEDULER=sync`` they count one
thread's work). The FOF row also times the end to end from a
Zarr store opened on the device (``store_end_to_end_s``), the store read alone
(positions, velocities and ids: ``store_read_s``, ``store_read_GB_per_s``) and
``fof_labels`` alone (``labels_end_to_end_s``, the issue's 37 ms row).

Sizes: ``--device gpu``: SCF and MEX 10^6, FOF 256^3, tree 2^23 (about 4 minutes with
data generation on one GPU host). ``--small`` (for ``--device cpu`` here): 1024, 1024,
32^3 and 1024, where kernel time is small and the fixed costs show. ``--only`` picks
workloads; a last row ``{workload: "p2p", ..., pairs_per_s}`` times the float32 direct
summation kernel as ``gravity-direct`` does (N = 2^20 on the GPU; ``--no-p2p`` skips it).
PSE tets/s is not timed here (``python -m benchmarks tet-deposit --device gpu``).

    python -m benchmarks one-gpu --device gpu --out $OUT
    python -m benchmarks one-gpu --device cpu --small --out -
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import cuda_event_seconds, emit, parser, start, stderr  # noqa: E402

WORKLOADS = ("scf", "mex", "fof", "tree")
#: (full size on the GPU, small size for --small)
SIZES = {"scf": (1_000_000, 1024), "mex": (1_000_000, 1024), "fof": (256, 32),
         "tree": (1 << 23, 1024)}


class Rounds:
    """Wall time inside the local schedulers' runs (a dask callback), their count and
    their tasks, between :meth:`reset` calls."""

    def __init__(self):
        from dask.callbacks import Callback

        rounds = self

        class _Cb(Callback):
            def _start(self, dsk):
                rounds._t0 = time.perf_counter()
                rounds.tasks += len(dsk)

            def _finish(self, dsk, state, errored):
                rounds.seconds += time.perf_counter() - rounds._t0
                rounds.rounds += 1

        self.callback = _Cb()
        self.reset()

    def reset(self):
        self.seconds, self.rounds, self.tasks, self._t0 = 0.0, 0, 0, 0.0


def _sync(device):
    if device == "gpu":
        import cupy

        cupy.cuda.Device().synchronize()


#: process CPU seconds of the last :func:`_kernel_seconds` on the CPU (median)
_KERNEL_CPU = {}


def _kernel_seconds(fn, device, repeat):
    """Median seconds of ``fn`` alone: CUDA events on the GPU, wall clock on the CPU
    (there also the process CPU seconds, in ``_KERNEL_CPU["s"]``)."""
    if device == "gpu":
        return cuda_event_seconds(fn, repeat, warm=2)[0]
    fn()
    times, cpu = [], []
    for _ in range(repeat):
        c, t = time.process_time(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    _KERNEL_CPU["s"] = statistics.median(cpu)
    return statistics.median(times)


def end_to_end(fn, device, repeat, warm=1):
    """Median wall seconds of ``fn()`` (device synchronised after each) with the median
    stage split of the calls (see the module docstring)."""
    rounds = Rounds()
    for _ in range(warm):
        fn()
        _sync(device)
    walls, inside, counts, tasks, cpu = [], [], [], [], []
    for _ in range(repeat):
        rounds.reset()
        with rounds.callback:
            c, t = time.process_time(), time.perf_counter()
            fn()
            _sync(device)
            walls.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        inside.append(rounds.seconds)
        counts.append(rounds.rounds)
        tasks.append(rounds.tasks)
    wall = statistics.median(walls)
    sched = statistics.median(inside)
    return {"end_to_end_s": wall, "end_to_end_all_s": [round(t, 5) for t in walls],
            "scheduler_s": sched, "outside_scheduler_s": wall - sched,
            "rounds": int(statistics.median(counts)), "tasks": int(statistics.median(tasks)),
            "end_to_end_cpu_s": statistics.median(cpu)}


def _xp(device):
    if device == "gpu":
        import cupy

        return cupy
    return np


# ----------------------------------------------------------------------------- workloads
def scf(n, device, repeat):
    from benchmarks.expansion.scf import _particles
    from cosmo_dask.expansion import SCF
    from cosmo_dask.expansion.scf_kernels import unpack_sums

    xp = _xp(device)
    x_h, m_h = _particles(n)
    x, m = xp.asarray(x_h), xp.asarray(m_h)
    nmax, lmax = 10, 6
    if device == "gpu":
        from cosmo_dask.expansion.scf_kernels_gpu import (
            scf_coefficient_sums_gpu as sums_fn,
        )
        from cosmo_dask.expansion.scf_kernels_gpu import scf_evaluate_gpu as eval_fn
    else:
        from cosmo_dask.expansion.scf_kernels import scf_coefficient_sums as sums_fn
        from cosmo_dask.expansion.scf_kernels import scf_evaluate as eval_fn
    sums, msum, _ = unpack_sums(np.asarray(sums_fn(x, m, nmax, lmax, 1.0).tolist()),
                                nmax, lmax)
    S, T = sums[0] / msum, sums[1] / msum

    def kernel():  # the coefficient kernel + block sum, then the forces (no host copy)
        sums_fn(x, m, nmax, lmax, 1.0)
        return eval_fn(x, S, T, 1.0, msum, "acceleration")

    def call():
        fit = SCF(nmax, lmax, center=(0.0, 0.0, 0.0)).fit(x, m)
        return fit.accelerations(x).compute()

    return {"n": n, "kernel_s": _kernel_seconds(kernel, device, repeat),
            **end_to_end(call, device, repeat)}


def mex(n, device, repeat):
    import dask

    from benchmarks.expansion.mex import plummer
    from cosmo_dask.expansion import MEX

    xp = _xp(device)
    x_h, m_h = plummer(n)
    x, m = xp.asarray(x_h), xp.asarray(m_h)
    if device == "gpu":
        from cosmo_dask.expansion.mex_kernels_gpu import forces_local_gpu as forces
    else:
        from cosmo_dask.expansion.mex_kernels import forces_local as forces

    def call():
        fit = MEX(lmax=6).fit(x, m)
        return dask.compute(fit.accelerations(), fit.potential())

    return {"n": n, "kernel_s": _kernel_seconds(lambda: forces(x, m, 6), device, repeat),
            **end_to_end(call, device, repeat)}


def fof(n_side, device, repeat, zarr=True):
    from benchmarks.halos.fof import particles
    from cosmo_dask import Snapshot, open_snapshot
    from cosmo_dask.halos import fof as halos_fof
    from cosmo_dask.halos.fof_graph import fof_labels
    from cosmo_dask.store.snapshot import GPU_READ_ROWS

    ll, min_members = 0.2, 20
    pos, box = particles(n_side, "clustered")
    pos = pos.astype(np.float32)
    pos[pos >= box] = 0.0  # float32 rounding can land on the box edge
    n = len(pos)
    vel = np.zeros_like(pos)
    ids = np.arange(n, dtype=np.int64)
    periods = (box, box, box)
    if device == "gpu":
        import cupy

        from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu as local
        d_pos = cupy.asarray(pos)
    else:
        from cosmo_dask.halos.fof_kernels import fof_local as local
        d_pos = pos
    row = {"n": n, "kernel_s": _kernel_seconds(
        lambda: local(d_pos, periods, ll, count_friends=False), device, repeat)}
    d_pos = None  # frees the device copy
    snap = Snapshot.from_arrays(pos, vel=vel, ids=ids, box_size=box, chunks=GPU_READ_ROWS)
    if device == "gpu":
        snap = snap.to_device("gpu")
    snap = snap.persist()

    def call(s=snap):
        res = halos_fof(s, ll, min_members=min_members, centers=())
        return res, res.labels.compute()

    row.update(end_to_end(call, device, repeat))
    res, _ = call()
    row.update(n_halos=int(res.n_halos), centers="none")
    row["labels_end_to_end_s"] = end_to_end(
        lambda: fof_labels(snap, ll, min_members=min_members).labels.compute(), device,
        repeat)["end_to_end_s"]
    snap = None  # frees the resident snapshot
    if zarr:
        import dask

        with tempfile.TemporaryDirectory() as tmp:
            Snapshot.from_arrays(pos, vel=vel, ids=ids, box_size=box).to_zarr(f"{tmp}/s.zarr")
            store = open_snapshot(f"{tmp}/s.zarr", device=device)
            read = end_to_end(lambda: dask.compute(store.pos, store.vel, store.ids), device,
                              repeat)["end_to_end_s"]
            nbytes = pos.nbytes + vel.nbytes + ids.nbytes
            row.update(store_read_s=read, store_read_GB_per_s=nbytes / read / 1e9,
                       store_bytes=nbytes)
            e2e = end_to_end(lambda: call(store), device, repeat)
            row.update(store_end_to_end_s=e2e["end_to_end_s"],
                       store_scheduler_s=e2e["scheduler_s"], store_rounds=e2e["rounds"])
    return row


def tree(n, device, repeat):
    import dask

    from benchmarks.gravity.tree_gpu import hernquist_positions
    from cosmo_dask import gravity

    xp = _xp(device)
    pos = xp.asarray(hernquist_positions(n, 1).astype(np.float32))
    mass = xp.full(n, 1.0 / n, dtype=np.float32)
    kw = dict(theta=0.5, precision="float32", potential=True, quadrupole=True,
              max_leaf=64, max_group=64)
    if device == "gpu":
        from cosmo_dask.gravity.tree.forces_gpu import tree_forces_gpu as forces
    else:
        from cosmo_dask.gravity.tree.forces import tree_forces as forces

    def call():
        acc, pot = gravity.accelerations(pos, mass, method="tree", theta=0.5,
                                         precision="float32")
        return dask.compute(acc, pot)

    return {"n": n, "kernel_s": _kernel_seconds(lambda: forces(pos, mass, **kw), device,
                                                repeat),
            **end_to_end(call, device, repeat)}


def p2p(device, small):
    """Pairs per second (N^2 / s, as ``gravity-direct`` counts) of the float32 direct
    summation kernel ``p2p_block`` without potentials (N = 2^20, 2^12 with ``--small``)."""
    from benchmarks.gravity.direct import plummer_sphere
    from cosmo_dask.gravity.dispatch import p2p_block  # p2p_block_gpu on CuPy arrays

    n = 1 << (12 if small else 20)
    xp = _xp(device)
    x, m = plummer_sphere(n)
    pos, mass = xp.asarray(x), xp.asarray(m)  # float64 in, as gravity-direct
    t = _kernel_seconds(lambda: p2p_block(pos, pos, mass, softening=1e-3, precision="float32",
                                          potential=False, exclude="index"), device, 3)
    return {"n": n, "pairs_per_s": n * n / t, "seconds": t}


def main(argv=None):
    ap = parser(__doc__, repeat=5)
    ap.add_argument("--small", action="store_true",
                    help="small sizes (the fixed costs, on the CPU here)")
    ap.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--no-zarr", action="store_true", help="fof: skip the Zarr store rows")
    ap.add_argument("--no-p2p", action="store_true", help="skip the direct P2P pairs/s row")
    args = ap.parse_args(argv)
    start(args, "one_gpu")
    import datetime

    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    failed = False
    for name in args.only:
        size = SIZES[name][1 if args.small else 0]
        stderr(f"one-gpu: {name} at {size} on {args.device}")
        t0 = time.perf_counter()
        try:  # one failing workload leaves the others' rows (one run on a lent device)
            if name == "fof":
                row = fof(size, args.device, args.repeat, zarr=not args.no_zarr)
            else:
                row = globals()[name](size, args.device, args.repeat)
        except Exception as exc:  # noqa: BLE001 - reported in the row, the run goes on
            import traceback

            traceback.print_exc()
            emit(workload=name, n=size, device=args.device, date=date,
                 error=f"{type(exc).__name__}: {exc}"[:500])
            failed = True
            continue
        row["overhead_s"] = row["end_to_end_s"] - row["kernel_s"]
        if args.device == "cpu" and "s" in _KERNEL_CPU:  # less sensitive to other load
            row["kernel_cpu_s"] = _KERNEL_CPU.pop("s")
            row["overhead_cpu_s"] = row["end_to_end_cpu_s"] - row["kernel_cpu_s"]
        row["ratio"] = row["end_to_end_s"] / row["kernel_s"]
        emit(workload=name, **{"n": row.pop("n")}, device=args.device, date=date,
             kernel_s=row.pop("kernel_s"), end_to_end_s=row.pop("end_to_end_s"), **row,
             small=args.small, bench_s=round(time.perf_counter() - t0, 1))
    if not args.no_p2p:
        try:
            emit(workload="p2p", device=args.device, date=date, **p2p(args.device, args.small))
        except Exception as exc:  # noqa: BLE001 - reported in the row
            emit(workload="p2p", device=args.device, date=date,
                 error=f"{type(exc).__name__}: {exc}"[:500])
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    main()
