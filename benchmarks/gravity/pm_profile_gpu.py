"""Where a PM force's time goes on one GPU: the seconds of each kind of task.

The PM long-range force (``gravity.pm.pm_accelerations``, float32, interlaced, no
potential) of Zel'dovich ICs of ``n_side^3`` particles on an ``n_mesh^3`` mesh, run on
dask's synchronous scheduler (as a dask-cuda worker runs tasks, one at a time) with a
callback that synchronises the device after every task and adds its seconds to its
key prefix (``gravity-pm-green``, ``fft``, ...). On a GPU the particles are in chunks of
``GPU_READ_ROWS`` rows, as a store opened there. Also the whole call's wall time
(median after a warm-up) and the graph's build time, so that the prefix table and the
rest (scheduling, graph build) add up to the call.

    python -m benchmarks pm-profile-gpu --device gpu --n-side 512 --n-mesh 1024
    python -m benchmarks pm-profile-gpu --device cpu --n-side 32 --n-mesh 64
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, environment, parser, start  # noqa: E402


def task_seconds(fn, sync) -> tuple[float, dict[str, float], dict[str, int]]:
    """Run ``fn()`` with every task timed (device synchronised after each): the wall
    seconds, the seconds and the count of tasks per key prefix."""
    from dask.callbacks import Callback
    from dask.utils import key_split

    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    began: dict = {}

    def pretask(key, dsk, state):
        sync()
        began[key] = time.perf_counter()

    def posttask(key, result, dsk, state, worker_id):
        sync()
        prefix = key_split(key)
        seconds[prefix] += time.perf_counter() - began.pop(key)
        counts[prefix] += 1

    with Callback(pretask=pretask, posttask=posttask):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - t0
    return wall, dict(seconds), dict(counts)


def primitives(pos, n_mesh: int, box: float, mass: float, repeat: int) -> dict:
    """Seconds (CUDA events, median after a warm-up) of each GPU primitive of one mesh's
    force at this size, called on whole CuPy arrays outside dask: the CIC paint, the 3-d
    real FFT as the slab path runs it on one slab (axes 1-2, then axis 0) and as one
    cuFFT plan, the Green's function (the potential; one acceleration component with the
    gradient in the same pass), the inverse FFT both ways (and as one plan in its input's
    memory, the values then meaningless),
    and the CIC interpolation of three components."""
    import cupy
    import cupyx.scipy.fft
    import numpy as np

    from benchmarks.common import cuda_event_seconds
    from cosmo_dask.density.paint_kernels_gpu import paint_gpu
    from cosmo_dask.gravity.pm_kernels_gpu import cic_interpolate_gpu, green_kslab_gpu
    from cosmo_dask.spatial.fft import kslab_wavenumbers

    n = n_mesh
    out = {}
    mesh = cupy.zeros((n, n, n), dtype=np.float32)

    def t(name, fn, before=None):
        out[name] = round(cuda_event_seconds(fn, repeat, warm=1, before=before)[0], 5)

    t("paint", lambda: paint_gpu(pos, mass, n, box, "cic", dtype=np.float32, out=mesh),
      before=lambda: mesh.fill(0))
    t("rfft_two_step", lambda: cupy.fft.fft(cupy.fft.rfftn(mesh, axes=(1, 2)), axis=0))
    t("rfft_one_plan", lambda: cupy.fft.rfftn(mesh))
    fk = cupy.fft.rfftn(mesh)
    kx, ky, kz = kslab_wavenumbers((n, n, n), box, slice(0, n), cupy, np.float64)
    t("green", lambda: green_kslab_gpu(fk, kx, ky, kz, cell=box / n, rs=0.0,
                                       scale=-1.0))
    t("green_gradient", lambda: green_kslab_gpu(fk, kx, ky, kz, cell=box / n, rs=0.0,
                                                scale=-1.0, axis=0, kind="fd4"))
    t("irfft_two_step", lambda: cupy.fft.irfftn(cupy.fft.ifft(fk, axis=0), s=(n, n),
                                                axes=(1, 2)))
    t("irfft_one_plan", lambda: cupy.fft.irfftn(fk, s=(n, n, n)))
    scratch = fk.copy()
    t("irfft_one_plan_overwrite", lambda: cupyx.scipy.fft.irfftn(scratch, s=(n, n, n),
                                                                 overwrite_x=True))
    scratch = None
    fk = None
    comps = [cupy.random.random((n, n, n), dtype=np.float32) for _ in range(3)]
    t("interp3", lambda: cic_interpolate_gpu(pos, comps, box))
    comps = mesh = None
    cupy.get_default_memory_pool().free_all_blocks()
    return out


def main(argv=None):
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--n-side", type=int, default=512)
    ap.add_argument("--n-mesh", type=int, default=1024)
    ap.add_argument("--no-interlace", action="store_true")
    args = ap.parse_args(argv)
    start(args, "pm-profile-gpu")

    import dask

    from cosmo_dask.core.progress import persist
    from cosmo_dask.gravity.pm import pm_accelerations
    from cosmo_dask.models import zeldovich

    env = environment("pm-profile-gpu", args.device)
    if args.device == "gpu":
        import cupy

        sync = cupy.cuda.Device().synchronize
    else:
        def sync():
            return None
    n = args.n_side
    ics = zeldovich(n, box_size=float(n), redshift=9.0, seed=1, precision="float32")
    if args.device == "gpu":  # in the chunks a store opened on the GPU has
        from cosmo_dask.store.snapshot import GPU_READ_ROWS

        ics = ics.to_device("gpu").rechunk(GPU_READ_ROWS)
    with dask.config.set(scheduler="sync"):
        (pos,) = persist(ics.pos, show=False)
        kw = dict(G=float(ics.G), box_size=ics.box_size, n_mesh=args.n_mesh,
                  precision="float32", potential=False, interlace=not args.no_interlace)
        m = float(ics.particle_mass)

        def build():
            return pm_accelerations(pos, m, **kw)[0]

        def call():
            persist(build(), show=False)

        times = []
        for _ in range(args.repeat + 1):
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        acc = build()
        graph_s = time.perf_counter() - t0
        wall, seconds, counts = task_seconds(lambda: persist(acc, show=False), sync)
    tasks = sum(seconds.values())
    prims = {}
    if args.device == "gpu":
        import cupy

        flat = cupy.ascontiguousarray(pos.compute())
        prims = primitives(flat, args.n_mesh, float(ics.box_size), m, args.repeat)
    emit(env, n_side=n, n_particles=n**3, n_mesh=args.n_mesh, interlace=not args.no_interlace,
         seconds=round(statistics.median(times[1:]), 4), first_s=round(times[0], 4),
         graph_build_s=round(graph_s, 4), profiled_wall_s=round(wall, 4),
         tasks_s=round(tasks, 4), outside_tasks_s=round(wall - tasks, 4),
         n_tasks=sum(counts.values()), primitives_s=prims,
         by_prefix={k: [round(v, 4), counts[k]]
                    for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])})


if __name__ == "__main__":
    main()
