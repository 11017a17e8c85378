"""Losing a worker mid-analysis: one worker process of a 2-worker LocalCluster is killed
(SIGKILL, by pid; its nanny starts a new one) at three moments of FOF, tree gravity, the
PSE deposit (both schedules, whose tasks are placed on chosen workers) and an SCF fit.
Every run must finish with the undisturbed run's answer, bit for bit; the one exception
is the PSE "reduce" schedule, which groups partial patches by the worker holding their
columns, so a lost worker (which moves columns) changes the order of the float64 sums:
equal there to a few ulp."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from cosmo_dask import Snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BOX = 10.0


def _clustered(n, seed=3):
    rng = np.random.default_rng(seed)
    centres = rng.random((12, 3)) * BOX
    pos = centres[rng.integers(0, 12, n)] + 0.02 * BOX * rng.normal(size=(n, 3))
    return Snapshot.from_arrays(pos % BOX, rng.normal(size=(n, 3)), ids=np.arange(n),
                                box_size=BOX, particle_mass=1.0, chunks=n // 8)


def _lattice(n=16):
    q = (np.stack(np.meshgrid(*[np.arange(n)] * 3, indexing="ij"), -1).reshape(-1, 3) + 0.5)
    q *= BOX / n
    pos = (q + 0.4 * np.sin(2 * np.pi * q / BOX)[:, [1, 2, 0]]) % BOX
    return Snapshot.from_arrays(pos, np.zeros_like(q), ids=np.arange(n**3), box_size=BOX,
                                particle_mass=1.0, lagrangian_shape=(n, n, n),
                                chunks=n**3 // 8)


def _halo(n=40_000):
    rng = np.random.default_rng(8)
    r = rng.random(n) ** 2
    d = rng.normal(size=(n, 3))
    return Snapshot.from_arrays(r[:, None] * d / np.linalg.norm(d, axis=1, keepdims=True),
                                particle_mass=1.0 / n, chunks=n // 8)


def fof_run():
    from cosmo_dask.halos import fof

    res = fof(_clustered(40_000), 0.2, centers=("mbp",))
    return [np.asarray(res.labels.compute()), res.catalog["mass"].values,
            res.catalog["mbp_position"].values]


def tree_run():
    from cosmo_dask.gravity import accelerations

    acc, pot = accelerations(_clustered(40_000), method="tree", G=1.0, softening=0.02,
                             precision="float64")
    return [np.asarray(acc.compute()), np.asarray(pot.compute())]


def pse_run(strategy):
    from cosmo_dask.density import pse_density

    octree = pse_density(_lattice(), patch_size=8, block=4, strategy=strategy)
    return [np.asarray(octree.patches.compute())]


def scf_run():
    from cosmo_dask.expansion import SCF

    snap = _halo()
    model = SCF(8, 4, scale_radius=0.3, center=(0.0, 0.0, 0.0)).fit(snap)
    return [model.coefficients.values, model.variance.values,
            np.asarray(model.accelerations(snap.pos).compute())]


RUNS = {"fof": fof_run, "tree": tree_run, "pse-gather": lambda: pse_run("gather"),
        "pse-reduce": lambda: pse_run("reduce"), "scf": scf_run}


@pytest.fixture
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as c, Client(c) as client:
        yield c, client
        _forget_a_phantom_removal(c)


def _forget_a_phantom_removal(cluster):
    """distributed's cluster-side watcher of worker events (``SpecCluster``) dies with a
    KeyError when the scheduler reports the removal of a worker whose arrival it never
    saw (a nanny's replacement for a killed worker, gone before it was announced; seen
    once, in a clean-clone .ci/run of 2026-12-07; dask/distributed#5407 describes the
    lookup), and
    the cluster's close then raises it after stopping the workers and the scheduler. That
    watcher only mirrors the scheduler's worker list for the cluster object; a run's
    answer does not depend on it. Drop a watcher that died that way, so the close stops
    everything; any other failure of it still fails the test."""
    task = getattr(cluster, "_watch_worker_status_task", None)
    if task is None or not task.done() or task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, KeyError) and str(exc.args[0] if exc.args else "").startswith("tcp://"):
        cluster._watch_worker_status_task = None


def _kill_one_worker(client):
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    return victim


def _run_with_a_kill(client, run, delay):
    """``run()`` in a thread; one worker killed after ``delay`` s; its result."""
    box, errors = {}, []

    def target():
        try:
            box["result"] = run()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    t = threading.Thread(target=target)
    t.start()
    time.sleep(delay)
    killed = t.is_alive()
    if killed:
        _kill_one_worker(client)
    t.join(timeout=600)
    assert not t.is_alive(), "the run did not finish after a worker was lost"
    assert not errors, errors
    try:
        client.wait_for_workers(2, timeout=30)  # the nanny's new worker is back
    except TimeoutError:
        # distributed's nanny now and then starts the new worker process without it ever
        # registering (seen about once in 20 kills here); the run above has finished on
        # the other worker all the same. Restart both for the next kill.
        client.restart(timeout=120, wait_for_workers=True)
    return box["result"], killed


@pytest.mark.parametrize("name", list(RUNS))
def test_a_killed_worker_does_not_change_the_answer(cluster, name):
    _, client = cluster
    run = RUNS[name]
    run()  # warm-up: kernels compiled (or loaded from the cache) on both workers
    t0 = time.perf_counter()
    want = run()
    seconds = time.perf_counter() - t0
    n_killed = 0
    for fraction in (0.15, 0.45, 0.75):
        got, killed = _run_with_a_kill(client, run, fraction * seconds)
        n_killed += killed
        for g, w in zip(got, want, strict=True):
            if name == "pse-reduce":  # summation order follows column placement
                np.testing.assert_allclose(g, w, rtol=4e-15, atol=0)
            else:
                np.testing.assert_array_equal(g, w)  # bit for bit
    assert n_killed >= 2, f"the run ({seconds:.2f} s) ended before the kills"


def test_persisted_particles_lost_with_a_worker_are_read_again(cluster, tmp_path):
    """Long-held state: particles persisted in worker memory (as in a notebook), then the
    worker holding some of them is killed; the next analysis recomputes the lost chunks
    from the store and gives the undisturbed answer."""
    from cosmo_dask import open_snapshot
    from cosmo_dask.halos import fof

    _, client = cluster
    _clustered(40_000).to_zarr(tmp_path / "s.zarr")
    snap = open_snapshot(tmp_path / "s.zarr").persist()
    want = fof(snap, 0.2, centers=("mbp",))
    want = [np.asarray(want.labels.compute()), want.catalog["mbp_position"].values]
    held = client.who_has(snap.pos)
    victim = _kill_one_worker(client)
    assert any(victim in where for where in held.values()), "the victim held no chunk"
    client.wait_for_workers(2, timeout=60)
    got = fof(snap, 0.2, centers=("mbp",))
    np.testing.assert_array_equal(np.asarray(got.labels.compute()), want[0])
    np.testing.assert_array_equal(got.catalog["mbp_position"].values, want[1])
