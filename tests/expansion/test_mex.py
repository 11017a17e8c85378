"""MEX (multipole expansion) against independent float64 references.

References written here: the shell theorem (sorted cumulative mass), the
truncated multipole sum per pair through Legendre polynomials (forces) and
through scipy's spherical harmonics (potentials), and the Ferrers ellipsoid
force by 1-D quadrature of the homoeoid formula.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from scipy.integrate import quad

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.expansion import MEX
from cosmo_dask.expansion import mex_kernels as cpu
from cosmo_dask.models import ferrers
from tests.support.devices import DEVICES, array_module, to_host
from tests.support.expansion import blob, legendre_reference, rel_err, self_masks, shell_reference
from tests.support.kernels import solid_harmonics


def sph_harm_potential(x, src, m, inner, lmax, G=1.0, skip=None):
    """Phi(x) = -G sum_lm 4pi/(2l+1) [q_lm r^-(l+1) + p_lm r^l] Y_lm (scipy sph_harm_y)."""
    from scipy.special import sph_harm_y

    def angles(p):
        r = np.sqrt((p * p).sum(1))
        return r, np.arccos(np.clip(p[:, 2] / r, -1, 1)), np.arctan2(p[:, 1], p[:, 0])

    r, th, ph = angles(x)
    rj, thj, phj = angles(src)
    skip = np.zeros(inner.shape, bool) if skip is None else skip
    outer = ~inner & ~skip
    inner = inner & ~skip
    phi = np.zeros(x.shape[0])
    for l in range(lmax + 1):
        for mm in range(-l, l + 1):
            Yj = np.conj(sph_harm_y(l, mm, thj, phj))
            q = inner.astype(float) @ (m * rj**l * Yj)
            p = outer.astype(float) @ (m * rj ** (-(l + 1.0)) * Yj)
            Y = sph_harm_y(l, mm, th, ph)
            phi -= G * 4 * np.pi / (2 * l + 1) * np.real((q * r ** (-(l + 1.0)) + p * r**l) * Y)
    return phi


# ----------------------------------------------------------------------------- tests
def test_solid_harmonics_against_scipy(rng):
    from scipy.special import sph_harm_y

    x = rng.normal(size=(50, 3))
    x[0] = [0, 0, 1.3]
    x[1] = [0, 0, -0.4]
    T = solid_harmonics(x, 12)
    r = np.linalg.norm(x, axis=1)
    th, ph = np.arccos(x[:, 2] / r), np.arctan2(x[:, 1], x[:, 0])
    worst = 0.0
    for l in range(13):
        for m in range(l + 1):
            # T_lm = sqrt(4pi (2 - d_m0) / (2l+1)) r^l (-1)^m Y_lm (Y with Condon-Shortley)
            ref = np.sqrt(4 * np.pi * (2 - (m == 0)) / (2 * l + 1)) * r**l * (-1) ** m \
                * sph_harm_y(l, m, th, ph)
            got = T[:, l * l] if m == 0 else T[:, l * l + 2 * m - 1] + 1j * T[:, l * l + 2 * m]
            worst = max(worst, np.max(np.abs(got - ref) / np.maximum(r**l, 1e-300)))
    assert worst < 1e-12


@pytest.mark.parametrize("chunks", [1000, 250])
def test_lmax0_is_shell_theorem(rng, chunks):
    x, m = blob(rng, 1000)
    x[5] = x[6] * (np.linalg.norm(x[7]) / np.linalg.norm(x[6]))  # equal radii: 5, 6, 7
    x[6] = x[7][[1, 0, 2]]
    mex = MEX(lmax=0).fit(da.from_array(x, chunks=(chunks, 3)), da.from_array(m, chunks))
    acc, phi = dask.compute(mex.accelerations(), mex.potential())
    ref_acc, ref_phi = shell_reference(x - mex.center_, m)
    first = np.argmin(np.linalg.norm(x - mex.center_, axis=1))
    assert np.all(acc[first] == 0.0)  # nothing inside the innermost particle
    keep = np.arange(x.shape[0]) != first
    assert rel_err(acc[keep], ref_acc[keep]).max() < 1e-12
    assert rel_err(phi, ref_phi).max() < 1e-12


def test_lmax0_softened(rng):
    x, m = blob(rng, 500)
    eps = 0.3
    mex = MEX(lmax=0, softening=eps).fit(x, m)
    acc, phi = dask.compute(mex.accelerations(), mex.potential())
    rel = x - mex.center_
    r = np.linalg.norm(rel, axis=1)
    order = np.lexsort((np.arange(r.size), r))
    m_in = np.zeros(r.size)
    m_in[order] = np.cumsum(m[order]) - m[order]
    s = r**2 + eps**2
    ref = -m_in[:, None] * rel / s[:, None] ** 1.5
    out = np.zeros(r.size)
    w = m[order] / np.sqrt(s[order])
    out[order] = np.cumsum(w[::-1])[::-1] - w
    keep = m_in > 0
    assert rel_err(acc[keep], ref[keep]).max() < 1e-12
    assert rel_err(phi, -(m_in / np.sqrt(s) + out)).max() < 1e-12


@pytest.mark.parametrize("lmax", [1, 4, 6])
def test_multipoles_against_pair_reference(rng, lmax):
    n = 2000
    x, m = blob(rng, n)
    mex = MEX(lmax=lmax).fit(da.from_array(x, chunks=(600, 3)), da.from_array(m, 600))
    acc, phi = dask.compute(mex.accelerations(), mex.potential())
    rel = x - mex.center_
    inner = self_masks(rel)
    eye = np.eye(n, dtype=bool)
    ref_acc, ref_phi = legendre_reference(rel, rel, m, inner, lmax, skip=eye)
    err_a = rel_err(acc, ref_acc)
    err_p = rel_err(phi, ref_phi)
    assert err_a.max() < 1e-10, err_a.max()
    assert err_p.max() < 1e-10, err_p.max()
    # potential also against scipy spherical harmonics (q_lm, p_lm sums), a subset
    sub = rng.choice(n, 300, replace=False)
    phi_y = sph_harm_potential(rel[sub], rel, m, inner[sub], lmax, skip=eye[sub])
    assert rel_err(phi[sub], phi_y).max() < 1e-10


def test_points_against_pair_reference(rng):
    n, lmax = 1500, 5
    x, m = blob(rng, n)
    mex = MEX(lmax=lmax).fit(da.from_array(x, chunks=(400, 3)), da.from_array(m, 400))
    pts = rng.normal(size=(300, 3)) * 1.5
    pts[:3] = [[0, 0, 0.9], [0, 0, -2.0], [10.0, -3.0, 4.0]]
    pd = da.from_array(pts, chunks=(100, 3))
    acc, phi = dask.compute(mex.accelerations(pd), mex.potential(pd))
    rel = x - mex.center_
    prel = pts - mex.center_
    inner = np.linalg.norm(rel, axis=1)[None, :] <= np.linalg.norm(prel, axis=1)[:, None]
    ref_acc, ref_phi = legendre_reference(prel, rel, m, inner, lmax)
    assert rel_err(acc, ref_acc).max() < 1e-10
    assert rel_err(phi, ref_phi).max() < 1e-10
    # NumPy input (not dask) gives the same
    np.testing.assert_array_equal(mex.accelerations(pts).compute(), acc)


def _chunked(x, m, nchunks):
    c = -(-x.shape[0] // nchunks)
    return da.from_array(x, chunks=(c, 3)), da.from_array(m, chunks=c)


def test_chunks_and_workers_agree(rng, client):
    x, m = blob(rng, 3000)
    results = []
    with dask.config.set(scheduler="sync"):
        for nchunks in (1, 4, 16):
            mex = MEX(lmax=4).fit(*_chunked(x, m, nchunks))
            results.append(dask.compute(mex.accelerations(), mex.potential()))
    mex = MEX(lmax=4).fit(*_chunked(x, m, 4))  # the 2-worker client (fixture)
    assert len(client.scheduler_info()["workers"]) == 2
    results.append(dask.compute(mex.accelerations(), mex.potential()))
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c1:
        mex = MEX(lmax=4).fit(*_chunked(x, m, 16))
        results.append(c1.compute([mex.accelerations(), mex.potential()], sync=True))
    ref_acc, ref_phi = results[0]
    for acc, phi in results[1:]:
        assert rel_err(acc, ref_acc).max() < 1e-12
        assert rel_err(phi, ref_phi).max() < 1e-12


def test_z_axis_and_centre_are_finite(rng):
    x, m = blob(rng, 400)
    x -= (m[:, None] * x).sum(0) / m.sum()
    x[:5] = [[0, 0, 0.2], [0, 0, -0.2], [0, 0, 3.0], [0, 0, 1e-8], [0, 0, 0]]
    for eps in (0.0, 0.05):
        mex = MEX(lmax=8, softening=eps, center=(0.0, 0.0, 0.0)).fit(x, m)
        acc, phi = dask.compute(mex.accelerations(), mex.potential())
        assert np.all(np.isfinite(acc)) and np.all(np.isfinite(phi))
        if eps == 0.0:  # at r = 0 only l <= 1 survive: the exact direct field
            d = x[np.arange(len(x)) != 4]
            w = m[np.arange(len(x)) != 4]
            rd = np.linalg.norm(d, axis=1)
            direct = (w[:, None] * d / rd[:, None] ** 3).sum(0)
            np.testing.assert_allclose(acc[4], direct, rtol=1e-12)
            np.testing.assert_allclose(phi[4], -(w / rd).sum(), rtol=1e-12)
        pts = np.array([[0, 0, 0.0], [0, 0, 0.5], [0, 0, -5.0]])
        assert np.all(np.isfinite(mex.accelerations(pts).compute()))
        assert np.all(np.isfinite(mex.potential(pts).compute()))
    # on the z axis (not at r=0) the eps=0 result matches the pair reference
    x2, m2 = np.delete(x, 4, axis=0), np.delete(m, 4)  # without the particle at r=0
    mex = MEX(lmax=8, center=(0.0, 0.0, 0.0)).fit(x2, m2)
    acc = mex.accelerations().compute()
    rel = x2 - mex.center_
    inner = self_masks(rel)
    n = rel.shape[0]
    ra, _ = legendre_reference(rel[:4], rel, m2, inner[:4], 8,
                               skip=np.eye(n, dtype=bool)[:4])
    assert rel_err(acc[:4], ra).max() < 1e-10


def test_float32_close_to_float64(rng):
    x, m = blob(rng, 2000)
    a64 = MEX(lmax=6).fit(x, m).accelerations().compute()
    mex32 = MEX(lmax=6, precision="float32").fit(x.astype(np.float32), m.astype(np.float32))
    a32 = mex32.accelerations().compute()
    assert a32.dtype == np.float32
    err = rel_err(a32.astype(np.float64), a64)
    assert np.median(err) < 1e-5 and np.percentile(err, 99) < 1e-3


def ferrers_force(x, axes, M=1.0, G=1.0):
    """Interior force of a Ferrers n=1 ellipsoid by quadrature of the homoeoid formula."""
    a = np.asarray(axes, float)
    rho0 = 15 * M / (8 * np.pi * a.prod())
    out = np.empty(3)
    for i in range(3):
        def f(u, i=i):
            m2 = np.sum(x**2 / (a**2 + u))
            return (1 - m2) / ((a[i] ** 2 + u) * np.sqrt(np.prod(a**2 + u)))

        out[i] = -2 * np.pi * G * rho0 * a.prod() * x[i] * quad(f, 0, np.inf, epsabs=0,
                                                                  epsrel=1e-11, limit=200)[0]
    return out


def test_ferrers_quadrature_reference_is_right():
    # sphere a = 1: F = -G M(<r) / r^2 with M(<r) = 4 pi rho0 (r^3/3 - r^5/5)
    rho0 = 15 / (8 * np.pi)
    for p in ([0.3, -0.2, 0.5], [0.0, 0.0, 0.9]):
        p = np.array(p)
        r = np.linalg.norm(p)
        ref = -4 * np.pi * rho0 * (r**3 / 3 - r**5 / 5) / r**3 * p
        np.testing.assert_allclose(ferrers_force(p, (1, 1, 1)), ref, rtol=1e-9, atol=1e-14)


def test_ferrers_lmax10_n1e5(rng):
    axes = (1.0, 2 / 3, 1 / 3)  # 3:2:1
    snap = ferrers(100_000, axes=axes, index=1, mass=1.0, seed=3, chunks=25_000)
    mex = MEX(lmax=10).fit(snap)
    acc = mex.accelerations().compute()
    pos = snap.pos.compute()
    sub = rng.choice(pos.shape[0], 400, replace=False)
    ref = np.array([ferrers_force(pos[i], axes) for i in sub])
    err = rel_err(acc[sub], ref)
    med, p90 = np.median(err), np.percentile(err, 90)
    print(f"Ferrers 3:2:1 n=1, N=1e5, lmax=10: median {med:.3g}, p90 {p90:.3g}")
    assert med <= 3e-2
    assert p90 < 0.1


def test_bad_input():
    with pytest.raises(ParameterError, match="lmax"):
        MEX(lmax=-1)
    with pytest.raises(ParameterError, match="lmax"):
        MEX(lmax=33)
    with pytest.raises(ParameterError, match="lmax"):
        MEX(lmax=2.5)
    with pytest.raises(ParameterError, match="softening"):
        MEX(softening=-0.1)
    with pytest.raises(ParameterError, match="softening"):
        MEX(softening=float("nan"))
    with pytest.raises(ParameterError, match="precision"):
        MEX(precision="float16")
    with pytest.raises(ParameterError, match="center"):
        MEX(center="middle")
    with pytest.raises(ParameterError, match="fit"):
        MEX().accelerations()
    with pytest.raises(ParameterError, match="mass"):
        MEX().fit(np.zeros((3, 3)))
    mex = MEX(lmax=2).fit(np.eye(3), 1.0)
    with pytest.raises(ParameterError, match="shape"):
        mex.potential(np.zeros((4, 2)))


def test_potential_min_center_or_clear_error(rng):
    x, m = blob(rng, 300)
    try:
        from cosmo_dask.expansion.scf import potential_min_center  # noqa: F401
    except ImportError:
        with pytest.raises(NotImplementedError, match="potential_min"):
            MEX(center="potential_min").fit(x, m)
    else:
        mex = MEX(lmax=2, center="potential_min").fit(x, m)
        assert np.all(np.isfinite(mex.accelerations().compute()))


def test_buckets_stay_balanced_on_lattice_ordered_input(monkeypatch):
    """Bucket boundaries come from a random sample of each chunk: a fixed stride aliased
    with lattice order (every 4096th particle of a 512^3 grid lies in one plane), which
    put 83 million of 134 million particles into one bucket on the GPU. Here a 32^3
    lattice in grid order with 256 samples per 4096-row chunk (stride 16 = half a row)."""
    import cosmo_dask.expansion.mex as mex_module

    monkeypatch.setattr(mex_module, "_SAMPLE_PER_CHUNK", 256)
    g = (np.arange(32) + 0.5) / 32.0
    pos = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
    model = MEX(2, center=(0.5, 0.5, 0.5), buckets=8).fit(
        da.from_array(pos, chunks=(4096, 3)), 1.0 / len(pos))
    counts = model.counts_
    assert counts.sum() == len(pos)
    assert counts.max() < 1.5 * len(pos) / 8, counts
    # and the result does not depend on the bucketing
    ref = MEX(2, center=(0.5, 0.5, 0.5), buckets=1).fit(pos, 1.0 / len(pos))
    np.testing.assert_allclose(model.potential().compute(), ref.potential().compute(),
                               rtol=1e-12)


def test_default_buckets_bound_the_memory_of_one_task(monkeypatch):
    """Without buckets=, one bucket's sums and scan stay under BUCKET_BYTES."""
    import cosmo_dask.expansion.mex as mex_module

    monkeypatch.setattr(mex_module, "BUCKET_BYTES", 40 * 16 * 1000)  # lmax 3: 1000 particles
    rng = np.random.default_rng(3)
    pos = rng.normal(size=(10_000, 3))
    model = MEX(3, center=(0, 0, 0)).fit(da.from_array(pos, chunks=(5000, 3)), 1e-4)
    assert len(model.counts_) == 10
    ref = MEX(3, center=(0, 0, 0)).fit(pos, 1e-4)  # one chunk, the same bound
    one = MEX(3, center=(0, 0, 0), buckets=1).fit(pos, 1e-4)
    np.testing.assert_allclose(model.accelerations().compute(),
                               one.accelerations().compute(), rtol=1e-10, atol=1e-14)
    assert len(ref.counts_) == 10


