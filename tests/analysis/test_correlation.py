"""cosmo_dask.analysis.correlation_function (issue 34, item 1): pair counts against an
independent brute force (NumPy all pairs, scipy's periodic cKDTree) and against Corrfunc,
exactly; the same counts on 1, 2 and 8 domains; xi of uniform points and the quadrupole
of an isotropic set within Poisson errors; bad input as one ParameterError before any
work."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from scipy.spatial import cKDTree

from cosmo_dask.analysis import correlation_function
from cosmo_dask.analysis.correlation import legendre_integrals
from cosmo_dask.core.errors import ParameterError
from tests.support.devices import DEVICES, array_module

L = 60.0


def _uniform(n, seed, dtype=np.float64):
    return (np.random.default_rng(seed).random((n, 3)) * L).astype(dtype)


def _clustered(n, seed):
    """Uniform points plus tight clumps (some across the periodic faces)."""
    rng = np.random.default_rng(seed)
    centres = rng.random((6, 3)) * L
    centres[0] = [0.5, L - 0.5, 0.2]
    clumps = centres[rng.integers(0, 6, n // 2)] + rng.normal(scale=1.5, size=(n // 2, 3))
    return np.mod(np.concatenate([rng.random((n - n // 2, 3)) * L, clumps]), L)


def _brute(pos, pos2, r_edges, mu_edges=None, los=None):
    """NumPy all pairs (minimum image, float64): distinct pairs of an auto count (pos2
    None), every pair of a cross count, binned in r (and mu = |d . los| / |d|)."""
    b = pos if pos2 is None else pos2
    d = b[None, :, :].astype(np.float64) - pos[:, None, :].astype(np.float64)
    d -= L * np.round(d / L)
    r2 = (d**2).sum(-1)
    keep = np.ones(r2.shape, bool)
    if pos2 is None:
        keep = np.triu(keep, 1)
    e2 = np.asarray(r_edges, np.float64) ** 2
    keep &= (r2 >= e2[0]) & (r2 < e2[-1])
    rbin = np.searchsorted(e2, r2[keep], side="right") - 1
    if mu_edges is None:
        return np.bincount(rbin, minlength=len(r_edges) - 1)
    r = np.sqrt(r2[keep])
    mu = np.abs(d[keep] @ np.asarray(los, np.float64)) / np.where(r > 0, r, 1)
    mbin = np.minimum(np.searchsorted(mu_edges, mu, side="right") - 1, len(mu_edges) - 2)
    out = np.zeros((len(r_edges) - 1, len(mu_edges) - 1), np.int64)
    np.add.at(out, (rbin, mbin), 1)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_counts_equal_brute_force(device, dtype):
    xp = array_module(device)
    pos = _clustered(1500, 1).astype(dtype)
    edges = np.array([0.0, 0.7, 2.0, 3.5, 6.0, 9.0, 14.0])
    ds = correlation_function(xp.asarray(pos), edges, box_size=L)
    assert ds.dd.dtype == np.int64
    np.testing.assert_array_equal(ds.dd.values, _brute(pos, None, edges))
    pos2 = _uniform(1200, 2, dtype)
    dc = correlation_function(xp.asarray(pos), edges, data2=xp.asarray(pos2), box_size=L)
    np.testing.assert_array_equal(dc.dd.values, _brute(pos, pos2, edges))
    tree = cKDTree(pos.astype(np.float64), boxsize=L)
    ref = np.diff(tree.count_neighbors(cKDTree(pos2.astype(np.float64), boxsize=L),
                                       edges[1:], cumulative=True))
    np.testing.assert_array_equal(dc.dd.values[1:], ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("los", ["z", (0.3, -0.5, 0.8)])
def test_smu_counts_equal_brute_force(device, los):
    xp = array_module(device)
    pos = _clustered(1200, 3)
    edges, mu = np.array([0.5, 3.0, 7.0, 12.0]), np.array([0.0, 0.2, 0.5, 0.55, 1.0])
    ds = correlation_function(xp.asarray(pos), edges, box_size=L, mu_bins=mu, los=los)
    v = np.array([0, 0, 1.0]) if los == "z" else np.array(los) / np.linalg.norm(los)
    np.testing.assert_array_equal(ds.dd.values, _brute(pos, None, edges, mu, v))


def test_counts_equal_corrfunc():
    """Corrfunc's theory.DD (autocorr=1) counts ordered pairs, 2 dd; with r_min = 0 it
    also counts the N self pairs in the first bin. float32 positions: Corrfunc computes
    in float32, cosmo_dask in float64, so the reference is Corrfunc on the same values
    widened to float64."""
    DD = pytest.importorskip("Corrfunc.theory.DD").DD
    pos = _clustered(3000, 4)
    pos[1] = pos[0]  # a pair at r = 0
    for edges in (np.geomspace(0.3, 25.0, 16), np.linspace(0.0, 20.0, 11)):
        ds = correlation_function(pos, edges, box_size=L, n_domains=8)
        ref = DD(1, 1, edges, *pos.T.copy(), periodic=True, boxsize=L)["npairs"]
        if edges[0] == 0:
            ref[0] -= len(pos)
        np.testing.assert_array_equal(2 * ds.dd.values, ref)
        pos2 = _uniform(2000, 5)
        dc = correlation_function(pos, edges, data2=pos2, box_size=L)
        ref = DD(0, 1, edges, *pos.T.copy(), periodic=True, boxsize=L,
                 X2=pos2[:, 0].copy(), Y2=pos2[:, 1].copy(), Z2=pos2[:, 2].copy())["npairs"]
        np.testing.assert_array_equal(dc.dd.values, ref)
    p32 = pos.astype(np.float32)
    edges = np.geomspace(0.3, 25.0, 16)
    ds = correlation_function(p32, edges, box_size=L)
    ref = DD(1, 1, edges, *p32.astype(np.float64).T.copy(), periodic=True,
             boxsize=L)["npairs"]
    np.testing.assert_array_equal(2 * ds.dd.values, ref)


def test_domains_give_identical_counts():
    pos, pos2 = _clustered(2500, 6), _uniform(1500, 7)
    edges = np.geomspace(0.2, 14.0, 12)
    one = None
    for nd in (1, 2, 8, (3, 1, 2)):
        ds = correlation_function(pos, edges, box_size=L, n_domains=nd, mu_bins=4, los="y")
        dc = correlation_function(da.from_array(pos, chunks=700), edges,
                                  data2=da.from_array(pos2, chunks=400), box_size=L,
                                  n_domains=nd)
        got = (ds.dd.values, dc.dd.values)
        if one is None:
            one = got
            assert ds.attrs["n_domains"] == [1, 1, 1]
            continue
        np.testing.assert_array_equal(got[0], one[0])
        np.testing.assert_array_equal(got[1], one[1])


def test_xi_of_uniform_points_is_zero_within_poisson_errors():
    pos = _uniform(20_000, 8)
    ds = correlation_function(pos, np.linspace(1.0, 15.0, 8), box_size=L)
    rr = ds.rr.values
    np.testing.assert_allclose(rr, 0.5 * 20_000 * 19_999 * 4 * np.pi / 3
                               * np.diff(np.linspace(1.0, 15.0, 8) ** 3) / L**3)
    assert np.all(np.abs(ds.xi.values) < 5 / np.sqrt(rr)), ds.xi.values * np.sqrt(rr)
    assert ds.r.attrs["units"] == "input length" and ds.attrs["n_particles"] == 20_000


def test_multipoles_of_an_isotropic_set():
    """xi(s, mu) of uniform points: every multipole is 0 within its Poisson error
    sigma_l^2 = (2 l + 1)^2 sum_m I_lm^2 / RR_m (I_lm the integral of L_l over bin m)."""
    pos = _uniform(20_000, 9)
    mu = np.linspace(0, 1, 6)
    ds = correlation_function(pos, np.linspace(2.0, 14.0, 5), box_size=L, mu_bins=mu,
                              los=(1.0, 1.0, 0.0), poles=(0, 2, 4))
    assert list(ds.ell.values) == [0, 2, 4]
    for k, ell in enumerate((0, 2, 4)):
        sigma = (2 * ell + 1) * np.sqrt((legendre_integrals(ell, mu) ** 2
                                         / ds.rr.values).sum(axis=1))
        got = ds.multipoles.values[k]
        assert np.all(np.abs(got) < 5 * sigma), (ell, got / sigma)
    # the monopole from xi(s, mu) is the mu average of xi(s, mu): equal to xi(r) of the
    # summed counts
    dr = correlation_function(pos, np.linspace(2.0, 14.0, 5), box_size=L)
    np.testing.assert_array_equal(ds.dd.values.sum(axis=1), dr.dd.values)
    np.testing.assert_allclose(ds.multipoles.values[0], dr.xi.values, rtol=0, atol=1e-12)


def test_legendre_integrals_are_exact():
    edges = np.array([0.0, 0.1, 0.45, 0.8, 1.0])
    for ell in (0, 2, 4):
        leg = np.polynomial.legendre.Legendre.basis(ell).integ()
        np.testing.assert_allclose(legendre_integrals(ell, edges), np.diff(leg(edges)),
                                   atol=1e-15)


def _poisoned():
    """Positions whose computation fails: a check that runs before any work never
    reaches it."""
    def boom():
        raise AssertionError("positions were read")

    return da.from_delayed(dask.delayed(boom)(), shape=(100, 3), dtype=np.float64)


@pytest.mark.parametrize("kwargs, match", [
    ({"r_bins": [1.0, 31.0]}, "above half the box"),
    ({"r_bins": [1.0, 5.0, 3.0]}, "strictly increasing"),
    ({"r_bins": [1.0, 2.0, 2.0]}, "strictly increasing"),
    ({"r_bins": [5.0]}, "at least 2 edges"),
    ({"r_bins": [-1.0, 2.0]}, ">= 0"),
    ({"mu_bins": [0.0, 1.5], "los": "z"}, r"in \[0, 1\]"),
    ({"mu_bins": [-0.5, 0.0, 1.0], "los": "z"}, r"in \[0, 1\]"),
    ({"mu_bins": 0, "los": "z"}, "mu_bins must be >= 1"),
    ({"mu_bins": 4}, "needs a line of sight"),
    ({"poles": (0, 2)}, "multipoles need mu_bins"),
    ({"mu_bins": 4, "los": "w"}, "los must be"),
    ({"mu_bins": [0.0, 0.5], "los": "z", "poles": (0, 2)}, r"spanning \[0, 1\]"),
    ({"n_domains": 216}, "r_max"),
    ({"box_size": None}, "periodic box"),
])
def test_bad_input_is_one_parameter_error_before_any_work(kwargs, match):
    args = {"r_bins": [1.0, 5.0, 10.0], "box_size": L, **kwargs}
    with pytest.raises(ParameterError, match=match) as info:
        correlation_function(_poisoned(), args.pop("r_bins"), **args)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 2, 1)])
def test_cuda_kernel_on_the_host_equals_the_numba_kernel(shape):
    """``cuda/pair_count.cu`` compiled on the host (tests/support/cuda_host.py, global
    atomics in place of the shared-memory histograms) through the GPU module's own
    preparation (:func:`pair_count_prepared` with NumPy): the same counts as the numba
    kernel on every domain (open and wrapped axes, ghosts, auto, cross, (r, mu))."""
    from tests.support import cuda_host

    if cuda_host.compiler() is None:
        pytest.skip("needs g++")
    from cosmo_dask.analysis import pair_count_kernels as cpu
    from cosmo_dask.analysis.correlation import _domain_geometry
    from cosmo_dask.analysis.pair_count_kernels_gpu import pair_count_prepared
    from cosmo_dask.spatial import decompose, domain_grid

    hk = cuda_host.host_kernels("pair_count", {"PC_SHARED": 0})

    def launch(grid, block, args, shared_bytes):
        hk["pair_count"](grid, block, args)

    pos, pos2 = _clustered(700, 11), _uniform(500, 12)
    edges, mu, los = np.array([0.0, 1.0, 4.0, 9.0]), np.array([0.0, 0.3, 1.0]), [0.0, 0.6, 0.8]
    grid = domain_grid(shape, box_size=L)
    parts = dask.compute(*decompose(da.from_array(pos, chunks=300), grid,
                                    ghost_width=9.0).exchange())
    parts2 = dask.compute(*decompose(da.from_array(pos2, chunks=300), grid,
                                     ghost_width=9.0).exchange())
    total = 0
    for p, p2 in zip(parts, parts2, strict=True):
        geo = _domain_geometry(grid, p.domain, 9.0, len(p.pos) + len(p2.pos))
        for args in ((p.pos, p.n_owned, geo, edges, None, None, L),
                     (p.pos, p.n_owned, geo, edges, mu, los, L),
                     (p.pos, p.n_owned, geo, edges, None, None, L, p2.pos)):
            want = cpu.pair_count(*args)
            got = pair_count_prepared(np, launch, *args, shared=False)
            np.testing.assert_array_equal(got, want)
        total += cpu.pair_count(p.pos, p.n_owned, geo, edges, None, None, L)[:, 0]
    np.testing.assert_array_equal(total // 2, _brute(pos, None, edges))
