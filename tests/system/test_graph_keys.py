"""Graph keys hash every input: on one multi-process cluster, the same analysis on the
same particles chunked differently, or with other parameters, or with other masses,
gives the local scheduler's answer each time (a key shared by two different tasks
would hand one call the other's result, or fail with "different run_spec").
Two clients submitting different analyses at once get their own answers too."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cosmo_dask import Snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _clustered(n, box, seed=3):
    rng = np.random.default_rng(seed)
    centres = rng.random((12, 3)) * box
    pos = centres[rng.integers(0, 12, n)] + 0.02 * box * rng.normal(size=(n, 3))
    return pos % box, rng.normal(size=(n, 3))


N, BOX = 4096, 10.0
POS, VEL = _clustered(N, BOX)


def snap_of(chunks, particle_mass=1.0, pos=POS, vel_scale=1.0):
    return Snapshot.from_arrays(pos, vel_scale * VEL, ids=np.arange(len(pos)), box_size=BOX,
                                particle_mass=particle_mass, chunks=chunks)


def lattice_snap(chunks, amplitude=0.3, particle_mass=1.0):
    """A perturbed 16^3 lattice (ids in Lagrangian order) for PSE."""
    n = 16
    q = (np.stack(np.meshgrid(*[np.arange(n)] * 3, indexing="ij"), -1).reshape(-1, 3) + 0.5)
    q *= BOX / n
    disp = amplitude * np.sin(2 * np.pi * q / BOX)[:, [1, 2, 0]]
    return Snapshot.from_arrays((q + disp) % BOX, np.zeros_like(q), ids=np.arange(n**3),
                                box_size=BOX, particle_mass=particle_mass,
                                lagrangian_shape=(n, n, n), chunks=chunks)


def halo_snap(chunks, mass=1.0):
    rng = np.random.default_rng(8)
    r = rng.random(3000) ** 2
    d = rng.normal(size=(3000, 3))
    pos = r[:, None] * d / np.linalg.norm(d, axis=1, keepdims=True)
    return Snapshot.from_arrays(pos, particle_mass=mass / 3000, chunks=chunks)


def run(analysis, snap, keep=None, **kw):
    """The analysis' result as NumPy arrays (everything computed); the result objects
    (which may hold persisted futures) are appended to ``keep`` so that they stay alive,
    as in a notebook, while the next call runs."""
    keep = [] if keep is None else keep
    if analysis == "fof":
        from cosmo_dask.halos import fof

        res = fof(snap, kw.get("ll", 0.2), centers=("mbp",))
        keep.append(res)
        return [np.asarray(res.labels.compute()), res.catalog["mass"].values,
                res.catalog["velocity"].values, res.catalog["mbp_position"].values]
    if analysis in ("tree", "treepm", "pm"):
        from cosmo_dask.gravity import accelerations

        acc, pot = accelerations(snap, method=analysis, G=1.0,
                                 softening=0.0 if analysis == "pm" else 0.05,
                                 precision="float64", n_mesh=kw.get("n_mesh", 16))
        keep.append(acc.persist())
        return [np.asarray(acc.compute()), np.asarray(pot.compute())]
    if analysis == "paint":
        from cosmo_dask.density import paint

        return [np.asarray(paint(snap, n_mesh=kw.get("n_mesh", 16), scheme="cic").compute())]
    if analysis == "power":
        from cosmo_dask.analysis import power_spectrum

        ds = power_spectrum(snap, n_mesh=kw.get("n_mesh", 16)).compute()
        return [ds[v].values for v in ds.data_vars]
    if analysis == "pse":
        from cosmo_dask.density import pse_density

        octree = pse_density(snap, patch_size=4, block=4, strategy=kw.get("strategy", "gather"))
        keep.append(octree)
        return [np.asarray(octree.patches.compute())]
    if analysis in ("scf", "mex"):
        from cosmo_dask.expansion import MEX, SCF

        model = (SCF(6, 4, scale_radius=0.3, center=(0.0, 0.0, 0.0)) if analysis == "scf"
                 else MEX(4, center=(0.0, 0.0, 0.0))).fit(snap)
        keep.append(model)
        acc = (model.accelerations(snap.pos) if analysis == "scf" else model.accelerations())
        return [np.asarray(acc.compute())]
    raise ValueError(analysis)


# (analysis, snapshot maker, two chunkings, variants: (kwargs, snapshot maker kwargs))
CASES = {
    "fof": (snap_of, (4096, 1000), [({"ll": 0.15}, {}), ({}, {"particle_mass": 2.0}),
                                    ({}, {"vel_scale": 2.0})]),
    "tree": (snap_of, (4096, 700), [({}, {"particle_mass": 3.0})]),
    "treepm": (snap_of, (4096, 1000), [({"n_mesh": 32}, {})]),
    "pm": (snap_of, (4096, 1000), [({"n_mesh": 32}, {}), ({}, {"particle_mass": 2.0})]),
    "paint": (snap_of, (4096, 1000), [({"n_mesh": 8}, {}), ({}, {"particle_mass": 2.0})]),
    "power": (snap_of, (4096, 1000), [({"n_mesh": 8}, {})]),
    "pse": (lattice_snap, (4096, 1000), [({"strategy": "reduce"}, {}),
                                         ({}, {"particle_mass": 2.0}),
                                         ({}, {"amplitude": 0.1})]),
    "scf": (halo_snap, (3000, 700), [({}, {"mass": 2.0})]),
    "mex": (halo_snap, (3000, 700), [({}, {"mass": 2.0})]),
}


def equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12 * (np.abs(y).max() or 1))


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as c:
        yield c


@pytest.mark.parametrize("analysis", list(CASES))
def test_chunkings_and_parameters_get_their_own_keys(cluster, analysis):
    """In one client: chunking A, chunking B, then each variant, each against the local
    threaded scheduler's result for the same input."""
    import dask
    from distributed import Client

    make, (ca, cb), variants = CASES[analysis]
    calls = [({}, {"chunks": ca}), ({}, {"chunks": cb})]
    calls += [(kw, dict(mk, chunks=ca)) for kw, mk in variants]
    with dask.config.set(scheduler="threads"):
        want = [run(analysis, make(**mk), **kw) for kw, mk in calls]
    with Client(cluster, set_as_default=True):
        keep = []  # every result stays alive while the next call runs
        got = [run(analysis, make(**mk), keep, **kw) for kw, mk in calls]
        del keep
    for g, w in zip(got, want, strict=True):
        equal(g, w)
    # the calls differ, and so do their answers: a shared key would have made them equal
    assert not all(np.array_equal(x, y) for x, y in zip(want[0], want[2], strict=True))


