"""Painting and power-spectrum timings, against a plain NumPy/CuPy baseline.

Workload: N = n_side^3 uniform random particles (float64) in a 1000 Mpc/h box,
CIC onto an n_mesh^3 mesh. Measured (wall clock, median of ``--repeat`` after
one warm-up):

* ``paint``: :func:`cosmo_dask.density.paint` (CIC, float64) computed (dask
  array of ``--chunks``-row chunks; local threaded scheduler, all cores);
* ``power``: :func:`cosmo_dask.analysis.power_spectrum` end to end, CIC,
  interlaced (two paintings + two FFTs) and not interlaced;
* ``baseline``: the textbook implementation -- CIC by eight ``np.add.at``
  calls (``cupyx.scatter_add`` on the GPU), ``rfftn``, window compensation,
  ``bincount`` binning, single array, no dask -- as ``baseline_paint`` and
  ``baseline_power`` (no interlacing). No peer package (nbodykit, Pylians) could
  be installed here, so this is the stated comparison.

GPU (``--device gpu``): positions are device-resident CuPy (dask chunks of
CuPy arrays); timings synchronise the device.

Prints one JSON object per measurement.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import parser, start  # noqa: E402

BOX = 1000.0


def _sync(xp):
    if xp is not np:
        xp.cuda.Device().synchronize()


def _wall(fn, xp, repeat):
    fn()
    _sync(xp)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(xp)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def baseline_cic(pos, n, box, xp):
    """CIC with eight scattered adds (np.add.at / cupyx.scatter_add), cell-centred nodes."""
    if xp is np:
        add_at = np.add.at
    else:
        import cupyx

        add_at = cupyx.scatter_add
    u = pos * (n / box) - 0.5
    i0 = xp.floor(u).astype(xp.int64)
    f = u - i0
    mesh = xp.zeros((n, n, n))
    for dx in (0, 1):
        wx = f[:, 0] if dx else 1 - f[:, 0]
        for dy in (0, 1):
            wy = f[:, 1] if dy else 1 - f[:, 1]
            for dz in (0, 1):
                wz = f[:, 2] if dz else 1 - f[:, 2]
                add_at(mesh, ((i0[:, 0] + dx) % n, (i0[:, 1] + dy) % n, (i0[:, 2] + dz) % n),
                       wx * wy * wz)
    return mesh


def baseline_power(pos, n, box, xp):
    mesh = baseline_cic(pos, n, box, xp)
    fk = xp.fft.rfftn(mesh / mesh.mean() - 1) * (box / n) ** 3
    kf = 2 * np.pi / box
    q = xp.fft.fftfreq(n, 1.0 / n)
    qz = xp.fft.rfftfreq(n, 1.0 / n)
    kk = kf * xp.sqrt(q[:, None, None] ** 2 + q[None, :, None] ** 2 + qz[None, None, :] ** 2)
    w = xp.sinc(q / n)[:, None, None] * xp.sinc(q / n)[None, :, None] * xp.sinc(qz / n)
    p = xp.abs(fk) ** 2 / box**3 / w**4
    mult = xp.where((qz == 0) | (qz == n // 2), 1.0, 2.0)[None, None, :] * xp.ones_like(kk)
    b = xp.rint(kk / kf).astype(xp.int64).ravel()
    keep = (b >= 1) & (b <= n // 2)
    nm = xp.bincount(b[keep], weights=mult.ravel()[keep], minlength=n // 2 + 1)
    ps = xp.bincount(b[keep], weights=(mult * p).ravel()[keep], minlength=n // 2 + 1)
    return ps[1:] / nm[1:]


def main(argv=None):
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--sizes", default="256:256", help="n_side:n_mesh pairs, comma separated")
    ap.add_argument("--chunks", type=int, default=2**21, help="particles per dask chunk")
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args(argv)
    start(args, "power")

    import dask
    import dask.array as da

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density import paint

    if args.device == "gpu":
        import cupy as xp

        dev = xp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    else:
        xp = np
        dev = platform.processor() or platform.machine()
    env = {"host": platform.node(), "device": args.device, "device_name": dev,
           "cpus": os.cpu_count(), "date": datetime.date.today().isoformat(),
           "dask": dask.__version__, "numpy": np.__version__}
    for pair in args.sizes.split(","):
        n_side, n_mesh = (int(v) for v in pair.split(":"))
        run_one(n_side, n_mesh, args, env, xp, paint, power_spectrum, da)
        if xp is not np:
            xp.get_default_memory_pool().free_all_blocks()


def run_one(n_side, n_mesh, args, env, xp, paint, power_spectrum, da):
    n_part = n_side**3
    rng = xp.random.default_rng(1)
    pos_arr = rng.random((n_part, 3)) * BOX
    pos = da.from_array(pos_arr, chunks=(args.chunks, 3), asarray=False)
    rec = dict(env, n_particles=n_part, n_mesh=n_mesh, chunks=args.chunks)

    def emit(**kw):
        emit(dict(rec, **kw))

    t = _wall(lambda: paint(pos, n_mesh=n_mesh, box_size=BOX, scheme="cic").compute(), xp,
              args.repeat)
    emit(what="paint", seconds=t, particles_per_s=n_part / t)
    for inter in (False, True):
        t = _wall(lambda inter=inter: power_spectrum(pos, n_mesh=n_mesh, box_size=BOX,
                                                     interlace=inter), xp, args.repeat)
        emit(what="power", interlace=inter, seconds=t, particles_per_s=n_part / t)
    if args.no_baseline:
        return
    rep = max(1, min(args.repeat, 2))
    t = _wall(lambda: baseline_cic(pos_arr, n_mesh, BOX, xp), xp, rep)
    emit(what="baseline_paint", seconds=t, particles_per_s=n_part / t)
    t = _wall(lambda: baseline_power(pos_arr, n_mesh, BOX, xp), xp, rep)
    emit(what="baseline_power", seconds=t, particles_per_s=n_part / t)
    # agreement of the two non-interlaced spectra
    ours = power_spectrum(pos, n_mesh=n_mesh, box_size=BOX, interlace=False)
    base = baseline_power(pos_arr, n_mesh, BOX, xp)
    base = base.get() if xp is not np else base
    emit(what="baseline_agreement", max_rel_diff=float(np.nanmax(np.abs(
        ours["power"].values / base - 1))))


if __name__ == "__main__":
    main()
