"""Shared fixtures: a real distributed cluster, raw-store writers, GPU skipping."""

from __future__ import annotations

import json
import os

import dask
import numpy as np
import pytest

# Local clusters started by tests take a free dashboard port, so that clusters started back
# to back (or by two test runs at once) never contend for 8787; the default itself is
# checked in test_dashboard.py. The variable reaches CLI subprocesses too.
os.environ["DASK_COSMO_DASK__DASHBOARD_ADDRESS"] = "127.0.0.1:0"
dask.config.set({"cosmo_dask.dashboard_address": "127.0.0.1:0"})


def _has_gpu() -> bool:
    from cosmo_dask.core.backend import gpu_available

    return gpu_available()


#: files that take minutes on 2 cores (CLI subprocesses, clusters, notebooks, SLURM) run
#: first, so that the two processes of `pytest -n 2 --dist loadfile` (the README's test
#: command) do not end with one of them alone on a long file; the others keep their order
LONG_FIRST = ("test_readme.py", "test_cli.py", "test_fof_kernels_gpu.py", "test_notebooks.py",
              "test_bench_scaling.py", "test_bench_graphs.py", "test_slurm_jobqueue.py",
              "test_worker_loss.py", "test_data_safety.py", "test_mesh_slabs.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable
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


def write_raw_store(path, arrays: dict, attrs: dict | None, *, zarr_format: int = 3,
                    chunks: int = 64):
    """Write a Zarr group directly (no cosmo_dask validation): for malformed-store tests."""
    import zarr

    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    if attrs is not None:
        group.attrs.update(attrs)
    for name, data in arrays.items():
        data = np.asarray(data)
        arr = group.create_array(name, shape=data.shape, dtype=data.dtype,
                                 chunks=(chunks,) + data.shape[1:], compressors=None)
        arr[...] = data
    return path


def good_attrs(**extra):
    attrs = {"format": "cosmo_dask.snapshot", "format_version": 1, "box_size": None}
    attrs.update(extra)
    return attrs


def read_json(path):
    with open(os.path.join(path, "zarr.json")) as f:
        return json.load(f)
