"""SLURM for real: a one-node SLURM on 127.0.0.1 (tests/support/slurm_local.py), worker jobs
submitted through deploy/slurm_jobqueue.py (dask-jobqueue), FOF with centres on a
snapshot store read by those workers, against the local scheduler's answer; every
daemon stopped afterwards.

Skipped where SLURM is not installed, unless ``COSMO_DASK_REQUIRE_SLURM=1`` (set by
``.ci/run``, which installs Debian's slurm-wlm and munge) turns the skip into a failure.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.slurm_local import LocalSlurm, missing_programs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BOX = 10.0


def _requirements() -> str | None:
    """Why a local SLURM cannot run here (None: it can)."""
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        return "dask-jobqueue is not installed"
    missing = missing_programs()
    if missing:
        return (f"SLURM/munge programs missing: {', '.join(missing)} "
                "(apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = _requirements()
    if why:
        if os.environ.get("COSMO_DASK_REQUIRE_SLURM") == "1":
            pytest.fail(f"COSMO_DASK_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2) as s:
        yield s
    assert not s.running(), f"daemons still running: {s.running()}"


@pytest.fixture(scope="module")
def slurm_example():
    sys.path.insert(0, str(DEPLOY))
    try:
        yield importlib.import_module("slurm_jobqueue")
    finally:
        sys.path.remove(str(DEPLOY))


def _snapshot(path):
    from cosmo_dask import Snapshot

    n = 20_000
    rng = np.random.default_rng(5)
    centres = rng.random((10, 3)) * BOX
    pos = centres[rng.integers(0, 10, n)] + 0.02 * BOX * rng.normal(size=(n, 3))
    Snapshot.from_arrays(pos % BOX, rng.normal(size=(n, 3)), ids=np.arange(n), box_size=BOX,
                         particle_mass=1.0, chunks=n // 4).to_zarr(path)
    return path


def _fof(path):
    from cosmo_dask import open_snapshot
    from cosmo_dask.halos import fof

    res = fof(open_snapshot(path), 0.2, centers=("mbp",))
    return (np.asarray(res.labels.compute()), res.catalog["mass"].values,
            res.catalog["mbp_position"].values)


def test_fof_on_slurm_workers_matches_the_local_answer(slurm, slurm_example, tmp_path,
                                                       monkeypatch, capsys):
    import dask

    import cosmo_dask
    from cosmo_dask.cli import main

    monkeypatch.chdir(tmp_path)  # the example's dask-logs/ and the job scripts land here
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    store = _snapshot(tmp_path / "s.zarr")
    with dask.config.set(scheduler="threads"):
        want = _fof(store)

    t0 = time.monotonic()
    with slurm_example.cpu_cluster("debug", None, cores=1, processes=1, memory="1GB",
                                   walltime="00:10:00", interface="lo") as cluster:
        cluster.scale(jobs=2)
        with cosmo_dask.connect(cluster.scheduler_address) as client:
            client.wait_for_workers(2, timeout=120)
            started = time.monotonic() - t0
            workers = client.scheduler_info()["workers"].values()
            assert all(w["nthreads"] == 1 for w in workers)
            # the workers are SLURM jobs: their environment names a job id
            job_ids = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
            assert all(j for j in job_ids.values()), job_ids
            got = _fof(store)
            # the CLI against the same scheduler, as a user of the allocation would
            assert main(["--scheduler", cluster.scheduler_address, "halos", str(store),
                         str(tmp_path / "h.zarr"), "--centers", "mbp"]) == 0
        print(f"SLURM: 2 worker jobs connected in {started:.1f} s")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    from cosmo_dask.halos import open_catalog

    cli = open_catalog(tmp_path / "h.zarr")
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(np.asarray(cli.labels.compute()), want[0])
    np.testing.assert_array_equal(cli.catalog["mbp_position"].values, want[2])
    print(capsys.readouterr().out)
