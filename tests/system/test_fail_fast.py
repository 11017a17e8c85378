"""Every failure ends the command in seconds (issue 36, failure 3 and Deliver 2 and 6).

A NaN in a ``pos`` chunk made ``halos`` and ``density --method pse`` print their stage
"failed" and then wait for ever: the failed persist returned, and the display of the
next computation waited on keys that could no longer complete. Workers paused at their
memory limit ran nothing, and the run waited without a word. Each test has a timeout, so
a regression fails instead of hanging; on the code before the fix each of them hung.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid

import dask
import numpy as np
import pytest

from cosmo_dask.core import progress
from cosmo_dask.core.errors import ClusterError, ParameterError
from tests.support.stores import good_attrs, write_raw_store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_SIDE = 16
BOX = 10.0
BAD = 1000  # the particle with the NaN (in the store's first chunk)
NAN_MESSAGE = f"array 'pos': particle {BAD} has non-finite values; all pos must be finite"


@pytest.fixture(scope="module")
def nan_store(tmp_path_factory):
    """A 16^3 periodic lattice (ids, lagrangian_shape) with one NaN position, written as
    a raw Zarr store (cosmo_dask's writer refuses it)."""
    path = tmp_path_factory.mktemp("nan") / "nan.zarr"
    rng = np.random.default_rng(36)
    cells = (np.indices((N_SIDE,) * 3).reshape(3, -1).T + 0.5) * (BOX / N_SIDE)
    pos = np.mod(cells + rng.normal(0.0, 0.05, cells.shape), BOX)
    pos[BAD, 1] = np.nan
    write_raw_store(path, {"pos": pos, "vel": rng.normal(0.0, 1.0, pos.shape),
                           "ids": np.arange(N_SIDE**3)},
                    good_attrs(box_size=BOX, particle_mass=1.0,
                               lagrangian_shape=[N_SIDE] * 3), chunks=1024)
    return path


@pytest.fixture(scope="module")
def processes():
    """Two single-threaded worker processes; no memory limit, so that a paused status set
    by a test stays until the test resumes them."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", memory_limit=0,
                      silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def _boom(x):
    raise RuntimeError("bad chunk")


def _graph(tag: str):
    parts = [dask.delayed(lambda i: i)(i, dask_key_name=f"fof-domain-{tag}-{i}")
             for i in range(4)]
    return dask.delayed(_boom)(parts, dask_key_name=f"fof-local-{tag}")


@pytest.mark.timeout(60)
def test_failed_persist_raises_and_nothing_waits_on_it(client):
    """A shown persist that fails raises (it used to return its failed futures); a
    computation over failed futures raises at once, display on (it used to wait on keys
    that can never complete)."""
    with pytest.raises(RuntimeError, match="bad chunk"):
        progress.persist(_graph(uuid.uuid4().hex[:8]), label="columns", show=True)
    (failed,) = progress.persist(_graph(uuid.uuid4().hex[:8]), show=False)
    later = dask.delayed(len)(failed, dask_key_name=f"fof-count-{uuid.uuid4().hex[:8]}")
    with pytest.raises(RuntimeError, match="bad chunk"):
        progress.compute(later, label="counts", show=True)
    with pytest.raises(RuntimeError, match="bad chunk"):
        progress.wait(failed)
    deadline = time.monotonic() + 10  # the displays leave no plugin on the scheduler
    while client.run_on_scheduler(_progress_plugins) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.run_on_scheduler(_progress_plugins) == []


def _progress_plugins(dask_scheduler):
    return [name for name in dask_scheduler.plugins if name.startswith("multi-progress")]


@pytest.mark.timeout(120)
def test_nan_in_pos_fails_halos_through_the_api(nan_store, processes, capsys):
    from cosmo_dask import open_snapshot
    from cosmo_dask.core.errors import SnapshotError
    from cosmo_dask.halos import fof_labels

    snap = open_snapshot(nan_store)
    with processes.as_current(), dask.config.set({"cosmo_dask.progress": True}):
        with pytest.raises(SnapshotError, match=NAN_MESSAGE):
            fof_labels(snap, n_domains=8)
    err = capsys.readouterr().err
    assert "[friends-of-friends]" in err and "failed after" in err


def _set_status(status: str, dask_worker=None) -> None:
    from distributed.core import Status

    dask_worker.status = Status[status]


def _statuses(client) -> list[str]:
    return [w["status"] for w in client.scheduler_info(n_workers=-1)["workers"].values()]


@pytest.mark.timeout(120)
def test_paused_workers_are_reported_after_the_pause_timeout(processes):
    """Workers paused (as at their memory limit) run nothing: the computation ends with a
    one-line ClusterError once they have been paused for cosmo_dask.pause_timeout."""
    import dask.array as da

    processes.run(_set_status, "paused")
    try:
        deadline = time.monotonic() + 30
        while set(_statuses(processes)) != {"paused"} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(_statuses(processes)) == {"paused"}
        x = da.arange(1000, chunks=100).sum()
        with processes.as_current(), dask.config.set({"cosmo_dask.pause_timeout": 1}):
            with pytest.raises(ClusterError, match=r"every worker .* has been paused for 1 s"
                               r".*distributed\.worker\.memory\.pause") as info:
                progress.compute(x, label="sum", show=True)
        assert "\n" not in str(info.value)
    finally:
        processes.run(_set_status, "running")
    with processes.as_current():  # the cluster works again
        assert progress.compute(x)[0] == 499500


def test_pause_timeout_config_is_checked():
    for value, expected in ((30, 30.0), ("2 minutes", 120.0), ("30 s", 30.0), (None, None),
                            (0, 0.0)):
        with dask.config.set({"cosmo_dask.pause_timeout": value}):
            assert progress.pause_timeout() == expected
    for bad in ("soon", -1, float("nan"), True):
        with dask.config.set({"cosmo_dask.pause_timeout": bad}), \
                pytest.raises(ParameterError, match="cosmo_dask.pause_timeout"):
            progress.pause_timeout()


def _cli(*args, timeout=240):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "cosmo_dask", "--cpu", "--workers", "2",
                           *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command, verbose", [
    (["halos", "--domains", "8"], False),
    (["density", "--method", "pse"], True),
], ids=["halos", "pse-verbose"])
def test_nan_in_pos_fails_the_cli_in_one_line(nan_store, tmp_path, command, verbose):
    """One line, exit status 2; distributed's worker logs (the failed task's "Compute
    Failed" block with its traceback) only with --verbose."""
    out = _cli(*(["--verbose"] if verbose else []), command[0], str(nan_store),
               str(tmp_path / "out.zarr"), *command[1:])
    err = out.stderr
    assert out.returncode == 2, err
    assert err.rstrip().splitlines()[-1] == f"cosmo-dask: error: {nan_store}: {NAN_MESSAGE}"
    assert not (tmp_path / "out.zarr").exists()
    if verbose:
        assert "Compute Failed" in err and "Traceback" in err
    else:
        assert not any(word in err for word in ("Compute Failed", "Traceback", "ERROR")), err
