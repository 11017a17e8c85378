"""spherical_overdensity against colossus (Diemer 2018): R_Delta(M_Delta) for 200c, 200m
and vir, the Bryan & Norman virial overdensity, and NFW mass-definition conversions.

Conventions (converted explicitly below):

* colossus masses are in Msun/h; cosmo_dask's (this snapshot's) in 1e10 Msun/h:
  ``M_colossus = 1e10 * M``;
* colossus radii are **physical** kpc/h; cosmo_dask's R_Delta are **comoving** Mpc/h:
  ``R_colossus = 1000 * a * R``;
* the background: cosmo_dask's flat matter + Lambda model (no radiation), so colossus is
  set up flat with ``relspecies=False`` (no photons or neutrinos in E(z)); colossus's
  critical density (2.77536627e11 h^2 Msun/Mpc^3) and G equal cosmo_dask's
  (RHO_CRIT_1E10 = 27.7536627 in 1e10 h^2 Msun/Mpc^3, G_COSMO = 43.0091727) to ~1e-9.
"""

import math

import numpy as np
import pytest

from cosmo_dask.halos import spherical_overdensity
from cosmo_dask.halos.overdensity import bryan_norman_delta
from cosmo_dask.models.cosmology import Cosmology
from cosmo_dask.models.zeldovich_ics import G_COSMO, RHO_CRIT_1E10, ZELDOVICH_UNITS
from cosmo_dask.store.snapshot import Snapshot

colossus = pytest.importorskip("colossus")
from colossus.cosmology import cosmology as col_cosmology  # noqa: E402
from colossus.halo import mass_defs, mass_so, profile_nfw  # noqa: E402

BOX = 40.0
COSMO = {"Omega_m": 0.3, "Omega_b": 0.05, "Omega_L": 0.7, "h": 0.7, "sigma8": 0.8,
         "n_s": 0.96}
M200 = 1.0e4  # M_200c of the sampled halo at Z_HALO, 1e10 Msun/h (1e14 Msun/h)
C200 = 6.0
N200 = 20_000  # particles inside R_200c
Z_HALO = 0.5
CENTRE = np.array([20.0, 21.0, 19.0])


@pytest.fixture(scope="module", autouse=True)
def colossus_cosmology():
    """The snapshot's cosmology in colossus: flat, no relativistic species, H0 = 100 h."""
    params = {"flat": True, "H0": 100.0 * COSMO["h"], "Om0": COSMO["Omega_m"],
              "Ob0": COSMO["Omega_b"], "sigma8": COSMO["sigma8"], "ns": COSMO["n_s"],
              "relspecies": False, "persistence": ""}
    return col_cosmology.setCosmology("cosmo_dask_test", params=params)


def _f(x):
    return np.log1p(x) - x / (1 + x)


def _r200c_comoving(z):
    a = 1 / (1 + z)
    e2 = float(Cosmology.coerce(COSMO).E(a)) ** 2
    return (3 * M200 / (4 * math.pi * 200 * RHO_CRIT_1E10 * e2)) ** (1 / 3) / a


def _snapshot(a, seed=2):
    """One NFW halo (M_200c = M200, c = C200 at Z_HALO), sampled out to 2.5 R_200c, in a
    sparse background; comoving positions in Mpc/h."""
    rng = np.random.default_rng(seed)
    r200 = _r200c_comoving(Z_HALO)
    x_t = 2.5 * C200
    n = int(round(N200 * _f(x_t) / _f(C200)))
    grid = np.geomspace(1e-6, x_t, 20001)
    x = np.interp(rng.random(n) * _f(x_t), _f(grid), grid)
    mu, phi = rng.uniform(-1, 1, n), rng.uniform(0, 2 * np.pi, n)
    s = np.sqrt(1 - mu**2)
    d = (x * r200 / C200)[:, None] * np.stack([s * np.cos(phi), s * np.sin(phi), mu], 1)
    pos = np.concatenate([CENTRE + d, rng.random((2000, 3)) * BOX])
    pos = np.mod(pos, BOX)
    pos[pos >= BOX] = 0.0
    return Snapshot.from_arrays(pos, np.zeros_like(pos), box_size=BOX,
                                particle_mass=M200 / N200, scale_factor=a, cosmology=COSMO,
                                units=dict(ZELDOVICH_UNITS), G=G_COSMO, chunks=10_000)


