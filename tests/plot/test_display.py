"""Text and HTML (Jupyter) displays of Snapshot and HaloResult."""

from __future__ import annotations

import re

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from cosmo_dask import Snapshot
from cosmo_dask.halos import HaloResult

UNITS = {"length": "Mpc/h", "velocity": "km/s (peculiar)", "mass": "1e10 Msun/h"}
COSMO = {"Omega_m": 0.3111, "Omega_b": 0.049, "Omega_L": 0.6889000000000001, "h": 0.6766,
         "sigma8": 0.8102, "n_s": 0.9665}


def _cosmological(rng, n=1000):
    pos = rng.uniform(0, 123.456789, size=(n, 3))
    vel = rng.normal(0, 300, size=(n, 3)).astype(np.float32)
    return Snapshot.from_arrays(pos, vel, np.arange(n), box_size=123.456789,
                                particle_mass=263.49378863433833, scale_factor=1 / 3.0,
                                cosmology=COSMO, units=UNITS, G=43.0091, chunks=300)


def _text_numbers(text):
    return re.findall(r"\d+\.\d+", text)


# ---------------------------------------------------------------------------- Snapshot
def test_snapshot_repr_is_rounded_with_units(rng):
    text = repr(_cosmological(rng))
    assert text.startswith("<Snapshot N=1000 box 123.5 Mpc/h")
    assert "z=2 " in text or "z=2," in text          # 1/(1/3) - 1 rounded, not 1.9999999
    assert "particle mass 263.5 × 1e10 Msun/h" in text
    assert "pos(1000, 3) float64" in text and "vel(1000, 3) float32" in text
    assert "4 chunks on cpu" in text
    # nothing printed with more than 4 significant digits
    assert all(len(x.replace(".", "").lstrip("0")) <= 4 for x in _text_numbers(text)), text


def test_snapshot_repr_isolated_and_bare(rng):
    snap = Snapshot.from_arrays(rng.random((10, 3)), chunks=10)
    assert repr(snap) == "<Snapshot N=10 isolated [pos(10, 3) float64] 1 chunk on cpu>"
    html = snap._repr_html_()
    assert "isolated" in html and "cosmology" not in html


def test_snapshot_html_table(rng):
    html = _cosmological(rng)._repr_html_()
    assert html.startswith("<div") and html.endswith("</div>") and "<table" in html
    for needle in ("1,000", "123.457 Mpc/h", "z = 2, a = 0.333333",
                   "263.494 × 1e10 Msun/h", "43.0091",
                   "km/s (peculiar)",                       # units of vel
                   "(1000, 3)", "float32", "int64",         # shapes and dtypes
                   "4 chunks of (300, 3)", "numpy",         # chunking and backend
                   "Omega_m", "0.3111", "0.6889", "sigma8", "0.8102"):
        assert needle in html, needle
    assert "0.6889000000000001" not in html


def test_snapshot_html_escapes(rng):
    units = dict(UNITS, length="<b>kpc</b>")
    snap = Snapshot.from_arrays(rng.uniform(0, 1, (5, 3)), box_size=1.0, units=units)
    html = snap._repr_html_()
    assert "<b>kpc</b>" not in html and "&lt;b&gt;kpc&lt;/b&gt;" in html


def test_snapshot_html_gadget_info(tmp_path, rng):
    h5py = pytest.importorskip("h5py")
    from cosmo_dask.io import from_gadget_hdf5

    n = 20
    path = tmp_path / "snap_003.hdf5"
    with h5py.File(path, "w") as f:
        h = f.create_group("Header")
        count = np.array([0, n, 0, 0, 0, 0], dtype=np.uint32)
        h.attrs.update({"NumPart_ThisFile": count, "NumPart_Total": count,
                        "NumPart_Total_HighWord": np.zeros(6, np.uint32),
                        "MassTable": np.array([0, 0.5, 0, 0, 0, 0]),
                        "NumFilesPerSnapshot": np.int32(1), "Time": 0.25, "BoxSize": 10.0,
                        "Omega0": 0.3, "OmegaLambda": 0.7, "HubbleParam": 0.7})
        g = f.create_group("PartType1")
        g.create_dataset("Coordinates", data=rng.uniform(0, 10, (n, 3)).astype(np.float32))
        g.create_dataset("Velocities", data=np.ones((n, 3), np.float32))
        g.create_dataset("ParticleIDs", data=np.arange(n, dtype=np.uint64))
    html = from_gadget_hdf5(path)._repr_html_()
    for needle in ("Gadget import", "snap_003.hdf5", "kpc/h", "z = 3, a = 0.25",
                   "velocity factor", "0.5"):
        assert needle in html, needle


# -------------------------------------------------------------------------- HaloResult
def _halos():
    catalog = xr.Dataset(
        {"n_members": ("halo", np.array([1234, 56, 20])),
         "mass": ("halo", np.array([1234.5678e2, 5600.0, 2000.0])),
         "center_of_mass": (("halo", "axis"), np.array([[1.23456, 2.0, 3.0],
                                                        [4.0, 5.0, 6.0],
                                                        [7.0, 8.0, 9.0]])),
         "r_max": ("halo", np.array([1.98765, 0.5, 0.25]))},
        coords={"halo": np.arange(3), "axis": ["x", "y", "z"]},
        attrs={"linking_length": 0.39372532809214794, "box_size": 100.0,
               "length_unit": "Mpc/h", "mass_unit": "1e10 Msun/h"})
    labels = da.from_array(np.r_[np.zeros(1234), np.ones(56), np.full(20, 2),
                                 -np.ones(690)].astype(np.int64), chunks=500)
    params = {"linking_length": 0.39372532809214794, "linking_length_input": 0.2,
              "absolute": False, "min_members": 20, "min_friends": 1,
              "n_domains": [2, 2, 2], "centers": ["mbp"], "snapshot": "/data/snap.zarr"}
    return HaloResult(labels, catalog, params)


def test_halo_result_repr_is_rounded_with_units():
    text = repr(_halos())
    assert text == ("<HaloResult 3 halos (largest 1234 members, mass 1.235e+05 × 1e10 Msun/h), "
                    "linking length 0.3937 Mpc/h (b = 0.2 mean spacings), min 20 members>")


def test_halo_result_repr_without_halos():
    res = _halos()
    empty = HaloResult(res.labels, res.catalog.isel(halo=slice(0, 0)), res.parameters)
    assert repr(empty).startswith("<HaloResult 0 halos, linking length 0.3937 Mpc/h")
    html = empty._repr_html_()
    assert "largest halos" not in html and "0.393725 Mpc/h" in html


def test_halo_result_html_table():
    html = _halos()._repr_html_()
    assert html.startswith("<div") and html.endswith("</div>") and "<table" in html
    for needle in ("halos", "1,310 of 2,000 (65.5 %)",            # particles in halos
                   "1,234 members", "123457 × 1e10 Msun/h", "1.98765 Mpc/h",
                   "0.393725 Mpc/h (b = 0.2 mean spacings)", "100 Mpc/h",
                   "(2000,)", "int64", "4 chunks of (500,)", "numpy",   # labels array
                   "center_of_mass [Mpc/h]", "1.235, 2, 3",             # largest halos
                   "mass [1e10 Msun/h]", "r_max",
                   "/data/snap.zarr", "2, 2, 2", "mbp"):                # parameters
        assert needle in html, needle
    assert "0.39372532809214794" not in html
