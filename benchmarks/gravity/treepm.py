"""Part (d) of the gravity benchmark: TreePM on a 128^3 periodic Zel'dovich snapshot.

Workload: ``cosmo_dask.models.zeldovich(n_side, box_size=BOX, redshift=0)`` (default
128^3 = 2,097,152 particles, 256 Mpc/h), float64 positions, equal masses, G of the
snapshot. Measured:

* ``treepm``: :func:`cosmo_dask.gravity.treepm.treepm_accelerations` computed end to end
  (default n_mesh = n_side, rs = 1.2 H, r_cut = 4.5 rs, theta = 0.5, interlaced CIC PM;
  the short range is one CPU-tree task over all particles), wall-clock median of
  ``--repeat`` runs after one warm-up (numba compilation) on the local threaded scheduler;
* ``pm``: the PM part alone (:func:`cosmo_dask.gravity.pm.pm_accelerations` with the same
  split), same timing;
* ``error``: relative force error ``|a - a_ref| / |a_ref|`` (median, 90th, 99th
  percentile, max) and potential error on ``--targets`` random particles, against the
  Ewald-summed direct reference of ``tests/support/ewald_reference.py`` (float64, every one of
  the N sources, tolerance 1e-10; its run time is reported as ``ewald_seconds``).

``--device gpu`` moves the positions to CuPy chunks (PM on the GPU, short range with
``cosmo_dask.gravity.tree.forces_gpu``); timings then synchronise the device.

Prints one JSON object per measurement.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))



def _device_name(device):
    if device == "gpu":
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return platform.processor() or platform.machine()


def main(argv=None):
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--n-side", type=int, default=128)
    ap.add_argument("--box", type=float, default=256.0)
    ap.add_argument("--n-mesh", type=int, default=None, help="default: n_side")
    ap.add_argument("--targets", type=int, default=300)
    ap.add_argument("--chunks", type=int, default=1 << 18)
    ap.add_argument("--precision", choices=("float32", "float64"), default="float64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    start(args, "gravity-treepm")

    import dask
    import dask.array as da

    from cosmo_dask.gravity.pm import pm_accelerations
    from cosmo_dask.gravity.treepm import R_SPLIT_CELLS, treepm_accelerations
    from cosmo_dask.models import zeldovich
    from tests.support.ewald_reference import ewald

    n_mesh = args.n_mesh or args.n_side
    snap = zeldovich(args.n_side, box_size=args.box, redshift=0.0, precision="float64",
                     seed=args.seed)
    pos_np = np.asarray(snap.pos.compute(), dtype=np.float64)
    mass = float(snap.particle_mass)
    G = float(snap.attrs["G"])
    n = pos_np.shape[0]
    if args.device == "gpu":
        import cupy

        xp = cupy
        pos = da.from_array(cupy.asarray(pos_np), chunks=(args.chunks, 3), asarray=False)
    else:
        xp = np
        pos = da.from_array(pos_np, chunks=(args.chunks, 3))
    pos = pos.persist()

    env = dict(benchmark="gravity_treepm", date=datetime.date.today().isoformat(),
               device=args.device, device_name=_device_name(args.device),
               cpu_count=os.cpu_count(), n_particles=n, n_mesh=n_mesh, box_size=args.box,
               precision=args.precision, chunks=args.chunks)
    rs = R_SPLIT_CELLS * args.box / n_mesh

    def run_treepm():
        out = dask.compute(*treepm_accelerations(pos, mass, G=G, box_size=args.box,
                                                 n_mesh=n_mesh, precision=args.precision))
        if xp is not np:
            xp.cuda.Device().synchronize()
        return out

    def run_pm():
        out = dask.compute(*pm_accelerations(pos, mass, G=G, box_size=args.box, n_mesh=n_mesh,
                                             r_split=rs, precision=args.precision))
        if xp is not np:
            xp.cuda.Device().synchronize()
        return out

    for label, fn in (("pm", run_pm), ("treepm", run_treepm)):
        t0 = time.perf_counter()
        result = fn()  # warm-up (numba / CUDA compilation)
        warm = time.perf_counter() - t0
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t0)
        emit(env, workload=label, seconds=float(np.median(times)), seconds_all=times,
             first_call_seconds=warm, particles_per_second=n / float(np.median(times)))
    acc, pot = result
    if xp is not np:
        acc, pot = xp.asnumpy(acc), xp.asnumpy(pot)

    rng = np.random.default_rng(args.seed + 1)
    targets = np.sort(rng.choice(n, size=min(args.targets, n), replace=False))
    t0 = time.perf_counter()
    ref_acc, ref_pot = ewald(pos_np, mass, args.box, G=G, targets=targets, tol=1e-10)
    t_ewald = time.perf_counter() - t0
    err = np.linalg.norm(acc[targets] - ref_acc, axis=1) / np.linalg.norm(ref_acc, axis=1)
    perr = np.abs(pot[targets] - ref_pot) / np.abs(ref_pot).mean()
    emit(env, workload="treepm_error", targets=int(targets.size), reference="ewald tol 1e-10",
         ewald_seconds=t_ewald, median=float(np.median(err)),
         p90=float(np.percentile(err, 90)), p99=float(np.percentile(err, 99)),
         max=float(err.max()), pot_median=float(np.median(perr)),
         pot_max=float(perr.max()), theta=0.5, r_split=rs, r_cut=4.5 * rs)


if __name__ == "__main__":
    main()
