"""What a lost worker costs: tree gravity (float64, 40k clustered particles) on a
2-process LocalCluster: the first run (kernels loaded from numba's on-disk cache,
``cache=True``), a warm run, then one worker killed (SIGKILL) and the same run on the
cluster its nanny restored (the new worker loads the cached kernels). The second line
repeats this with an empty ``NUMBA_CACHE_DIR``, so its first run is a cold compile on
both workers: what every restart would pay without the cache. One JSON line each.

    python -m benchmarks worker-restart
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))


def measure(cache_dir: str | None) -> dict:
    from distributed import Client, LocalCluster
    from test_worker_loss import tree_run

    env = {} if cache_dir is None else {"NUMBA_CACHE_DIR": cache_dir}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", env=env) as cluster, Client(cluster) as client:
        t0 = time.perf_counter()
        tree_run()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        tree_run()
        warm = time.perf_counter() - t0
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        os.kill(pids[victim], signal.SIGKILL)
        t0 = time.perf_counter()
        while True:  # the victim gone from the scheduler and a new worker registered
            workers = client.scheduler_info()["workers"]
            if victim not in workers and len(workers) == 2:
                break
            time.sleep(0.05)
        back = time.perf_counter() - t0
        t0 = time.perf_counter()
        tree_run()
        after = time.perf_counter() - t0
    return {"bench": "worker_restart", "numba_cache": "shipped" if cache_dir is None
            else "empty", "first_run_s": round(first, 2), "warm_run_s": round(warm, 2),
            "worker_back_s": round(back, 2), "run_after_restart_s": round(after, 2)}


def main(argv=None):
    start(parser(__doc__, devices=("cpu",)).parse_args(argv), "worker-restart")
    emit(measure(None))
    with tempfile.TemporaryDirectory() as empty:
        emit(measure(empty))


if __name__ == "__main__":
    main()