def test_a_store_rewritten_at_the_same_path_is_read_anew(cluster, tmp_path):
    """A notebook holds the old store's particles in worker memory while the store is
    rewritten with other data: reopening reads the new data (the read keys hash the
    store's manifest and metadata time, not only its path)."""
    from distributed import Client

    from cosmo_dask import open_snapshot

    path = tmp_path / "s.zarr"
    snap_of(1000).to_zarr(path)
    with Client(cluster, set_as_default=True):
        held = open_snapshot(path).pos.persist()
        other = (POS + 1.0) % BOX
        snap_of(1000, pos=other).to_zarr(path, overwrite=True)
        np.testing.assert_array_equal(open_snapshot(path).pos.compute(), other)
        np.testing.assert_array_equal(held.compute(), POS)


def test_two_clients_at_once_get_their_own_answers(cluster):
    import dask
    from distributed import Client

    jobs = {"fof": (snap_of(1000), {}), "pm": (snap_of(700), {}),
            "paint": (snap_of(1000, particle_mass=2.0), {}),
            "power": (snap_of(700), {"n_mesh": 8})}
    with dask.config.set(scheduler="threads"):
        want = {name: run(name, s, **kw) for name, (s, kw) in jobs.items()}
    got, errors = {}, []

    def submit(names):
        try:
            with Client(cluster.scheduler_address, set_as_default=False) as client:
                with client.as_current():  # this thread's client (dask's config is global)
                    keep = []
                    for name in names:
                        s, kw = jobs[name]
                        got[name] = run(name, s, keep, **kw)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(names,))
               for names in (["fof", "paint"], ["pm", "power"])]
    # as_current() sets dask's global scheduler config on entry and restores what it saw
    # on exit; two threads interleaving can leave "dask.distributed" behind with no client
    # (later tests then fail with "no Client active"), so the config is restored here
    with dask.config.set(scheduler=dask.config.get("scheduler", None)):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors
    for name in jobs:
        equal(got[name], want[name])
