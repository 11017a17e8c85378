"""Snapshot.to_redshift_space: the shift v_los / (a H(a)) against hand-computed values, the
periodic wrap, vector lines of sight, the recorded line of sight, the errors, and the
Kaiser multipoles of 2LPT initial conditions (issue 34, item 2)."""

from __future__ import annotations

import math

import dask
import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.analysis import power_spectrum
from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.models.cosmology import Cosmology
from cosmo_dask.models.lpt import lpt_ics
from cosmo_dask.store.snapshot import open_snapshot
from cosmo_dask.units.hubble import hubble_e
from tests.support.kaiser import kaiser_bin_ratios, kaiser_continuum

UNITS = {"length": "Mpc/h", "velocity": "km/s (peculiar)", "mass": "1e10 Msun/h"}
COSMO = {"Omega_m": 0.3, "Omega_L": 0.7, "h": 0.7}
BACKENDS = [pytest.param("cpu"), pytest.param("gpu", marks=pytest.mark.gpu)]


def one_snapshot(pos, vel, *, box=100.0, a=0.5, cosmology=COSMO, units=UNITS, dtype=None):
    pos = np.asarray(pos, dtype=dtype or np.float64).reshape(-1, 3)
    vel = None if vel is None else np.asarray(vel, dtype=pos.dtype).reshape(-1, 3)
    return Snapshot.from_arrays(pos, vel, box_size=box, scale_factor=a, cosmology=cosmology,
                                units=units, particle_mass=1.0)


def host(x):
    x = x.compute()
    return x.get() if hasattr(x, "get") else np.asarray(x)


# ------------------------------------------------------------------ the shift, analytic
@pytest.mark.parametrize("device", BACKENDS)
def test_a_particle_moves_by_v_over_aH(device):
    """a = 0.5, Omega_m = 0.3, Omega_L = 0.7: E = sqrt(0.3 * 8 + 0.7) = sqrt(3.1), so
    a H = 50 sqrt(3.1) km/s per Mpc/h and v = 300 km/s moves 300 / (50 sqrt 3.1) Mpc/h."""
    snap = one_snapshot([[10.0, 20.0, 30.0], [1.0, 2.0, 3.0]],
                        [[300.0, -200.0, 300.0], [0.0, 0.0, -120.0]]).to_device(device)
    out = snap.to_redshift_space("z")
    assert out.device == device
    shift = 1.0 / (0.5 * 100.0 * math.sqrt(3.1))
    got = host(out.pos)
    np.testing.assert_allclose(got, [[10.0, 20.0, 30.0 + 300.0 * shift],
                                     [1.0, 2.0, 3.0 - 120.0 * shift]], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(host(out.vel), host(snap.vel))  # velocities kept
    assert out.los == (0.0, 0.0, 1.0) and out.attrs["los"] == [0.0, 0.0, 1.0]
    assert snap.los is None


@pytest.mark.parametrize(("units", "per_kms"), [
    # Mpc (no /h): a H = a 100 h E km/s/Mpc
    ({"length": "Mpc", "velocity": "km/s", "mass": "Msun"}, 1.0 / (0.5 * 70.0 * math.sqrt(3.1))),
    # kpc/h: a thousand times the Mpc/h figure
    ({"length": "kpc/h", "velocity": "km/s", "mass": "Msun"},
     1000.0 / (0.5 * 100.0 * math.sqrt(3.1))),
    # velocities in m/s
    ({"length": "Mpc/h", "velocity": "m/s", "mass": "Msun"},
     1e-3 / (0.5 * 100.0 * math.sqrt(3.1))),
])
def test_the_shift_is_in_the_snapshots_units(units, per_kms):
    snap = one_snapshot([50.0, 50.0, 50.0], [0.0, 100.0, 0.0], units=units, box=1e5)
    got = host(snap.to_redshift_space("y").pos)[0]
    np.testing.assert_allclose(got, [50.0, 50.0 + 100.0 * per_kms, 50.0], rtol=1e-14)


def test_curvature_enters_E_as_the_cosmology_does():
    """Omega_m = 0.3, Omega_L = 0.6: E(a)^2 = 0.3 a^-3 + 0.1 a^-2 + 0.6; Omega_L left out
    is flat (1 - Omega_m)."""
    a = 0.25
    e_open = math.sqrt(0.3 / a**3 + 0.1 / a**2 + 0.6)
    assert float(hubble_e(a, 0.3, 0.6)) == pytest.approx(e_open, rel=1e-15)
    assert float(hubble_e(a, 0.3)) == pytest.approx(math.sqrt(0.3 / a**3 + 0.7), rel=1e-15)
    snap = one_snapshot([5.0, 5.0, 5.0], [0.0, 0.0, 10.0], a=a,
                        cosmology={"Omega_m": 0.3, "Omega_L": 0.6, "h": 0.7})
    got = host(snap.to_redshift_space(2).pos)[0, 2]
    assert got == pytest.approx(5.0 + 10.0 / (a * 100.0 * e_open), rel=1e-14)
    # the models' Cosmology uses the same E(a)
    c = Cosmology(Omega_m=0.3111)
    assert float(c.E(a)) == float(hubble_e(a, c.Omega_m, c.Omega_L))


def test_positions_wrap_periodically_and_keep_their_dtype():
    aH = 0.5 * 100.0 * math.sqrt(3.1)
    box = 100.0
    # +5 Mpc/h from 98 and -5 from 2: 3 and 97
    snap = one_snapshot([[1.0, 1.0, 98.0], [1.0, 1.0, 2.0]],
                        [[0.0, 0.0, 5.0 * aH], [0.0, 0.0, -5.0 * aH]], box=box,
                        dtype=np.float32)
    out = snap.to_redshift_space("z")
    got = host(out.pos)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got[:, 2], [3.0, 97.0], atol=2e-5)
    assert np.all((got >= 0) & (got < box))


