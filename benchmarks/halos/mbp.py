"""Exact most-bound particles (MBP) of large halos: octree bounds before and after.

Usage::

    python -m benchmarks mbp [--n 1048576] [--repeat 3] [--top 5]

The snapshot is the strongly clustered set of issue 30: ``--n`` particles, 20 % uniform,
the rest in ``--spheres`` Plummer spheres with Pareto sizes (index 1.1, the sizes are the
distribution's quantiles, so the set does not depend on the seed's luck), scale radius
``0.02 m^(1/3)`` mean spacings (central densities of about 3e4 mean densities: each sphere
is one FOF halo at b = 0.2 out to a few scale radii), truncated at about 10 scale radii.

Two kinds of line go to stdout and to ``benchmarks/results/mbp.jsonl``:

* ``mbp-halo``: one of the ``--top`` largest FOF halos; seconds (median of ``--repeat``
  warm runs, wall and process CPU) of :func:`segment_mbp` now and with the pruning of
  before (one walk per member with opening angles 0.5, 0.3, 0.2; leaves of 32; tree
  bounds from 3000 members), of
  :func:`grid_mbp`, and the candidates left for exact evaluation; rows must agree.
* ``mbp-batch``: every FOF halo of 20 members or more in one :func:`segment_mbp` call
  (one forest for the tree-sized halos, float32 prefilter for the others), by size
  class (below 2000 members, 2000-20000, above) and all at once: seconds (median of
  ``--repeat`` warm runs, wall and process CPU), and the same call with the pruning of
  before; rows and potentials must agree.
* ``mbp-catalog``: the catalog's MBP stage (``fof(..., centers=("mbp",))``), the summed
  task seconds of its ``halo-mbp-*`` tasks and the wall seconds of the call, now and
  before, with every halo exact (``grid_threshold=None``, the default now) and with
  the grid approximation above 20,000 members (``grid_threshold=20000``, the default
  before).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

#: the pruning of before (commit a6583bb): no group round, one walk per member, no
#: hand-over to direct sums
BEFORE = {"_TREE_MIN": 3000, "_TREE_LEAF": 32, "_TREE_GROUP": 64, "_GROUP_THETAS": (),
          "_TREE_THETAS": (0.5, 0.3, 0.2), "_DIRECT_BELOW": ()}


def clustered(n: int, n_spheres: int, seed: int = 1, background: float = 0.2):
    """``(pos float64 (n, 3), box)``: the issue's strongly clustered set (module doc)."""
    rng = np.random.default_rng(seed)
    box = n ** (1 / 3)  # mean spacing 1
    n_bg = int(background * n)
    q = (np.arange(n_spheres) + 0.5) / n_spheres
    w = (1.0 - q) ** (-1 / 1.1)  # Pareto quantiles, index 1.1
    sizes = np.floor(w / w.sum() * (n - n_bg)).astype(np.int64)
    sizes[-1] += n - n_bg - sizes.sum()
    pos = [rng.random((n_bg, 3)) * box]
    for s in sizes:
        a = 0.02 * s ** (1 / 3)
        u = rng.uniform(0.0, 0.985, s)
        r = a / np.sqrt(u ** (-2 / 3) - 1)
        v = rng.normal(size=(s, 3))
        pos.append(rng.random(3) * box + v * (r / np.linalg.norm(v, axis=1))[:, None])
    return np.mod(np.concatenate(pos), box), box


class _Constants:
    """Set module constants of center_kernels for a block, then restore them."""

    def __init__(self, values):
        import cosmo_dask.halos.center_kernels as ck

        self.ck, self.values, self.saved = ck, values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = getattr(self.ck, k)
            setattr(self.ck, k, v)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(self.ck, k, v)


def _median(fn, repeat):
    fn()  # warm
    wall, cpu, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(wall)), float(np.median(cpu)), out


def bench_halos(pos, box, labels, n_members, top, repeat, soft, emit):
    import cosmo_dask.halos.center_kernels as ck

    count = {}
    orig = ck._mbp_candidates

    def counting(*a):
        rows = orig(*a)
        count["n"] = rows.shape[0]
        return rows

    ck._mbp_candidates = counting
    try:
        for h in range(min(top, len(n_members))):
            mem = np.flatnonzero(labels == h)
            x, m = pos[mem], np.ones(mem.size)
            starts = np.array([0, mem.size], dtype=np.int64)

            def exact(x=x, m=m, starts=starts):
                return ck.segment_mbp(x, m, starts, box_size=box, softening=soft)

            now_w, now_c, (rows_now, pot_now) = _median(exact, repeat)
            cand_now = count.get("n")
            with _Constants(BEFORE):
                old_w, old_c, (rows_old, pot_old) = _median(exact, repeat)
                cand_old = count.get("n")
            grid_w, grid_c, g = _median(
                lambda x=x, m=m: ck.grid_mbp(x, m, box_size=box, softening=soft), repeat)
            emit({"workload": "mbp-halo", "rank": h, "members": int(mem.size),
                  "now_seconds": now_w, "now_cpu_seconds": now_c,
                  "before_seconds": old_w, "before_cpu_seconds": old_c,
                  "speedup_cpu": old_c / now_c, "grid_seconds": grid_w,
                  "grid_cpu_seconds": grid_c, "candidates_now": cand_now,
                  "candidates_before": cand_old,
                  "same_rows": bool(rows_now[0] == rows_old[0]
                                    and pot_now[0] == pot_old[0]),
                  "grid_same_row": bool(g == rows_now[0])})
    finally:
        ck._mbp_candidates = orig


