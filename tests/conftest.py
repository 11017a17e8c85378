"""Shared fixtures: a real distributed cluster, raw-store writers, GPU skipping."""

from __future__ import annotations

import os
from pathlib import Path

import dask
import numpy as np
import pytest

# Local clusters started by tests take a free dashboard port, so that clusters started back
# to back (or by two test runs at once) never contend for 8787; the default itself is
# checked in tests/system/test_dashboard.py. The variable reaches CLI subprocesses too.
os.environ["DASK_COSMO_DASK__DASHBOARD_ADDRESS"] = "127.0.0.1:0"
dask.config.set({"cosmo_dask.dashboard_address": "127.0.0.1:0"})
# no statistical profiler in the workers of the tests' in-process clusters: its thread walks
# the other threads' frames, and it crashed the test process once (a segmentation fault in
# distributed/profile.py during tests/cli/test_cli.py's demo, Python 3.11, 2026-11-28)
os.environ["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"
dask.config.set({"distributed.worker.profile.enabled": False})


def _has_gpu() -> bool:
    from cosmo_dask.core.backend import gpu_available

    return gpu_available()


#: files (paths under tests/) that take minutes on 2 cores (CLI subprocesses, clusters,
#: notebooks, SLURM) run first, so that the two processes of `pytest -n 2 --dist loadfile`
#: (the README's test command) do not end with one of them alone on a long file; the
#: others keep their order
LONG_FIRST = ("system/test_readme.py", "cli/test_cli.py", "halos/test_fof_kernels.py",
              "system/test_notebooks.py", "system/test_bench_scaling.py",
              "system/test_bench_graphs.py", "system/test_slurm_jobqueue.py",
              "system/test_worker_loss.py", "system/test_data_safety.py", "spatial/test_slabs.py")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    def long_rank(item):
        path = Path(item.path)
        name = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.name
        return rank.get(name, len(rank))

    items.sort(key=long_rank)  # stable
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _session_client():
    """One LocalCluster (two single-threaded in-process workers) for the whole run.

    Not the default client: tests that do not ask for ``client`` keep dask's
    local scheduler, as when they run alone.
    """
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


@pytest.fixture
def client(_session_client):
    """The shared distributed client, current for this test only."""
    with _session_client.as_current():
        yield _session_client


@pytest.fixture(autouse=True)
def _scheduler_config_restored():
    """A test that leaves dask's global scheduler config changed (a Client still named
    after it closed) fails here, instead of every later test failing with
    "no Client active"."""
    before = dask.config.get("scheduler", None)
    yield
    after = dask.config.get("scheduler", None)
    if after != before:
        dask.config.set(scheduler=before)
        pytest.fail(f"the test left dask's scheduler config at {after!r} (was {before!r})")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
