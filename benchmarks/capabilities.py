"""FOF, tree gravity, SCF, PSE and P(k) end to end through the public API, on CPU or GPU.

The "behaviour unchanged" benchmark of a refactor (issue 15): it uses only public names
that have been stable across the refactor, so the same script times an older source tree
(``PYTHONPATH=old_tree:. python -m benchmarks capabilities --label old``) and the current
one; ``MODE=capabilities benchmarks/device.sh`` runs the trees interleaved on one machine
and reports the ratios. Every line also carries a checksum of the result, so a tree that gets
faster by computing something else shows up.

Workloads (in-memory snapshots, dask's threaded scheduler on CPU, synchronous on GPU):

* fof    ``--fof-n`` particles of Plummer halos in a 100 Mpc/h box (``halo_blobs``), b = 0.2
* tree   a Hernquist sphere of ``--tree-n`` particles, theta 0.5, softening 0.01
* scf    a Hernquist sphere of ``--scf-n`` particles, nmax 10, lmax 6: fit and accelerations
* pse    Zel'dovich particles, ``--pse-side``^3, phase-space-element density (gather);
         its checksum is the deposited mass (independent of the octree's refinement)
* pk     Zel'dovich particles, ``--pk-side``^3, P(k) on a ``2 * side``^3 CIC mesh

Output: one JSON line per workload with the median wall-clock seconds of ``--repeat``
runs after one warm-up run.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.common import emit, parser, start  # noqa: E402


def _sync(device):
    if device == "gpu":
        import cupy

        cupy.cuda.Device().synchronize()


def _median_seconds(fn, device, repeat):
    out = fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _host_sum(x) -> float:
    x = x.get() if hasattr(x, "get") else np.asarray(x)
    return float(np.sum(np.abs(np.asarray(x, dtype=np.float64))))


def _on_device(snap, device):
    """``snap`` with its arrays persisted (on the GPU for ``device="gpu"``)."""
    from cosmo_dask import Snapshot

    pos = snap.pos.persist()
    if device == "gpu":  # by hand, not through an internal module that a refactor moves
        import cupy

        pos = pos.map_blocks(cupy.asarray, dtype=pos.dtype,
                             meta=cupy.empty((0,) * pos.ndim, dtype=pos.dtype)).persist()
    kw = {"box_size": snap.box_size, "particle_mass": snap.particle_mass}
    if snap.ids is not None:
        kw["ids"] = snap.ids.persist()
    if getattr(snap, "lagrangian_shape", None) is not None:
        kw["lagrangian_shape"] = snap.lagrangian_shape
    return Snapshot.from_arrays(pos, **kw)


def workloads(args):
    import dask

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density import pse_density
    from cosmo_dask.expansion import SCF
    from cosmo_dask.gravity import accelerations
    from cosmo_dask.halos import fof_labels
    from cosmo_dask.models import halo_blobs, hernquist, zeldovich

    dev = args.device

    def za(side):
        return _on_device(zeldovich(side, box_size=100.0, redshift=0.0, seed=3,
                                    precision="float64"), dev)

    def sphere(n):
        return _on_device(hernquist(n, seed=2, precision="float64"), dev)

    def blobs(n):
        return _on_device(halo_blobs(n, box_size=100.0, seed=4, precision="float64"), dev)

    def run_fof(snap):
        return _host_sum(fof_labels(snap, 0.2).labels.compute() >= 0)  # particles in halos

    def run_tree(snap):
        acc, pot = accelerations(snap, method="tree", theta=0.5, softening=0.01, G=1.0)
        acc, pot = dask.compute(acc, pot)
        return _host_sum(acc)

    def run_scf(snap):
        fit = SCF(nmax=10, lmax=6).fit(snap, G=1.0)
        return _host_sum(fit.accelerations(snap.pos).compute())

    def run_pse(snap):
        octree = pse_density(snap, strategy="gather")
        patches = octree.patches
        patches = patches.compute() if hasattr(patches, "compute") else patches
        patches = patches.get() if hasattr(patches, "get") else np.asarray(patches)
        cells = patches.reshape(octree.n_leaves, -1).astype(np.float64).sum(axis=1)
        return float(np.sum(cells * octree.cell_size**3))  # the deposited mass

    def run_pk(snap):
        ds = power_spectrum(snap, n_mesh=2 * args.pk_side)
        return float(np.nansum(ds["power"].values))

    return {"fof": (lambda: blobs(args.fof_n), run_fof, str(args.fof_n)),
            "tree": (lambda: sphere(args.tree_n), run_tree, str(args.tree_n)),
            "scf": (lambda: sphere(args.scf_n), run_scf, str(args.scf_n)),
            "pse": (lambda: za(args.pse_side), run_pse, f"{args.pse_side}^3"),
            "pk": (lambda: za(args.pk_side), run_pk, f"{args.pk_side}^3")}


def main(argv=None):
    ap = parser(__doc__, repeat=5)
    ap.add_argument("--only", nargs="*", default=["fof", "tree", "scf", "pse", "pk"])
    ap.add_argument("--fof-n", type=int, default=2**21)
    ap.add_argument("--tree-n", type=int, default=2**17)
    ap.add_argument("--scf-n", type=int, default=2**21)
    ap.add_argument("--pse-side", type=int, default=64)
    ap.add_argument("--pk-side", type=int, default=128)
    args = ap.parse_args(argv)
    start(args, "capabilities")  # bench, label, device, date, host, cpus, gpu, commit

    import dask

    env = {}
    scheduler = "synchronous" if args.device == "gpu" else "threads"
    with dask.config.set(scheduler=scheduler):
        for name, (make, run, size) in workloads(args).items():
            if name not in args.only:
                continue
            t0 = time.perf_counter()
            snap = make()
            print(f"{name}: input made in {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                  flush=True)
            seconds, check = _median_seconds(functools.partial(run, snap), args.device,
                                             args.repeat)
            emit(env, workload=name, size=size, seconds=round(seconds, 4),
                 repeat=args.repeat, checksum=check)


if __name__ == "__main__":
    main()