def bench_batch(pos, box, labels, repeat, soft, emit):
    import cosmo_dask.halos.center_kernels as ck

    lab = labels[labels >= 0]
    order = np.argsort(lab, kind="stable")
    sizes_all = np.bincount(lab)
    keep_h = np.flatnonzero(sizes_all >= 20)
    rows_all = np.flatnonzero(labels >= 0)[order]
    starts_all = np.concatenate(([0], np.cumsum(sizes_all)))
    for name, lo, hi in (("<2000", 20, 2000), ("2000-20000", 2000, 20000),
                         (">=20000", 20000, None), ("all", 20, None)):
        sel = keep_h[(sizes_all[keep_h] >= lo) & (sizes_all[keep_h] < (hi or np.inf))]
        if sel.size == 0:
            continue
        rows = np.concatenate([rows_all[starts_all[h]:starts_all[h + 1]] for h in sel])
        starts = np.concatenate(([0], np.cumsum(sizes_all[sel]))).astype(np.int64)
        x = pos[rows]

        def call(x=x, starts=starts):
            return ck.segment_mbp(x, 1.0, starts, box_size=box, softening=soft)

        now_w, now_c, (r_now, p_now) = _median(call, repeat)
        with _Constants(BEFORE):
            old_w, old_c, (r_old, p_old) = _median(call, repeat)
        emit({"workload": "mbp-batch", "sizes": name, "halos": int(sel.size),
              "members": int(rows.size), "now_seconds": now_w, "now_cpu_seconds": now_c,
              "before_pruning_seconds": old_w, "before_pruning_cpu_seconds": old_c,
              "same_rows": bool(np.array_equal(r_now, r_old)
                                and np.array_equal(p_now, p_old))})


def bench_catalog(snap, repeat, emit):
    from dask.callbacks import Callback
    from dask.utils import key_split

    from cosmo_dask.halos import fof

    class TaskTimes(Callback):
        def __init__(self):
            super().__init__()
            self.start, self.total = {}, 0.0

        def _pretask(self, key, dsk, state):
            self.start[key] = time.perf_counter()

        def _posttask(self, key, result, dsk, state, worker_id):
            t = time.perf_counter() - self.start.pop(key)
            if key_split(key).startswith("halo-mbp"):
                self.total += t

    for mode, thr in (("exact", None), ("grid", 20000)):
        kw = {"grid_threshold": thr}
        row = {"workload": "mbp-catalog", "mode": mode, "grid_threshold": thr}
        for when, consts in (("now", {}), ("before", BEFORE)):
            with _Constants(consts):
                fof(snap, 0.2, centers=("mbp",), **kw)  # warm
                walls, tasks = [], []
                for _ in range(repeat):
                    tt = TaskTimes()
                    t0 = time.perf_counter()
                    with tt:
                        res = fof(snap, 0.2, centers=("mbp",), **kw)
                    walls.append(time.perf_counter() - t0)
                    tasks.append(tt.total)
            row[f"{when}_mbp_task_seconds"] = float(np.median(tasks))
            row[f"{when}_fof_seconds"] = float(np.median(walls))
            row[f"{when}_mbp_index_head"] = [int(i) for i in res.catalog["mbp_index"][:5]]
        row["same_mbp"] = row["now_mbp_index_head"] == row["before_mbp_index_head"]
        emit(row)


def main(argv=None):
    ap = parser(__doc__, repeat=3, devices=("cpu",))
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--spheres", type=int, default=300)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--no-catalog", action="store_true")
    args = ap.parse_args(argv)
    start(args, "mbp")

    from cosmo_dask import Snapshot
    from cosmo_dask.halos import fof

    env = {"host": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
           "n_particles": args.n, "spheres": args.spheres}

    def record(row):
        emit(row, **env)

    pos, box = clustered(args.n, args.spheres)
    snap = Snapshot.from_arrays(pos, box_size=box, ids=np.arange(args.n, dtype=np.int64))
    res = fof(snap, 0.2, centers=())
    labels = np.asarray(res.labels.compute())
    nm = np.asarray(res.catalog["n_members"])
    soft = 0.1 * 0.2  # the catalog's default: 0.1 linking lengths (mean spacing 1)
    record({"workload": "mbp-set", "n_halos": int(res.n_halos),
          "largest": [int(k) for k in nm[:args.top]]})
    bench_halos(pos, box, labels, nm, args.top, args.repeat, soft, record)
    bench_batch(pos, box, labels, args.repeat, soft, record)
    if not args.no_catalog:
        bench_catalog(snap, args.repeat, record)


if __name__ == "__main__":
    main()