# -------------------- on the GPU (formerly tests/test_mex_gpu.py)
# MEX on CuPy chunks: CUDA kernels against the numba kernels and the references.


@pytest.fixture
def cp():
    return pytest.importorskip("cupy")


# the float64 CUDA kernels against the numba kernels: tests/expansion/test_kernel_contracts.py


@pytest.mark.gpu
def test_float32_kernels(cp, rng):
    from cosmo_dask.expansion import mex_kernels_gpu as gpu

    x, m = blob(rng, 2000)
    a64, _ = cpu.forces_local(x, m, 6)
    a32, p32 = gpu.forces_local_gpu(cp.asarray(x, dtype=cp.float32),
                                cp.asarray(m, dtype=cp.float32), 6)
    assert a32.dtype == cp.float32 and p32.dtype == cp.float32
    err = rel_err(a32.get().astype(np.float64), a64)
    assert np.median(err) < 1e-5 and np.percentile(err, 99) < 1e-3


@pytest.mark.gpu
def test_mex_on_cupy_chunks_equals_cpu(cp, rng):
    x, m = blob(rng, 4000)
    dx = da.from_array(cp.asarray(x), chunks=(1000, 3), asarray=False)
    dm = da.from_array(cp.asarray(m), chunks=1000, asarray=False)
    mg = MEX(lmax=6).fit(dx, dm)
    ag, pg = dask.compute(mg.accelerations(), mg.potential())
    assert isinstance(ag, cp.ndarray)
    mc = MEX(lmax=6).fit(da.from_array(x, chunks=(1000, 3)), da.from_array(m, 1000))
    ac, pc = dask.compute(mc.accelerations(), mc.potential())
    assert rel_err(ag.get(), ac).max() < 1e-12
    assert rel_err(pg.get(), pc).max() < 1e-12
    pts = rng.normal(size=(500, 3))
    apg = mg.accelerations(cp.asarray(pts)).compute()
    apc = mc.accelerations(pts).compute()
    assert rel_err(apg.get(), apc).max() < 1e-12
    # and against the pair reference directly
    rel = x - mc.center_
    inner = self_masks(rel)
    ra, _ = legendre_reference(rel[:300], rel, m, inner[:300], 6,
                               skip=np.eye(len(x), dtype=bool)[:300])
    assert rel_err(ag.get()[:300], ra).max() < 1e-10