@pytest.fixture(scope="module")
def results():
    """SO of the same particles read at z = 0, Z_HALO and 2 (the thresholds change)."""
    out = {}
    for z in (0.0, Z_HALO, 2.0):
        a = 1 / (1 + z)
        out[z] = spherical_overdensity(_snapshot(a), CENTRE[None, :],
                                       search_radius=3.2 * _r200c_comoving(Z_HALO))
    return out


@pytest.mark.parametrize("z", [0.0, Z_HALO, 2.0])
def test_r_from_m_matches_colossus(results, z):
    """R_Delta(M_Delta) within 1e-3 of colossus M_to_R (measured: 1.5e-13 at z = 0, 0.5, 2)."""
    res = results[z]
    a = 1 / (1 + z)
    for d in ("200c", "200m", "vir"):
        m, r = float(res[f"M_{d}"][0]), float(res[f"R_{d}"][0])
        assert np.isfinite(m) and m > 0, d
        r_col = mass_so.M_to_R(1e10 * m, z, d)  # Msun/h in, physical kpc/h out
        r_col_comoving = r_col / 1000.0 / a  # -> comoving Mpc/h
        assert r == pytest.approx(r_col_comoving, rel=1e-3), (d, z)


@pytest.mark.parametrize("z", [0.0, 0.5, 1.0, 3.0, 10.0])
def test_bryan_norman_matches_colossus_deltavir(z):
    """Delta_vir (relative to critical) equals colossus deltaVir (measured: 2e-16)."""
    om = float(Cosmology.coerce(COSMO).Omega_m_of_a(1 / (1 + z)))
    assert bryan_norman_delta(om) == pytest.approx(mass_so.deltaVir(z), rel=1e-6)
    # and the density threshold (physical, Msun h^2 / kpc^3) colossus uses for "vir"
    rho_c = mass_so.densityThreshold(z, "vir") / mass_so.deltaVir(z)
    assert rho_c / (RHO_CRIT_1E10 * 1e10 / 1e9 * float(
        Cosmology.coerce(COSMO).E(1 / (1 + z))) ** 2) == pytest.approx(1.0, rel=1e-6)


def test_nfw_concentration_and_mass_conversions_match_colossus(results):
    """At Z_HALO: c from the profile fit within 5 % of the sampled c; the measured M_200m
    and M_vir within 5 % of colossus's NFW conversion of M_200c (both from the input
    M200, c and from the measured M_200c, c_fit); the colossus NFW profile's enclosed
    mass at the measured radii within 5 % of the measured masses.

    Measured (seed 2): c_fit/c - 1 = +0.96 %; M_200m, M_vir vs colossus from the input
    (M200, c): -0.02 %, -0.10 %; from the measured (M_200c, c_fit): +0.08 %, -0.02 %;
    enclosed NFW mass at R_200c, R_200m, R_vir: <= 0.08 %. Seeds 2-4: |c_fit/c - 1| <= 4.0 %,
    conversions <= 0.6 %, enclosed masses <= 0.22 %."""
    res = results[Z_HALO]
    a = 1 / (1 + Z_HALO)
    m200c, c_fit = float(res["M_200c"][0]), float(res["c_nfw_fit"][0])
    assert c_fit == pytest.approx(C200, rel=0.05)
    assert m200c == pytest.approx(M200, rel=0.01)
    for m_in, c_in in ((M200, C200), (m200c, c_fit)):
        for d in ("200m", "vir"):
            m_col, r_col, _ = mass_defs.changeMassDefinition(1e10 * m_in, c_in, Z_HALO,
                                                             "200c", d)
            assert float(res[f"M_{d}"][0]) == pytest.approx(m_col / 1e10, rel=0.05), d
            assert float(res[f"R_{d}"][0]) == pytest.approx(r_col / 1000 / a, rel=0.02), d
    prof = profile_nfw.NFWProfile(M=1e10 * M200, c=C200, z=Z_HALO, mdef="200c")
    # scale radius: colossus physical kpc/h vs the sampled comoving R200c / c
    assert prof.par["rs"] / 1000 / a == pytest.approx(_r200c_comoving(Z_HALO) / C200,
                                                      rel=1e-6)
    for d in ("200c", "200m", "vir"):
        r_phys = float(res[f"R_{d}"][0]) * a * 1000  # comoving Mpc/h -> physical kpc/h
        m_enc = prof.enclosedMass(r_phys) / 1e10
        assert float(res[f"M_{d}"][0]) == pytest.approx(m_enc, rel=0.05), d