def test_a_vector_line_of_sight_moves_along_it():
    """los (1, 1, 0) (normalised): v = (v, 0, 0) has v/sqrt 2 along it, so the particle
    moves by v/(2 aH) in x and in y; a velocity across the line of sight does nothing."""
    aH = 0.5 * 100.0 * math.sqrt(3.1)
    snap = one_snapshot([[10.0, 10.0, 10.0], [20.0, 20.0, 20.0]],
                        [[4.0 * aH, 0.0, 0.0], [3.0 * aH, -3.0 * aH, 7.0 * aH]])
    out = snap.to_redshift_space([2.0, 2.0, 0.0])
    np.testing.assert_allclose(host(out.pos), [[12.0, 12.0, 10.0], [20.0, 20.0, 20.0]],
                               atol=1e-12)
    np.testing.assert_allclose(out.los, [2**-0.5, 2**-0.5, 0.0], rtol=1e-15)
    assert "redshift space along (0.7071, 0.7071, 0)" in repr(out)


def test_it_is_lazy_and_keeps_the_chunks(rng):
    pos = rng.uniform(0, 100.0, (1000, 3))
    snap = Snapshot.from_arrays(pos, rng.normal(0, 300, (1000, 3)), np.arange(1000),
                                box_size=100.0, scale_factor=0.5, cosmology=COSMO,
                                units=UNITS, particle_mass=1.0, chunks=300)

    def refuse(*args, **kwargs):
        raise AssertionError("to_redshift_space computed something")

    with dask.config.set(scheduler=refuse):
        out = snap.to_redshift_space("x")
    assert out.chunks == snap.chunks and out.pos.chunks == snap.pos.chunks
    assert out.ids is snap.ids
    moved = host(out.pos)
    assert np.all((moved >= 0) & (moved < 100.0))


def test_the_line_of_sight_is_stored(tmp_path):
    snap = one_snapshot([[1.0, 2.0, 3.0]], [[10.0, 20.0, 30.0]]).to_redshift_space("x")
    snap.to_zarr(tmp_path / "s.zarr")
    back = open_snapshot(tmp_path / "s.zarr")
    assert back.los == (1.0, 0.0, 0.0)
    np.testing.assert_array_equal(host(back.pos), host(snap.pos))
    # a real-space store has no 'los' attribute at all (stores stay as they were)
    one_snapshot([[1.0, 2.0, 3.0]], [[0.0, 0.0, 0.0]]).to_zarr(tmp_path / "r.zarr")
    assert open_snapshot(tmp_path / "r.zarr").los is None
    assert "los" not in one_snapshot([[1.0, 2.0, 3.0]], None).store_attrs()