@pytest.mark.parametrize("device", DEVICES)
def test_lmax0_shell_theorem_on_device_chunks(device, rng):
    xp = array_module(device)
    x, m = blob(rng, 3000)
    dx = da.from_array(xp.asarray(x), chunks=(700, 3), asarray=False)
    mex = MEX(lmax=0).fit(dx, xp.asarray(m))
    out = mex.accelerations().compute()
    assert isinstance(out, xp.ndarray)  # computed on the device of the input
    acc = to_host(out)
    ref, _ = shell_reference(x - mex.center_, m)
    keep = np.linalg.norm(ref, axis=1) > 0
    assert rel_err(acc[keep], ref[keep]).max() < 1e-12


def test_one_bucket_fit_needs_no_bucket_count_pass(rng):
    """With one bucket every particle is in it: the fit runs 4 scheduler rounds (checks
    and centre of mass, radius sample, the persisted sort, the bucket totals), not a
    fifth to count the bucket; the forces equal those of the same fit in two buckets to
    the float64 reference tolerance."""
    from dask.callbacks import Callback

    x = rng.normal(size=(600, 3))
    m = np.full(600, 1.0 / 600)
    rounds = []
    with Callback(start=lambda dsk: rounds.append(len(dsk))):
        one = MEX(lmax=4, buckets=1).fit(x, m)
    assert len(rounds) == 4 and list(one.counts_) == [600]
    two = MEX(lmax=4, buckets=2).fit(x, m)
    assert sum(two.counts_) == 600
    np.testing.assert_allclose(one.accelerations().compute(), two.accelerations().compute(),
                               rtol=1e-10, atol=1e-12)
