"""TaskGraph: hand-built tasks run with their dependencies, and their placement reaches
the distributed scheduler (dask arrays alone drop layer annotations)."""

from __future__ import annotations

import dask
import numpy as np

from cosmo_dask.task_graph import TaskGraph


def _inputs():
    return [dask.delayed(np.arange, pure=True)(3 * i, 3 * i + 3, dask_key_name=f"in-{i}")
            for i in range(4)]


def test_tasks_compute_from_their_inputs_locally():
    ins = _inputs()
    g = TaskGraph(ins)
    for i in range(4):
        g.add(("out", i), np.multiply, g.ref(ins[i]), 2.0)
    g.add("total", np.add, g.ref(("out", 0)), g.ref(("out", 3)))
    with dask.config.set(scheduler="synchronous"):
        arr = g.persist_array("out", ((3,) * 4,), np.empty(0), np.float64)
        np.testing.assert_array_equal(arr.compute(), 2.0 * np.arange(12))
        assert list(g.delayed("total").compute()) == [18.0, 22.0, 26.0]


def test_worker_placement_reaches_the_scheduler(client):
    workers = sorted(client.scheduler_info()["workers"])
    ins = _inputs()
    g = TaskGraph(ins)
    for i in range(8):
        g.add(("placed", i), np.add, g.ref(ins[i % 4]), float(i),
              worker=workers[i % 2], priority=i)
    arr = g.persist_array("placed", ((3,) * 8,), np.empty(0), np.float64)
    futures = list(arr.__dask_graph__().values())
    from distributed import wait

    wait(futures)
    where = client.who_has(futures)
    for i in range(8):
        assert workers[i % 2] in where[("placed", i)]
    np.testing.assert_array_equal(arr.compute()[:3], np.arange(3.0))
