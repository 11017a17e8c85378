"""Power spectrum: Zel'dovich ICs vs linear theory, shot noise, plane waves, multipoles."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft

from cosmo_dask import Snapshot
from cosmo_dask.analysis import plot_power_spectrum, power_spectrum
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.models.cosmology import Cosmology
from cosmo_dask.models.zeldovich_ics import mesh_wavenumbers, white_noise, zeldovich


def lattice(n, box):
    g = (np.arange(n) + 0.5) * (box / n)
    return np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)


def test_zeldovich_ics_match_linear_power_within_sample_variance():
    """64^3 particles, 500 Mpc/h, z = 0: P(k) vs P_lin(k) D^2 over k < k_Nyquist/4.

    sigma_P = (P + shot noise) sqrt(2 / n_modes) per bin (Gaussian sample
    variance); four seeds give 28 bins. The Zel'dovich density at z = 0 is a few
    per cent below linear theory at k ~ 0.1 h/Mpc (nonlinear damping), so the
    mean residual is allowed to be mildly negative.
    """
    n, box = 64, 500.0
    resid = []
    for seed in range(4):
        snap = zeldovich(n, box_size=box, redshift=0.0, seed=seed)
        ds = power_spectrum(snap, n_mesh=64)
        cosmo = Cosmology.coerce(snap.cosmology)
        d = float(cosmo.growth_factor(snap.scale_factor))
        k = ds["k"].values
        sel = ds["k_max"].values <= ds.attrs["k_nyquist"] / 4
        p_lin = cosmo.power_spectrum(k) * d**2
        sigma = (p_lin + float(ds["shot_noise"])) * np.sqrt(2.0 / ds["n_modes"].values)
        resid.append(((ds["power"].values - p_lin) / sigma)[sel])
        assert np.isclose(float(ds["shot_noise"]), box**3 / n**3)
    r = np.concatenate(resid)
    assert r.size >= 24
    chi2_dof = float(np.mean(r**2))
    assert chi2_dof < 2.5, (chi2_dof, r)
    assert -1.2 < r.mean() < 0.6, r


def test_zeldovich_ics_follow_their_own_linear_realisation():
    """Mode by mode (no sample variance): P of the particles over P of the generator's
    linear density field of the same seed, in the lowest bins, against the Zel'dovich
    propagator exp(-k^2 sigma^2) (sigma: the 1D rms of the linear displacement, about
    6 Mpc/h here, computed in the test from the same field): at z = 0 the damping is
    already 6% at k = 0.04 h/Mpc, the mode coupling that adds power back is smaller."""
    n, box, seed = 64, 500.0, 7
    snap = zeldovich(n, box_size=box, redshift=0.0, seed=seed)
    cosmo = Cosmology.coerce(snap.cosmology)
    d = float(cosmo.growth_factor(snap.scale_factor))
    # the generator's linear field, rebuilt here from its white noise
    dk = scipy.fft.rfftn(white_noise(n, seed))
    kx, ky, kz = mesh_wavenumbers(n, box)
    kk = np.sqrt(kx**2 + ky**2 + kz**2)
    kk[0, 0, 0] = 1.0
    dk *= np.sqrt(cosmo.power_spectrum(kk) / (box / n) ** 3) * d
    dk[0, 0, 0] = 0
    dk[n // 2], dk[:, n // 2], dk[:, :, n // 2] = 0, 0, 0
    k2 = kx**2 + ky**2 + kz**2
    k2[0, 0, 0] = 1.0
    sigma2 = np.mean([np.mean(scipy.fft.irfftn(1j * kc / k2 * dk, s=(n, n, n)) ** 2)
                      for kc in (kx, ky, kz)])
    assert 4.0 < np.sqrt(sigma2) < 8.0  # Mpc/h, the linear 1D displacement at z = 0
    lin = power_spectrum(1.0 + scipy.fft.irfftn(dk, s=(n, n, n)), box_size=box, scheme=None)
    ds = power_spectrum(snap, n_mesh=n)
    ratio = (ds["power"] / lin["power"]).values
    kn = ds.attrs["k_nyquist"]
    low = ds["k_max"].values <= kn / 8
    damping = np.exp(-ds["k"].values ** 2 * sigma2)
    assert np.all(np.abs(ratio[low] / damping[low] - 1) < 0.025), ratio[low] / damping[low]
    mid = ds["k_max"].values <= kn / 4
    assert np.all((ratio[mid] > 0.85) & (ratio[mid] < 1.03)), ratio[mid]


def test_uniform_random_is_flat_shot_noise(rng):
    n_part, box = 200_000, 100.0
    pos = rng.uniform(0, box, size=(n_part, 3))
    ds = power_spectrum(pos, n_mesh=64, box_size=box)
    sn = float(ds["shot_noise"])
    assert np.isclose(sn, box**3 / n_part, rtol=1e-12)
    sel = (ds["k_max"].values <= ds.attrs["k_nyquist"] / 2) & (ds["n_modes"].values > 0)
    r = ((ds["power"].values - sn) / (sn * np.sqrt(2.0 / ds["n_modes"].values)))[sel]
    assert np.mean(r**2) < 2.0, r
    nm = ds["n_modes"].values[sel]
    mean = float(np.sum(nm * ds["power"].values[sel]) / nm.sum())  # mode-weighted
    # 3 sigma of the mode-weighted mean (sqrt(2 / sum n_modes) = 1.1 %) plus 1 % for the
    # aliased shot noise left after compensation and interlacing at k < k_Nyquist / 2
    assert abs(mean / sn - 1) < 3 * np.sqrt(2.0 / nm.sum()) + 0.01


def test_shot_noise_with_unequal_masses(rng):
    n_part, box = 100_000, 100.0
    pos = rng.uniform(0, box, size=(n_part, 3))
    mass = rng.uniform(0.1, 3.0, size=n_part)
    ds = power_spectrum(pos, n_mesh=32, box_size=box, mass=mass, scheme="tsc")
    expect = box**3 * np.sum(mass**2) / np.sum(mass) ** 2
    assert np.isclose(float(ds["shot_noise"]), expect, rtol=1e-10)
    sel = ds["k_max"].values <= ds.attrs["k_nyquist"] / 2
    nm = ds["n_modes"].values[sel]
    assert abs(float(np.sum(nm * ds["power"].values[sel]) / nm.sum()) / expect - 1) < 0.03


def test_plane_wave_weights_power_in_right_bin_with_exact_amplitude():
    """Lattice with masses 1 + eps cos(3 k_f x): all power in the 3 k_f bin, value
    V eps^2 / (2 n_modes) divided by the NGP window (particles sit on nodes)."""
    n, box, eps, m = 32, 100.0, 0.1, 3
    pos = lattice(n, box)
    kf = 2 * np.pi / box
    mass = 1.0 + eps * np.cos(m * kf * pos[:, 0])
    for scheme in ("ngp", "cic"):
        ds = power_spectrum(pos, mass=mass, n_mesh=n, box_size=box, scheme=scheme,
                            interlace=False)
        p = ds["power"].values
        i = int(np.argmax(np.nan_to_num(p)))
        assert ds["k_min"].values[i] < m * kf < ds["k_max"].values[i]
        window2 = np.sinc(m * kf * (box / n) / (2 * np.pi)) ** (2 * {"ngp": 1, "cic": 2}[scheme])
        # particles at node positions deposit exactly (CIC too), so the compensation
        # divides by the window
        expect = box**3 * eps**2 / (2 * int(ds["n_modes"][i])) / window2
        np.testing.assert_allclose(p[i], expect, rtol=1e-10)
        others = np.delete(np.nan_to_num(p), i)
        assert others.max() < 1e-20 * p[i]


def test_plane_wave_displacement_and_multipoles():
    """Particles displaced by A sin(k q) along x: power peaks at k; with los = x
    the peak modes have mu = +-1 (P_2 = 5 P_0, P_4 = 9 P_0), with los = y mu = 0
    (P_2 = -5/2 P_0, P_4 = 27/8 P_0)."""
    n, box, m = 32, 100.0, 4
    kf = 2 * np.pi / box
    pos = lattice(n, box)
    pos[:, 0] += 0.3 * np.sin(m * kf * pos[:, 0])
    for los, f2, f4 in ((0, 5.0, 9.0), ("y", -2.5, 27 / 8)):
        ds = power_spectrum(pos, n_mesh=n, box_size=box, los=los, poles=(0, 2, 4))
        p0 = ds["power"].values
        i = int(np.argmax(np.nan_to_num(p0)))
        assert ds["k_min"].values[i] < m * kf < ds["k_max"].values[i]
        # second order: the harmonic at 2k carries (A k)^2-suppressed power
        assert np.nan_to_num(np.delete(p0, i)).max() < 0.05 * p0[i]
        mp = ds["multipoles"]
        np.testing.assert_allclose(mp.sel(ell=0).values[i], p0[i], rtol=1e-12)
        np.testing.assert_allclose(mp.sel(ell=2).values[i], f2 * p0[i], rtol=1e-6)
        np.testing.assert_allclose(mp.sel(ell=4).values[i], f4 * p0[i], rtol=1e-6)


def test_mode_counts_and_bins():
    n, box = 16, 10.0
    pos = lattice(n, box)
    ds = power_spectrum(pos, n_mesh=n, box_size=box)
    kf = 2 * np.pi / box
    # independent count over the full FFT grid
    q = np.fft.fftfreq(n, 1.0 / n)
    kk = kf * np.sqrt(q[:, None, None] ** 2 + q[None, :, None] ** 2 + q[None, None, :] ** 2)
    edges = np.append(ds["k_min"].values, ds["k_max"].values[-1])
    counts = np.histogram(kk[kk > 0], bins=edges)[0]
    np.testing.assert_array_equal(ds["n_modes"].values, counts)
    assert ds.sizes["k"] == n // 2
    np.testing.assert_allclose(ds["k_min"].values[0], 0.5 * kf)
    # the uniform lattice has no power at all
    assert np.nanmax(ds["power"].values) < 1e-25
    custom = power_spectrum(pos, n_mesh=n, box_size=box, k_bins=[0.0, 1.0, 3.0])
    assert custom.sizes["k"] == 2
    assert int(custom["n_modes"].sum()) == int(np.sum((kk > 0) & (kk < 3.0)))


def test_snapshot_and_mesh_inputs_agree(rng):
    from cosmo_dask.density import paint

    box = 50.0
    pos = rng.uniform(0, box, size=(20_000, 3))
    snap = Snapshot.from_arrays(pos=pos, box_size=box, particle_mass=1.0)
    a = power_spectrum(snap, n_mesh=16, scheme="tsc", interlace=False)
    mesh = paint(pos, n_mesh=16, box_size=box, scheme="tsc")
    b = power_spectrum(mesh, box_size=box, scheme="tsc")
    np.testing.assert_allclose(a["power"].values, b["power"].values, rtol=1e-10)
    assert np.isnan(float(b["shot_noise"]))
    # interlacing inside power_spectrum == power of paint(interlace=True)'s mesh
    c = power_spectrum(snap, n_mesh=16, scheme="tsc", interlace=True)
    d = power_spectrum(paint(pos, n_mesh=16, box_size=box, scheme="tsc", interlace=True),
                       box_size=box, scheme="tsc")
    # equal except in the Nyquist bin, where the real mesh of paint(interlace=True)
    # cannot hold the complex Nyquist-plane modes of the interlaced transform
    np.testing.assert_allclose(c["power"].values[:-1], d["power"].values[:-1], rtol=1e-8)


def test_plot_helper(tmp_path, rng):
    ds = power_spectrum(rng.uniform(0, 10, (5000, 3)), n_mesh=16, box_size=10.0, los=2,
                        poles=(0, 2))
    fig = plot_power_spectrum(ds, tmp_path / "pk.png", reference=lambda k: 0 * k + 1)
    assert (tmp_path / "pk.png").stat().st_size > 0
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_bad_input(rng):
    pos = rng.uniform(0, 10, (100, 3))
    with pytest.raises(ParameterError, match="n_mesh"):
        power_spectrum(pos, box_size=10.0)
    with pytest.raises(ParameterError, match="n_mesh"):
        power_spectrum(pos, n_mesh=0, box_size=10.0)
    with pytest.raises(ParameterError, match="box_size"):
        power_spectrum(pos, n_mesh=8)
    with pytest.raises(ParameterError, match="scheme"):
        power_spectrum(pos, n_mesh=8, box_size=10.0, scheme="nearest")
    with pytest.raises(ParameterError, match="line of sight"):
        power_spectrum(pos, n_mesh=8, box_size=10.0, poles=(0, 2))
    with pytest.raises(ParameterError, match="poles"):
        power_spectrum(pos, n_mesh=8, box_size=10.0, los=0, poles=(1,))
    with pytest.raises(ParameterError, match="los"):
        power_spectrum(pos, n_mesh=8, box_size=10.0, los=(0, 0, 0), poles=(2,))
    with pytest.raises(ParameterError, match="k_bins"):
        power_spectrum(pos, n_mesh=8, box_size=10.0, k_bins=[1.0, 0.5])
    with pytest.raises(ParameterError, match="box_size"):
        power_spectrum(np.ones((8, 8, 8)), scheme=None)
    with pytest.raises(ParameterError, match="cubic"):
        power_spectrum(np.ones((8, 8, 4)), box_size=1.0, scheme=None)


# ----------------------------------------------------------------------------- slabs
def reference_power(pos, mass, n, box, scheme, interlace, los, poles):
    """Whole-mesh NumPy P(k) and multipoles: test_paint's direct painting, numpy.fft.rfftn of
    the whole mesh, window division, binning with the half-space mode weights (2 for
    0 < kz < k_Nyquist: the mode and its conjugate; 1 on the kz = 0 and Nyquist planes)."""
    from tests.support.density import reference_paint

    h = box / n
    p = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}[scheme]
    m0 = reference_paint(pos, mass, n, box, scheme)
    f = np.fft.rfftn(m0)
    q = 2 * np.pi * np.fft.fftfreq(n)  # k H
    qx, qy, qz = np.meshgrid(q, q, 2 * np.pi * np.fft.rfftfreq(n), indexing="ij")
    if interlace:
        m1 = reference_paint(pos, mass, n, box, scheme, shift=0.5)
        f = 0.5 * (f + np.fft.rfftn(m1) * np.exp(0.5j * (qx + qy + qz)))
    f /= m0.sum()
    w2 = (np.sinc(qx / (2 * np.pi)) * np.sinc(qy / (2 * np.pi))
          * np.sinc(qz / (2 * np.pi))) ** (2 * p)
    power = np.abs(f) ** 2 / w2 * box**3
    weight = np.full(qz.shape, 2.0)
    weight[:, :, 0] = 1.0
    if n % 2 == 0:
        weight[:, :, -1] = 1.0
    kk = np.sqrt(qx**2 + qy**2 + qz**2) / h
    edges = 2 * np.pi / box * (np.arange(n // 2 + 1) + 0.5)
    idx = np.searchsorted(edges, kk.ravel(), side="right") - 1
    use = (idx >= 0) & (idx < n // 2) & (kk.ravel() > 0)
    w = weight.ravel()[use]
    counts = np.bincount(idx[use], weights=w, minlength=n // 2)
    mu = (los[0] * qx + los[1] * qy + los[2] * qz).ravel()[use] / (kk.ravel()[use] * h)
    leg = {0: 1.0, 2: 0.5 * (3 * mu**2 - 1), 4: (35 * mu**4 - 30 * mu**2 + 3) / 8}
    return np.stack([(2 * ell + 1) * np.bincount(idx[use], weights=w * power.ravel()[use]
                                                 * leg[ell], minlength=n // 2) / counts
                     for ell in poles])


@pytest.mark.parametrize("interlace", [True, False])
@pytest.mark.parametrize("n_slabs, chunks", [(1, 3000), (2, 700), (3, 1100), (7, 3000),
                                             (14, 700)])
def test_slab_power_matches_numpy_reference(rng, interlace, n_slabs, chunks):
    """P(k), P_2, P_4 painted, transformed and binned slab by slab equal a whole-mesh NumPy
    estimate to float64 rounding, for any slab count and particle chunking."""
    import dask.array as da

    n, box = 14, 100.0
    pos = rng.uniform(0, box, (6000, 3))
    mass = rng.uniform(0.5, 2.0, 6000)
    los = np.array([0.6, 0.0, 0.8])
    ref = reference_power(pos, mass, n, box, "tsc", interlace, los, (0, 2, 4))
    ds = power_spectrum(da.from_array(pos, chunks=(chunks, 3)), box_size=box, n_mesh=n,
                        mass=da.from_array(mass, chunks=chunks), scheme="tsc",
                        interlace=interlace, los=los, poles=(0, 2, 4), slabs=n_slabs)
    np.testing.assert_allclose(ds["multipoles"].values, ref, rtol=0,
                               atol=1e-12 * np.abs(ref).max())


def test_slab_power_float32_and_cluster(rng, client):
    """float32 (painting and FFT) within 1e-6 of the float64 reference; the two-worker
    cluster gives the threaded scheduler's numbers bit for bit; a mesh input in slabs."""
    import dask
    import dask.array as da

    n, box = 16, 50.0
    pos = rng.uniform(0, box, (20_000, 3))
    ref = reference_power(pos, np.ones(len(pos)), n, box, "cic", True, (0, 0, 1), (0,))[0]
    p = da.from_array(pos, chunks=(5000, 3))
    with dask.config.set(scheduler="threads"):
        local = power_spectrum(p, n_mesh=n, box_size=box, precision="float32", slabs=4)
    assert np.abs(local["power"].values - ref).max() <= 1e-6 * ref.max()
    remote = power_spectrum(p, n_mesh=n, box_size=box, precision="float32", slabs=4)
    np.testing.assert_array_equal(remote["power"].values, local["power"].values)
    from tests.support.density import reference_paint

    mesh = reference_paint(pos, 1.0, n, box, "cic")
    for n_slabs in (1, 5):
        ds = power_spectrum(mesh, box_size=box, scheme="cic", slabs=n_slabs)
        ref_plain = reference_power(pos, np.ones(len(pos)), n, box, "cic", False, (0, 0, 1),
                                    (0,))[0]
        np.testing.assert_allclose(ds["power"].values, ref_plain, rtol=0,
                                   atol=1e-12 * ref_plain.max())
