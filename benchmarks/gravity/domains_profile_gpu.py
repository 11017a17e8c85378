"""Where the time of several domains on one GPU goes (issue 20: the per-domain graph).

``--what tree`` (default): on one GPU, the TreePM short range (the truncated tree of
``treepm_accelerations``, float32, theta 0.5) of a Zel'dovich box at z = 0
(``--n-side``^3 particles, 1 Mpc/h spacing) with 1, 4 and 8 domains: the wall time
(threaded scheduler, device synchronised; median of ``--repeat`` after a warm-up),
then one run on the synchronous scheduler with the device synchronised after every
task, giving seconds per task kind (``gravity-tree``, ``gravity-let``,
``gravity-group``, the domain scatter, ...) and, inside ``gravity-group``, the
own-tree walk against the LET walks (CUDA events around each ``walk_forces`` call),
with the LETs' sizes.

``--what fof``: the FOF catalog of bench_scaling (``fof(snap, 0.2, min_members=20,
centers=("mbp", "mcp"))``) of the same box with 1, 4 and 8 FOF domains: the wall time
and the seconds per task kind, as above; the halo counts are checked equal.

    python -m benchmarks domains-profile-gpu [--what tree|fof] [--n-side 256] [--domains 1 4 8]

Prints JSON lines; on the GPU host: `WORKLOADS=... benchmarks/device.sh`.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import dask
import numpy as np
from dask.callbacks import Callback

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, gpu_seconds, parser, start  # noqa: E402


class TaskTimes(Callback):
    """Seconds per task-key prefix, the device synchronised after each task."""

    def __init__(self, cupy):
        super().__init__()
        self.cupy, self.start, self.total = cupy, {}, defaultdict(float)
        self.count = defaultdict(int)

    def _pretask(self, key, dsk, state):
        self.start[key] = time.perf_counter()

    def _posttask(self, key, result, dsk, state, worker_id):
        self.cupy.cuda.Device().synchronize()
        name = key[0] if isinstance(key, tuple) else key
        prefix = str(name).rsplit("-", 1)[0]
        self.total[prefix] += time.perf_counter() - self.start.pop(key)
        self.count[prefix] += 1


def main(argv=None):
    ap = parser(__doc__, repeat=3, devices=("gpu",))
    ap.add_argument("--n-side", type=int, default=256)
    ap.add_argument("--domains", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--what", choices=("tree", "fof"), default="tree")
    args = ap.parse_args(argv)
    start(args, "domains-profile-gpu")
    import cupy

    import cosmo_dask.gravity.tree.let_gpu as tlg
    from cosmo_dask.gravity.dispatch import domain_let
    from cosmo_dask.gravity.parameters import (
        R_SPLIT_CELLS,
        TREEPM_MAX_GROUP,
        TREEPM_MAX_LEAF,
        default_r_cut,
    )
    from cosmo_dask.gravity.tree.graph import tree_accelerations
    from cosmo_dask.models import zeldovich

    n = args.n_side
    box = float(n)
    snap = zeldovich(n, box_size=box, redshift=0.0, seed=1, precision="float32",
                     device="gpu").persist()
    rs = R_SPLIT_CELLS * box / n  # treepm_accelerations' default with n_mesh = n_side
    opts = dict(G=float(snap.G), theta=0.5, precision="float32", potential=False,
                box_size=box, rs=rs, r_cut=default_r_cut(rs), max_leaf=TREEPM_MAX_LEAF,
                max_group=TREEPM_MAX_GROUP)
    mass = float(snap.particle_mass)
    env = {"n": n**3, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "date": time.strftime("%Y-%m-%d"), "rs": rs, "r_cut": default_r_cut(rs)}
    if args.what == "fof":
        return _profile_fof(cupy, snap, args, env)

    # CUDA events around every walk_forces call of domain_forces_gpu: own tree vs LETs
    walks = []
    original = tlg.walk_forces

    def timed_walk(*a, **k):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record()
        out = original(*a, **k)
        e1.record()
        e1.synchronize()
        walks.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
        return out

    lets = []
    original_let = domain_let.gpu_implementation()

    def sized_let(*a, **k):
        out = original_let(*a, **k)
        lets.append(None if out is None else (int(out.lo.shape[0]), int(out.pos.shape[0])))
        return out

    reference = None
    for nd in args.domains:
        def run(nd=nd):
            acc, _ = tree_accelerations(snap.pos, mass, n_domains=nd, **opts)
            return acc.compute()

        _, times, acc = gpu_seconds(run, args.repeat)
        acc = cupy.asnumpy(acc).astype(np.float64)
        if reference is None:
            reference = acc
        scale = np.sqrt(np.mean(reference**2))
        diff = np.abs(acc - reference).max(axis=1) / scale
        cb = TaskTimes(cupy)
        walks.clear()
        lets.clear()
        tlg.walk_forces = timed_walk  # looked up by domain_forces_gpu at each call
        domain_let.register(cupy.ndarray, sized_let)  # the LET contract's GPU kernel
        try:
            with cb, dask.config.set(scheduler="sync"):
                run()
        finally:
            tlg.walk_forces = original
            domain_let.register(cupy.ndarray, original_let)
        tasks = sorted(cb.total.items(), key=lambda kv: -kv[1])
        emit({
            "what": "tree", "domains": nd, "seconds": float(np.median(times)), "all": times,
            "tasks_total_s": round(sum(cb.total.values()), 4),
            "p99_rel_diff_vs_first": float(np.quantile(diff, 0.99)),
            "tasks_s": {k: [round(v, 4), cb.count[k]] for k, v in tasks[:14]},
            "walk_calls": len(walks), "walk_s_total": round(sum(walks), 4),
            "walk_s_first_per_domain": [round(w, 4) for w in walks[: nd * 8]],
            "let_nodes_particles": lets[:64], **env})


def _profile_fof(cupy, snap, args, env):
    from cosmo_dask.halos import fof

    reference = None
    for nd in args.domains:
        def run(nd=nd):
            cat = fof(snap, 0.2, min_members=20, centers=("mbp", "mcp"), n_domains=nd).catalog
            return np.sort(cupy.asnumpy(cat["n_members"].values))

        _, times, members = gpu_seconds(run, args.repeat)
        if reference is None:
            reference = members
        cb = TaskTimes(cupy)
        with cb, dask.config.set(scheduler="sync"):
            run()
        tasks = sorted(cb.total.items(), key=lambda kv: -kv[1])
        emit({
            "what": "fof", "domains": nd, "seconds": float(np.median(times)), "all": times,
            "n_halos": int(members.size), "same_members_as_first": bool(
                members.size == reference.size and (members == reference).all()),
            "tasks_s": {k: [round(v, 4), cb.count[k]] for k, v in tasks[:16]},
            "tasks_total_s": round(sum(cb.total.values()), 4), **env})


if __name__ == "__main__":
    main()
