"""A simulation's particles kept by domain between steps, against the ICs' row order.

``simulation.run`` on a cluster of ``--workers`` workers (single-threaded CPU workers, or
one per GPU with ``--device gpu``) can keep its state in the force's domain order, each
domain's rows on one worker, so that a step's exchange moves only the particles that
crossed a domain face (:meth:`cosmo_dask.spatial.layout.DomainLayout.by_domain`). This
runs the same steps with that on and off (``runner.KEEP_BY_DOMAIN``), alternated, from
the same 2LPT ICs (``--n-side``^3 particles, box ``--n-side`` Mpc/h, z = 9 to 8 in
``--steps`` steps, float32, ``--chunks-per-worker`` row chunks per worker), and reports
per mode: the median step seconds after the first, the bytes the workers received from
each other per step (their transfer logs, the initial force included, divided by the
steps + 1; also by task kind of the keys moved, in the last run), and the largest
difference of the final positions (by id) between the two modes.

On CPU workers a box under 2^21 particles has one domain (the tree's default), so
``--domain-particles`` lowers ``gravity.tree.graph.DOMAIN_PARTICLES`` to get several.

    python -m benchmarks simulation-domains --workers 4 --n-side 64 --domain-particles 32768
    python -m benchmarks simulation-domains --device gpu --workers 4 --n-side 512

One JSON line per (method, mode), appended to ``<--out>/simulation_domains.jsonl``.
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
from benchmarks.runtime.scaling import LOG_LENGTH, _bytes_received, displacements  # noqa: E402


def _received_by_kind(client) -> dict:
    """Bytes all workers have received so far, by task kind of the keys moved."""
    from dask.utils import key_split

    def by_kind(dask_worker):
        out: dict = {}
        for entry in dask_worker.transfer_incoming_log:
            for key, size in entry.get("keys", {}).items():
                out[key_split(key)] = out.get(key_split(key), 0) + int(size)
        return out

    total: dict = {}
    for part in client.run(by_kind).values():
        for kind, size in part.items():
            total[kind] = total.get(kind, 0) + size
    return total


def main(argv=None):
    ap = parser(__doc__, repeat=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--n-side", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--method", nargs="+", choices=("pm", "treepm"), default=["treepm", "pm"])
    ap.add_argument("--chunks-per-worker", type=int, default=2,
                    help="row chunks of the ICs per worker")
    ap.add_argument("--domain-particles", type=int, default=None,
                    help="CPU: particles per tree domain (default: the tree's)")
    args = ap.parse_args(argv)
    start(args, "simulation_domains")
    os.environ["DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH"] = str(LOG_LENGTH)

    import cosmo_dask
    import cosmo_dask.gravity.tree.graph as tree_graph
    import cosmo_dask.simulation.runner as runner
    from cosmo_dask.models import lpt_ics
    from cosmo_dask.simulation import run

    gpu = args.device == "gpu"
    if args.domain_particles:
        tree_graph.DOMAIN_PARTICLES = int(args.domain_particles)
    n = args.n_side
    env = {"date": time.strftime("%Y-%m-%d"), "workers": args.workers, "n_side": n,
           "steps": args.steps, "host_cpus": os.cpu_count(),
           "domain_particles": tree_graph.DOMAIN_PARTICLES}
    kw = {} if gpu else {"threads_per_worker": 1, "processes": True}
    with cosmo_dask.connect(gpu=gpu, n_workers=args.workers, quiet=True,
                            dashboard_address=":0", **kw) as client:
        ics = lpt_ics(n, box_size=float(n), redshift=9.0, seed=1, precision="float32")
        ics = ics.rechunk(-(-ics.n_particles // (args.chunks_per_worker * args.workers)))
        ics = ics.persist()
        if gpu:
            ics = ics.to_device("gpu").persist()
        for method in args.method:
            rows = {True: [], False: []}
            final = {}
            for i in range(args.repeat + 1):  # the first round warms the kernels
                for keep in (False, True):
                    runner.KEEP_BY_DOMAIN = keep
                    before, kinds = _bytes_received(client), _received_by_kind(client)
                    res = run(ics, z_final=8.0, n_steps=args.steps, method=method, steps="a",
                              n_mesh=n if method == "treepm" else 2 * n, precision="float32")
                    moved = _bytes_received(client) - before
                    kinds = {k: v - kinds.get(k, 0) for k, v in _received_by_kind(client).items()
                             if v - kinds.get(k, 0) >= 100_000}
                    if i == 0:
                        final[keep] = displacements(ics, res.snapshot)
                        continue
                    rows[keep].append((statistics.median(r["seconds"] for r in res.log[1:]),
                                       moved / (args.steps + 1), len(res.snapshot.chunks),
                                       kinds))
            diff = float(np.abs(final[True] - final[False]).max())
            for keep in (False, True):
                emit(env, workload=f"{method}_step", mode="by_domain" if keep else "ics_order",
                     seconds=round(statistics.median(r[0] for r in rows[keep]), 4),
                     bytes_per_step=int(statistics.median(r[1] for r in rows[keep])),
                     state_chunks=rows[keep][-1][2], max_position_difference=diff,
                     mb_by_kind_per_step={k: round(v / (args.steps + 1) / 1e6, 2) for k, v in
                                          sorted(rows[keep][-1][3].items(),
                                                 key=lambda kv: -kv[1])},
                     device="gpu" if gpu else "cpu", file="simulation_domains")


if __name__ == "__main__":
    main()
