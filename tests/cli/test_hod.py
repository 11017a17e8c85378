"""``cosmo-dask hod``: the galaxy store equals the Python API's mock of the same halo store
and seed, with the occupation figure; a halo store without its snapshot refuses
``--satellites particles`` in one line naming ``--satellites nfw``."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.cli import main
from cosmo_dask.halos import fof, open_catalog, populate_hod
from cosmo_dask.models import halo_blobs
from cosmo_dask.store.snapshot import open_snapshot

COSMO = {"Omega_m": 0.3, "Omega_L": 0.7, "Omega_b": 0.05, "h": 0.7, "sigma8": 0.8, "n_s": 0.96}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("hod")
    snap = halo_blobs(20**3, box_size=50.0, n_halos=40, seed=2, cosmology=COSMO)
    snap.to_zarr(d / "snap.zarr")
    fof(open_snapshot(d / "snap.zarr")).to_zarr(d / "halos.zarr")
    fof(snap).to_zarr(d / "orphan.zarr")  # from memory: records no snapshot path
    return d


@pytest.mark.parametrize("satellites", ["particles", "nfw"])
def test_hod_store_equals_the_api(stores, tmp_path, satellites, monkeypatch):
    """(On dask's local scheduler: the command's cluster is replaced by none.)"""
    import contextlib

    from cosmo_dask.cli import common

    monkeypatch.setattr(common, "_cluster", lambda args, needed=True: contextlib.nullcontext())
    out, png = tmp_path / "gal.zarr", tmp_path / "occ.png"
    argv = ["--cpu", "--workers", "1", "hod", str(stores / "halos.zarr"), str(out),
            "--logMmin", "13.3", "--logM1", "13.8", "--satellites", satellites, "--seed", "4",
            "--plot", str(png)]
    assert main(argv) == 0
    got = open_snapshot(out)
    want = populate_hod(open_catalog(stores / "halos.zarr"),
                        params={"logMmin": 13.3, "logM1": 13.8}, seed=4, satellites=satellites)
    assert got.n_particles == want.n_particles > 0
    np.testing.assert_array_equal(got.pos.compute(), want.pos.compute())
    np.testing.assert_array_equal(got.vel.compute(), want.vel.compute())
    for name in ("host_id", "is_central", "host_mass"):
        np.testing.assert_array_equal(got.field(name).compute(), want.field(name).compute())
    assert got.provenance["params"]["logMmin"] == 13.3
    assert got.box_size == 50.0 and got.cosmology == want.cosmology
    assert png.stat().st_size > 0


def test_particles_without_the_snapshot_is_one_line(stores, tmp_path, capsys):
    rc = main(["--cpu", "--workers", "1", "hod", str(stores / "orphan.zarr"),
               str(tmp_path / "g.zarr")])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(lines) == 1, lines
    assert "records no snapshot" in lines[0] and "--satellites nfw" in lines[0], lines[0]
    assert not (tmp_path / "g.zarr").exists()
