"""The hand-built graph paths end to end, old code against new (issue 15, "one graph idiom").

Each case builds its graph through the public call and runs it on the local threaded
scheduler (GPU: CuPy chunks, the synchronous scheduler), small sizes:

* ``direct``: direct-summation gravity, Plummer N = 8192 in 8 chunks (64 pair tasks);
* ``direct-build``: the graph only, N = 131072 in 128 chunks (16384 pair tasks):
  ``run_s`` is its conversion to one dict of task specs (what a scheduler does first;
  a graph of legacy tuples pays its conversion there, a TaskGraph at build);
* ``tree``: tree gravity over 4 domains (the shared domain decomposition), N = 30000
  (GPU: one domain);
* ``fof``: friends-of-friends labels of a 2^16-particle halo box over 8 domains;
* ``mex``: MEX fit (lmax 4) and forces at the particles and at 5000 points, N = 40000;
* ``pse-gather``, ``pse-reduce``: PSE deposit of a 24^3 Zel'dovich box, then
  ``to_uniform(24)`` and ``sample`` at 5000 points;
* ``gadget``: read pos, vel and ids of a 2^21-particle Gadget HDF5 file (CPU only);
* ``dupids``: the duplicate-id check of 2^20 ids in 16 chunks.

One JSON line per (case, code): ``build_s`` (median time of the public call that
builds the graph, with any eager step it runs), ``run_s`` (median time of computing
the result), ``tasks_run`` (tasks the local scheduler ran for build + run, counted by
a ``dask.callbacks.Callback``; GPU: the same count) and ``code`` (the tree whose
``cosmo_dask`` ran). With ``--base DIR`` (a checkout of the old code) every case runs
in fresh processes alternating between DIR and this tree, ``--rounds`` times, so the
ratio holds on a noisy machine; the summary lines give medians over the rounds and
``new / base``.

    python -m benchmarks graph-paths [--device cpu|gpu] [--cases direct,mex]
        [--repeat 3] [--rounds 3] [--base /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import ROOT, emit, parser, start  # noqa: E402

CASES = ("direct", "direct-build", "tree", "fof", "mex", "pse-gather", "pse-reduce",
         "gadget", "dupids")


def _case(name: str, gpu: bool):
    """(build, run): ``build()`` makes the lazy result, ``run(result)`` computes it."""
    import dask
    import numpy as np

    import cosmo_dask.models as models
    from cosmo_dask import Snapshot

    def ready(snap):
        return (snap.to_device("gpu") if gpu else snap).persist()

    if name in ("direct", "direct-build"):
        from cosmo_dask.gravity import accelerations

        n, rows = (8192, 1024) if name == "direct" else (131072, 1024)
        s = ready(models.plummer(n, chunks=rows))
        if name == "direct-build":  # what any scheduler does first: one dict of task specs
            from dask._task_spec import convert_legacy_graph
            from dask.highlevelgraph import HighLevelGraph

            def run(r):
                return convert_legacy_graph(dict(HighLevelGraph.merge(
                    *[a.__dask_graph__() for a in r])))
        else:
            def run(r):
                return dask.compute(*r)
        return lambda: accelerations(s, method="direct", G=1.0, softening=0.01), run
    if name == "tree":
        from cosmo_dask.gravity.tree.graph import tree_accelerations

        s = ready(models.plummer(30000, chunks=5000))
        mass = s.mass if s.mass is not None else s.particle_mass
        return (lambda: tree_accelerations(s.pos, mass, G=1.0, softening=0.01,
                                           n_domains=1 if gpu else 4),
                lambda r: dask.compute(*r))
    if name == "fof":
        from cosmo_dask.halos import fof_labels

        s = ready(models.halo_blobs(2**16, box_size=50.0, chunks=2**13))
        return lambda: fof_labels(s, 0.2, n_domains=8), lambda r: r.labels.compute()
    if name == "mex":
        from cosmo_dask.expansion import MEX

        s = ready(models.hernquist(40000, chunks=10000))
        return (lambda: MEX(4, center=(0.0, 0.0, 0.0)).fit(s),
                lambda r: (r.accelerations().compute(), r.potential(s.pos[:5000]).compute()))
    if name.startswith("pse-"):
        from cosmo_dask.density import pse_density

        s = ready(models.zeldovich(24, box_size=50.0, redshift=0.0, chunks=4096))
        points = np.random.default_rng(0).random((5000, 3)) * 50.0
        return (lambda: pse_density(s, patch_size=8, block=4, strategy=name[4:]),
                lambda r: (r.patches.compute(), r.to_uniform(24).compute(), r.sample(points)))
    if name == "gadget":
        if gpu:
            return None
        import h5py

        from cosmo_dask.io import from_gadget_hdf5

        n = 2**21
        rng = np.random.default_rng(0)
        path = os.path.join(tempfile.mkdtemp(), "snap.hdf5")
        with h5py.File(path, "w") as f:
            h = f.create_group("Header").attrs
            for key, value in {"NumPart_ThisFile": [0, n, 0, 0, 0, 0],
                               "NumPart_Total": [0, n, 0, 0, 0, 0],
                               "NumPart_Total_HighWord": [0] * 6,
                               "MassTable": [0.0, 1.0, 0, 0, 0, 0], "NumFilesPerSnapshot": 1,
                               "BoxSize": 100.0, "Time": 1.0, "Redshift": 0.0,
                               "Omega0": 0.3, "OmegaLambda": 0.7, "HubbleParam": 0.7}.items():
                h[key] = value
            p = f.create_group("PartType1")
            p["Coordinates"] = (rng.random((n, 3)) * 100.0).astype(np.float32)
            p["Velocities"] = rng.normal(size=(n, 3)).astype(np.float32)
            p["ParticleIDs"] = np.arange(n, dtype=np.uint64)
        return (lambda: from_gadget_hdf5(path, chunks=2**17),
                lambda r: dask.compute(r.pos, r.vel, r.ids))
    if name == "dupids":
        from cosmo_dask.store.validation import duplicate_ids

        n = 2**20
        s = ready(Snapshot.from_arrays(np.random.default_rng(0).random((n, 3)),
                                       ids=np.arange(n), box_size=1.0, chunks=n // 16))
        return lambda: s.ids, duplicate_ids
    raise SystemExit(f"unknown case {name!r}")


def run_case(name: str, gpu: bool, repeat: int) -> dict | None:
    """Time one case in this process (after one warm-up: kernel compilation)."""
    import dask
    from dask.callbacks import Callback

    class Count(Callback):
        def __init__(self):
            super().__init__()
            self.n = 0

        def _pretask(self, key, dsk, state):
            self.n += 1

    case = _case(name, gpu)
    if case is None:
        return None
    build, run = case

    def sync():
        if gpu:
            import cupy

            cupy.cuda.Device().synchronize()

    with dask.config.set(scheduler="sync" if gpu else "threads"):
        r = build()
        if run:
            run(r)
        builds, runs = [], []
        for _ in range(repeat):
            count = Count()
            with count:
                t0 = time.perf_counter()
                r = build()
                t1 = time.perf_counter()
                if run:
                    run(r)
                    sync()
                t2 = time.perf_counter()
            builds.append(t1 - t0)
            runs.append(t2 - t1)
    import cosmo_dask

    return {"case": name, "device": "gpu" if gpu else "cpu",
            "code": str(Path(cosmo_dask.__file__).resolve().parents[1]),
            "build_s": round(statistics.median(builds), 4),
            "run_s": round(statistics.median(runs), 4), "tasks_run": count.n,
            "repeat": repeat}


def main(argv=None) -> None:
    ap = parser(__doc__, repeat=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", default=None, help="a checkout of the old code to compare")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one case here
    args = ap.parse_args(argv)
    start(args, "graph-paths")
    if args.one:
        row = run_case(args.one, args.device == "gpu", args.repeat)
        if row:
            emit(row, save=False)  # the parent process saves the rows
        return
    trees = ([("base", Path(args.base).resolve())] if args.base else []) + \
        [("new", ROOT)]
    rows: dict = {}
    for rnd in range(args.rounds):
        for name in args.cases.split(","):
            order = trees if rnd % 2 == 0 else trees[::-1]  # alternate who goes first
            for label, tree in order:
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    [str(tree)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p and Path(p).resolve() != ROOT]))
                out = subprocess.run([sys.executable, __file__, "--one", name, "--device",
                                      args.device, "--repeat", str(args.repeat)], env=env,
                                     cwd=tree, capture_output=True, text=True)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
                if out.returncode or not lines:
                    emit({"case": name, "code": label, "error":
                                      out.stderr.strip().splitlines()[-1:]})
                    continue
                row = dict(json.loads(lines[-1]), code=label, round=rnd)
                emit(row)
                rows.setdefault((name, label), []).append(row)
    for name in args.cases.split(","):
        summary = {"case": name, "device": args.device, "summary": True}
        for label, _ in trees:
            got = rows.get((name, label), [])
            if got:
                for what in ("build_s", "run_s"):
                    summary[f"{label}_{what}"] = round(statistics.median(r[what] for r in got), 4)
                summary[f"{label}_tasks_run"] = got[-1]["tasks_run"]
        if args.base and "base_run_s" in summary and "new_run_s" in summary:
            for what in ("build_s", "run_s"):
                if summary[f"base_{what}"] > 0:
                    summary[f"new_over_base_{what}"] = round(
                        summary[f"new_{what}"] / summary[f"base_{what}"], 3)
        emit(summary)


if __name__ == "__main__":
    main()
