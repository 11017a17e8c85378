"""``cosmo-dask xi`` (cli/clustering.py): the store it writes holds the Dataset of
correlation_function on the same snapshot (counts equal, units), and its figure."""

from __future__ import annotations

import numpy as np

from cosmo_dask.analysis import correlation_function, open_correlation
from cosmo_dask.cli import main
from cosmo_dask.models import perturbed_lattice
from cosmo_dask.store.snapshot import open_snapshot


def test_xi_writes_the_correlation_store_and_its_plot(tmp_path, capsys):
    perturbed_lattice(12, box_size=30.0, seed=3).to_zarr(tmp_path / "snap.zarr")
    out, png = tmp_path / "xi.zarr", tmp_path / "xi.png"
    rc = main(["--cpu", "--workers", "1", "xi", str(tmp_path / "snap.zarr"), str(out),
               "--r-max", "9", "--bins", "6", "--mu-bins", "5", "--poles", "0", "2",
               "--plot", str(png)])
    assert rc == 0
    assert "xi_2" in capsys.readouterr().out
    ds = open_correlation(out)
    snap = open_snapshot(tmp_path / "snap.zarr")
    want = correlation_function(snap, np.linspace(0, 9, 7), mu_bins=5, los="z", poles=(0, 2))
    np.testing.assert_array_equal(ds["dd"].values, want["dd"].values)
    np.testing.assert_allclose(ds["multipoles"].values, want["multipoles"].values)
    assert list(ds["ell"].values) == [0, 2]
    assert ds["r"].attrs["units"] == want["r"].attrs["units"]
    assert ds.attrs["los"] == [0.0, 0.0, 1.0] and ds.attrs["n_particles"] == 12**3
    assert png.stat().st_size > 0
