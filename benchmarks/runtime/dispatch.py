"""What the kernel contracts cost: a contract call against a direct call of its kernel.

The only run-time change of the gravity and spatial kernel contracts
(:mod:`cosmo_dask.gravity.dispatch`, :mod:`cosmo_dask.spatial.dispatch`) is one lookup of
the chunk's type per kernel call. For each contract this times ``contract(chunk, ...)`` and
``implementation(chunk, ...)`` on the same small chunk (so that the lookup is not lost in
the kernel's own time), alternating, and prints one JSON line per contract: the medians,
their ratio and the mean time of the lookup alone (seconds). ``--device gpu`` uses CuPy
chunks (the GPU kernels, the device synchronised after every call). Then the tree graph
(every tree task through a contract) is timed on 1 and 4 domains; ``--graph-only`` times
only that, so that the same line can be had from the code before the contracts (run with
that code first on ``PYTHONPATH``).

    python -m benchmarks dispatch [--device cpu|gpu] [--repeat 2001] [--graph-only]

On a CPU set NUMBA_NUM_THREADS=1: parallel numba kernels on tiny chunks otherwise time
the wake-up of their thread pool, not the call.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def _pair_medians(a, b, repeat: int, sync) -> tuple[float, float]:
    """Medians of ``repeat`` calls each of ``a`` and ``b`` (after a warm-up), in the order
    a b, b a, a b, ... so that neither always runs first."""
    for _ in range(5):
        a()
        b()
    sync()
    times: dict = {a: [], b: []}
    for i in range(repeat):
        for f in ((a, b) if i % 2 == 0 else (b, a)):
            t = time.perf_counter()
            f()
            sync()
            times[f].append(time.perf_counter() - t)
    return statistics.median(times[a]), statistics.median(times[b])


def _lookup_seconds(contract, chunk, repeat: int = 100_000) -> float:
    """Mean seconds of one lookup of the chunk's kernel (what a contract call adds)."""
    t = time.perf_counter()
    for _ in range(repeat):
        contract.dispatch(type(chunk))
    return (time.perf_counter() - t) / repeat


def cases(xp):
    """``(name, contract, args, kwargs)`` with small chunks of module ``xp``."""
    from cosmo_dask.gravity import dispatch as g
    from cosmo_dask.spatial import dispatch as s
    from cosmo_dask.spatial.fft import kslab_wavenumbers

    rng = np.random.default_rng(0)
    pos = xp.asarray(rng.random((64, 3)))
    mass = xp.asarray(rng.random(64))
    meshes = xp.asarray(rng.random((4, 8, 8, 8)))
    fk = xp.asarray(rng.random((8, 8, 5)) + 0j)
    k = kslab_wavenumbers((8, 8, 8), 1.0, slice(0, 8), xp=xp)
    return [
        ("p2p_block", g.p2p_block, (pos, pos, mass), {"exclude": "index"}),
        ("green_kslab", g.green_kslab, (fk, *k), {"cell": 0.125, "rs": 0.15, "scale": -1.0}),
        ("cic_interpolate", g.cic_interpolate, (pos, meshes, 1.0, 0.0), {}),
        ("tree_forces", g.tree_forces, (pos, mass), {"theta": 0.5}),
        ("morton_keys", s.morton_keys, (pos, np.zeros(3), 1.0), {}),
    ]


def main(argv=None) -> None:
    ap = parser(__doc__, repeat=2001)
    ap.add_argument("--graph-only", action="store_true")
    ap.add_argument("--n", type=int, default=None,
                    help="tree graph particles (default 2^20 on a GPU, 2^16 on a CPU)")
    args = ap.parse_args(argv)
    start(args, "dispatch")
    env = {"bench": "dispatch", "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    if args.device == "gpu":
        import cupy as xp

        env["device"] = xp.cuda.runtime.getDeviceProperties(0)["name"].decode()

        def sync():
            xp.cuda.Device().synchronize()
    else:
        xp = np
        env["device"] = "cpu"

        def sync():
            pass
    import cosmo_dask

    env["cosmo_dask"] = os.path.dirname(cosmo_dask.__file__)
    for name, contract, a, kw in ([] if args.graph_only else cases(xp)):
        impl = contract.dispatch(type(a[0]))
        t_contract, t_direct = _pair_medians(lambda c=contract, a=a, kw=kw: c(*a, **kw),
                                             lambda f=impl, a=a, kw=kw: f(*a, **kw),
                                             args.repeat, sync)
        emit(env, workload=f"contract_{name}", chunk_rows=int(a[0].shape[0]),
             contract_s=t_contract, direct_s=t_direct, ratio=t_contract / t_direct,
             lookup_s=_lookup_seconds(contract, a[0]))
    n = args.n or (1 << 20 if args.device == "gpu" else 1 << 16)
    _tree_graph(env, xp, n, sync)


def _tree_graph(env, xp, n: int, sync) -> None:
    """The tree graph on ``xp`` chunks, 1 and 4 domains (synchronous scheduler)."""
    import dask
    import dask.array as da

    from cosmo_dask.gravity.tree.graph import tree_accelerations

    rng = np.random.default_rng(1)
    pos = da.from_array(xp.asarray(rng.random((n, 3))), chunks=(n // 4, 3), asarray=False)
    for nd in (1, 4):
        def run(nd=nd):
            with dask.config.set(scheduler="synchronous"):
                return tree_accelerations(pos, 1.0 / n, G=1.0, theta=0.5, n_domains=nd,
                                          precision="float32", potential=False)[0].compute()

        run()
        times = []
        for _ in range(5):
            sync()
            t = time.perf_counter()
            run()
            sync()
            times.append(time.perf_counter() - t)
        emit(env, workload="tree_graph", n=n, n_domains=nd,
             seconds=statistics.median(times), all=[round(v, 4) for v in times])


if __name__ == "__main__":
    main()
