"""Bounded inputs (issue 36): every count and size is refused above a limit derived from
the data or the machine, before anything of that size is allocated; Gadget boxes and
far-out coordinates are reported, not silently changed; which P(k) results are bitwise."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from cosmo_dask import models
from cosmo_dask.core.errors import ParameterError, SnapshotError

#: ``simulation.parameters.MAX_STEPS`` and ``checks.MAX_CHUNKS`` (written out, so that
#: the code before them fails these tests on their behaviour, not on an import)
MAX_STEPS = MAX_CHUNKS = 2**16


@pytest.fixture(scope="module")
def ics():
    return models.lpt_ics(8, box_size=64.0, redshift=19.0, seed=1)


def _peak_bytes(fn):
    """(the exception ``fn`` raised, the peak of Python allocations while it ran)."""
    tracemalloc.start()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - returned to the test
        err = exc
    else:
        err = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return err, peak


def test_huge_step_count_is_refused_before_the_schedule_exists(ics, tmp_path):
    from cosmo_dask.simulation import run

    # the code before issue 36 allocated the 10^9-step schedule (23.6 GB in the CLI)
    err, peak = _peak_bytes(lambda: run(ics, n_steps=10**9, out=tmp_path / "sim"))
    assert isinstance(err, ParameterError) and f"at most {MAX_STEPS}" in str(err)
    assert peak < 64 * 2**20
    assert not (tmp_path / "sim").exists()
    with pytest.raises(ParameterError, match="explicit schedule has at most"):
        run(ics, steps=np.linspace(0.05, 1.0, MAX_STEPS + 2))
    with pytest.raises(ParameterError, match="at most .* output redshifts"):
        run(ics, n_steps=2, outputs=np.linspace(0, 1, MAX_STEPS + 1))


def test_check_run_checks_everything_and_writes_nothing(ics, tmp_path):
    from cosmo_dask.simulation.runner import check_run

    out = tmp_path / "sim"
    params = check_run(ics, n_steps=3, outputs=(1.0,), out=out)
    assert params["n_steps"] == 4 and params["outputs"] == [1.0, 0.0]  # split at z = 1
    assert not out.exists()
    with pytest.raises(ParameterError, match="not a simulation store"):
        check_run(ics, n_steps=3, out=out, resume=True)
    with pytest.raises(ParameterError, match="n_mesh=100000 is larger than 4096"):
        check_run(ics, n_steps=3, n_mesh=100000)


def test_domains_are_bounded_by_the_particles():
    from cosmo_dask.halos import fof
    from cosmo_dask.halos.parameters import check_fof

    snap = models.perturbed_lattice(16, box_size=10.0, seed=1)
    # before: 100000 domains of 4096 particles passed, and fof spun for minutes
    err, peak = _peak_bytes(lambda: fof(snap, 0.2, n_domains=100_000))
    assert isinstance(err, ParameterError) and "more than the 4096 particles" in str(err)
    assert peak < 64 * 2**20
    with pytest.raises(ParameterError, match="use at most 4096"):
        check_fof(snap, 0.2, n_domains=(64, 64, 2))
    check_fof(snap, 0.2, n_domains=8)  # fine


def test_slabs_and_chunks_of_generators_are_bounded():
    with pytest.raises(ParameterError, match="slabs must be at most 8"):
        models.lpt_ics(8, box_size=64.0, redshift=19.0, slabs=9)
    models.lpt_ics(8, box_size=64.0, redshift=19.0, slabs=8)  # one plane a slab
    n = 10**6
    err, peak = _peak_bytes(lambda: models.plummer(n, chunks=1))  # 10^6 one-row chunks
    assert isinstance(err, ParameterError) and f"more than {MAX_CHUNKS}" in str(err)
    assert f"at least {-(-n // MAX_CHUNKS)} particles a chunk" in str(err)
    assert peak < 64 * 2**20
    with pytest.raises(ParameterError, match="more than this machine's memory"):
        models.plummer(10**15)  # chunks of 2e12 particles
    with pytest.raises(ParameterError, match="more than this machine's memory"):
        models.perturbed_lattice(100_000, box_size=1.0)  # was a MemoryError


@pytest.mark.parametrize("box", [1e308, 1e120, 1e-120])
def test_ics_box_whose_volume_overflows_is_refused(box):
    # 1e308: an OverflowError (exit status 1) in the particle mass before
    with pytest.raises(ParameterError, match="box_size must lie between"):
        models.zeldovich(8, box_size=box, redshift=0.0)
    with pytest.raises(ParameterError, match="box_size must lie between"):
        models.lpt_ics(8, box_size=box, redshift=19.0)


def _gadget_file(path, box, pos):
    h5py = pytest.importorskip("h5py")
    n = len(pos)
    with h5py.File(path, "w") as f:
        h = f.create_group("Header")
        h.attrs.update({"NumPart_ThisFile": [0, n, 0, 0, 0, 0],
                        "NumPart_Total": [0, n, 0, 0, 0, 0], "NumPart_Total_HighWord": [0] * 6,
                        "MassTable": [0, 0.5, 0, 0, 0, 0], "NumFilesPerSnapshot": 1,
                        "BoxSize": box, "Time": 1.0, "Redshift": 0.0})
        g = f.create_group("PartType1")
        g["Coordinates"] = np.asarray(pos, dtype=np.float32)
        g["Velocities"] = np.zeros((n, 3), np.float32)
        g["ParticleIDs"] = np.arange(n, dtype=np.uint64)
    return path


@pytest.mark.parametrize("box", [-5.0, float("nan"), float("-inf")])
def test_gadget_negative_or_nonfinite_box_is_an_error(tmp_path, box):
    from cosmo_dask.io import from_gadget_hdf5

    path = _gadget_file(tmp_path / "s.hdf5", box, np.full((4, 3), 1.0))
    # before: BoxSize = -5 (or NaN) silently read as an isolated snapshot
    with pytest.raises(SnapshotError, match="BoxSize is .*expected the side of the periodic"):
        from_gadget_hdf5(path)


def test_gadget_coordinates_beyond_one_box_are_reported_not_wrapped(tmp_path):
    from cosmo_dask.io import from_gadget_hdf5

    pos = np.full((4, 3), 5.0)
    pos[1, 1] = 10.0  # on the edge: its periodic image 0
    pos[2, 2] = -0.5  # just below: 9.5
    edge = from_gadget_hdf5(_gadget_file(tmp_path / "edge.hdf5", 10.0, pos))
    got = edge.pos.compute()
    assert got[1, 1] == 0.0 and got[2, 2] == 9.5
    assert edge.validate(full=True, raise_errors=False).ok
    pos[0, 0] = 25.0  # 1.5 boxes out: a broken file (docs/gadget.md), reported
    far = from_gadget_hdf5(_gadget_file(tmp_path / "far.hdf5", 10.0, pos))
    assert far.pos.compute()[0, 0] == 25.0  # before: silently wrapped to 5
    report = far.validate(full=True, raise_errors=False)
    assert not report.ok and "1 coordinates outside the periodic box" in report.summary()
    with pytest.raises(SnapshotError, match=r"particle 0 at \[25.0, 5.0, 5.0\] is outside"):
        far.to_zarr(tmp_path / "far.zarr")


def test_limits_are_the_declared_ones():
    from cosmo_dask.core import checks
    from cosmo_dask.simulation import parameters

    assert parameters.MAX_STEPS == MAX_STEPS and checks.MAX_CHUNKS == MAX_CHUNKS


def test_power_spectrum_bitwise_on_one_cluster_shape_and_to_1e14_across(client):
    """The README's reproducibility statement: repeated P(k) on one cluster shape is
    bitwise; on another shape (1 worker against the 2 of ``client``) it differs in the
    last bits only."""
    from distributed import Client, LocalCluster

    from cosmo_dask.analysis import power_spectrum

    snap = models.halo_blobs(16**3, box_size=100.0, n_halos=20, seed=2, chunks=512)
    a = power_spectrum(snap, n_mesh=16).compute()["power"].values
    b = power_spectrum(snap, n_mesh=16).compute()["power"].values
    assert np.array_equal(a, b, equal_nan=True)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as one:
        with one.as_current():
            c = power_spectrum(snap, n_mesh=16).compute()["power"].values
    ok = np.isfinite(a)
    np.testing.assert_allclose(c[ok], a[ok], rtol=1e-14, atol=0)