@pytest.mark.parametrize("bad", [[0.0, 0.0, 2.0], [1.0, 0.0], "z", [math.nan, 0.0, 1.0]])
def test_a_bad_stored_line_of_sight_is_refused(bad):
    snap = one_snapshot([[1.0, 2.0, 3.0]], [[0.0, 0.0, 0.0]])
    attrs = snap.attrs
    attrs["los"] = bad
    with pytest.raises(SnapshotError, match="attribute 'los'"):
        Snapshot(snap.arrays, attrs)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("change", "match"), [
    ({"vel": None}, "no velocities"),
    ({"box": None}, "not periodic"),
    ({"a": None}, "no scale_factor"),
    ({"cosmology": None}, "no cosmology"),
    ({"cosmology": {"h": 0.7}}, "no cosmology"),
    ({"units": None}, "no length and no velocity unit"),
    ({"units": {"length": "N-body length", "velocity": "N-body velocity",
                "mass": "N-body mass"}}, "physical length and velocity units"),
    ({"units": {"length": "Mpc", "velocity": "km/s", "mass": "Msun"},
      "cosmology": {"Omega_m": 0.3}}, "needs the Hubble parameter h"),
])
def test_what_is_missing_is_named(change, match):
    kwargs = {"box": 100.0, "a": 0.5, "cosmology": COSMO, "units": UNITS}
    vel = change.pop("vel", [0.0, 0.0, 1.0])
    kwargs.update(change)
    snap = one_snapshot([1.0, 2.0, 3.0], vel, **kwargs)
    with pytest.raises(ParameterError, match=match) as info:
        snap.to_redshift_space("z")
    assert "\n" not in str(info.value) and str(info.value).startswith("to_redshift_space: ")


@pytest.mark.parametrize("los", ["w", 3, -1, [0.0, 0.0, 0.0], [1.0, 2.0], [1.0, np.inf, 0.0],
                                 True, None])
def test_a_bad_line_of_sight_is_refused(los):
    snap = one_snapshot([1.0, 2.0, 3.0], [0.0, 0.0, 1.0])
    with pytest.raises(ParameterError, match="to_redshift_space: los"):
        snap.to_redshift_space(los)


def test_a_second_shift_is_refused():
    snap = one_snapshot([1.0, 2.0, 3.0], [0.0, 0.0, 1.0]).to_redshift_space("z")
    with pytest.raises(ParameterError, match="already in redshift space"):
        snap.to_redshift_space("x")


# ------------------------------------------------------------------ Kaiser
#: 32^3 2LPT particles with fixed amplitudes in 1000 Mpc/h at z = 20: f(a) = 0.99987,
#: the displacements are linear (rms 0.4 Mpc/h against 31 Mpc/h cells)
N_SIDE, BOX, REDSHIFT = 32, 1000.0, 20.0


@pytest.fixture(scope="module")
def ics():
    return lpt_ics(N_SIDE, box_size=BOX, redshift=REDSHIFT, order=2, fixed_amplitude=True,
                   seed=5, precision="float64").persist()


