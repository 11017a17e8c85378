"""``cosmo-dask subhalos``: the subhalo store equals the Python API's catalog of the same
snapshot and halo store, with the mass-function figure; halos of another snapshot are a
one-line error (exit 2) and nothing is written."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from cosmo_dask.cli import main
from cosmo_dask.halos import fof, open_catalog, open_subhalos, subhalos
from cosmo_dask.store.snapshot import Snapshot, open_snapshot
from tests.support.subhalos import host_with_satellites


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("subhalos")
    rng = np.random.default_rng(3)
    pos, vel, ids, _ = host_with_satellites(rng, 6000, [100, 200, 400], r_range=(0.7, 2.0))
    Snapshot.from_arrays(pos, vel, ids, box_size=40.0, particle_mass=1.0, G=1.0,
                         chunks=4000).to_zarr(d / "snap.zarr")
    fof(open_snapshot(d / "snap.zarr"), 0.3, absolute=True).to_zarr(d / "halos.zarr")
    other = Snapshot.from_arrays(pos[:-10], vel[:-10], box_size=40.0, particle_mass=1.0,
                                 G=1.0)
    fof(other, 0.3, absolute=True).to_zarr(d / "other.zarr")
    return d


def test_subhalo_store_equals_the_api(stores, tmp_path, monkeypatch):
    """(On dask's local scheduler: the command's cluster is replaced by none.)"""
    from cosmo_dask.cli import common

    monkeypatch.setattr(common, "_cluster", lambda args, needed=True: contextlib.nullcontext())
    out, png = tmp_path / "sub.zarr", tmp_path / "shmf.png"
    argv = ["--cpu", "--workers", "1", "subhalos", str(stores / "snap.zarr"),
            str(stores / "halos.zarr"), str(out), "--labels", "--plot", str(png)]
    assert main(argv) == 0
    got = open_subhalos(out)
    want = subhalos(open_snapshot(stores / "snap.zarr"), open_catalog(stores / "halos.zarr"),
                    labels=True)
    assert got.n_subhalos == want.n_subhalos >= 4
    for k in want.catalog.data_vars:
        np.testing.assert_array_equal(got.catalog[k].values, want.catalog[k].values)
    np.testing.assert_array_equal(got.labels.compute(), want.labels.compute())
    assert got.parameters["snapshot"].endswith("snap.zarr")
    assert png.stat().st_size > 0


def test_halos_of_another_snapshot_is_one_line(stores, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    rc = main(["--cpu", "--workers", "1", "subhalos", str(stores / "snap.zarr"),
               str(stores / "other.zarr"), str(out)])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(lines) == 1, lines
    assert "give the halos of this snapshot" in lines[0], lines[0]
    assert not out.exists()


def test_bad_value_is_one_line_and_the_defaults_are_the_parameters(stores, tmp_path, capsys):
    from cosmo_dask.cli.parser import build_parser
    from cosmo_dask.halos import parameters as hp

    out = tmp_path / "s.zarr"
    rc = main(["--cpu", "--workers", "1", "subhalos", str(stores / "snap.zarr"),
               str(stores / "halos.zarr"), str(out), "--link-fraction", "1.5"])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(lines) == 1, lines
    assert "link_fraction must be in (0, 1), got 1.5" in lines[0].replace("-", "_"), lines[0]
    assert not out.exists()
    args = build_parser().parse_args(["subhalos", "a", "b", "c"])
    assert (args.min_members, args.link_fraction, args.tree_threshold) == (
        hp.SUBHALO_MIN_MEMBERS_DEFAULT, hp.SUBHALO_LINK_FRACTION_DEFAULT,
        hp.SUBHALO_TREE_THRESHOLD_DEFAULT)