@pytest.mark.parametrize("los", ["z", "x", (1.0, 1.0, 1.0)])
def test_kaiser_multipoles_of_2lpt_initial_conditions(ics, los):
    """P_0^s / P_0^r and P_2^s / P_0^r over k <= k_Nyquist / 2 (8 bins of width k_f, 18 to
    760 modes) within 3% of Kaiser's factor summed over each bin's own modes,
    sum w (2l+1) (1 + f mu^2)^2 L_l(mu) / sum w (w = the linear P(k): the ICs' fixed
    amplitudes; tests/support/kaiser.py), f from Cosmology.growth_rate. Measured (seed 5):
    at most 0.10% (monopole) and 0.65% (quadrupole) along z, 0.10% and 0.55% along x,
    0.09% and 0.29% along (1, 1, 1); over seeds 0-9 along z and (1, 1, 1), at most 0.24%
    and 1.2%.

    PCS painting: the lattice particles sit at the same place in every mesh cell, and
    CIC's and TSC's kernels have a kink there (CIC) or near it, so their painted density
    answers a displacement by its size (|psi|), not linearly: per-mode errors of 1-7% in
    the quadrupole at k_Nyquist / 4, whatever the amplitude; PCS (smooth to the second
    derivative) stays linear."""
    cosmo = Cosmology.coerce(ics.cosmology)
    f = float(cosmo.growth_rate(ics.scale_factor))
    rs = ics.to_redshift_space(los)
    real = power_spectrum(ics, n_mesh=N_SIDE, scheme="pcs")
    red = power_spectrum(rs, n_mesh=N_SIDE, scheme="pcs", poles=(0, 2, 4))  # los: rs's own
    assert red.attrs["los"] == list(rs.los)
    edges = np.r_[real["k_min"].values, real["k_max"].values[-1]]
    n_modes, expected = kaiser_bin_ratios(N_SIDE, BOX, edges, rs.los, f,
                                          weight=cosmo.power_spectrum)
    np.testing.assert_array_equal(n_modes, red["n_modes"].values)  # the same modes
    sel = red["k_min"].values < red.attrs["k_nyquist"] / 2  # bins centred on 1..8 k_f
    assert sel.sum() == 8
    ratio = red["multipoles"].values / real["power"].values
    dev = ratio[:2, sel] / expected[:2, sel] - 1.0
    assert np.all(np.abs(dev) < 0.03), dev
    # the discrete expectation itself is Kaiser's continuum factor on average over the
    # bins' modes (to 3%: 1.867 and 1.904 for f = 1), the finite box's mu being discrete
    mean = (expected[:2, sel] * n_modes[sel]).sum(axis=1) / n_modes[sel].sum()
    cont = kaiser_continuum(f)
    np.testing.assert_allclose(mean, [cont[0], cont[2]], rtol=0.03)


def test_power_spectrum_takes_the_snapshots_line_of_sight(ics):
    rs = ics.to_redshift_space("y")
    own = power_spectrum(rs, n_mesh=16, poles=(0, 2))
    given = power_spectrum(rs, n_mesh=16, poles=(0, 2), los="y")
    np.testing.assert_array_equal(own["multipoles"].values, given["multipoles"].values)
    assert own.attrs["los"] == [0.0, 1.0, 0.0]
    # another line of sight given explicitly wins; real space still needs one
    other = power_spectrum(rs, n_mesh=16, poles=(0, 2), los="x")
    assert other.attrs["los"] == [1.0, 0.0, 0.0]
    with pytest.raises(ParameterError, match="line of sight"):
        power_spectrum(ics, n_mesh=16, poles=(0, 2))


def test_cosmo_dask_power_takes_a_stored_line_of_sight(tmp_path, _session_client):
    """``cosmo-dask power STORE --poles 0,2`` without ``--los`` on a redshift-space store
    measures along its recorded line of sight (real space: still a one-line error)."""
    import pandas as pd

    from cosmo_dask.cli import main

    path, table = tmp_path / "rs.zarr", tmp_path / "pk.csv"
    rs = lpt_ics(16, box_size=BOX, redshift=REDSHIFT, seed=5).to_redshift_space("y")
    rs.to_zarr(path)
    argv = ["--scheduler", _session_client.scheduler.address, "power", str(path),
            "--n-mesh", "16", "--poles", "0,2", "--out", str(table)]
    assert main(argv) == 0
    got = pd.read_csv(table)
    expected = power_spectrum(open_snapshot(path), n_mesh=16, los="y", poles=(0, 2))
    np.testing.assert_allclose(got.loc[got["ell"] == 2, "multipoles"].values,
                               expected["multipoles"].sel(ell=2).values, rtol=1e-12)
