"""The expansion kernel contracts (``cosmo_dask.expansion.dispatch``), one test each, run on
every backend: the dispatch object is called with NumPy or CuPy chunks and its results are
checked against independent float64 references (scipy's Gegenbauer polynomials and
spherical harmonics, Legendre pair sums). On a GPU the CUDA kernels are also compared with
the numba kernels on larger sets (the comparison formerly in tests/expansion/test_scf.py and
tests/expansion/test_mex.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import sph_harm_y

from cosmo_dask.core.backend import host
from cosmo_dask.expansion import dispatch
from cosmo_dask.expansion.scf_kernels import unpack_sums
from tests.support.expansion import (
    _cloud,
    _rel,
    blob,
    legendre_reference,
    ref_coefficients,
    ref_fields,
    rel_err,
)


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def xp(request):
    """The array module of the chunks: numpy, or cupy on a GPU host."""
    if request.param == "gpu":
        return pytest.importorskip("cupy")
    return np


# ---------------------------------------------------------------- SCF
@pytest.mark.parametrize("nmax, lmax", [(10, 6), (3, 0), (0, 2), (20, 10)])
def test_scf_coefficient_sums(xp, rng, nmax, lmax):
    x, m = _cloud(rng, 2000)
    got = dispatch.scf_coefficient_sums(xp.asarray(x), xp.asarray(m), nmax, lmax, 0.9)
    assert isinstance(got, xp.ndarray) and got.dtype == np.float64
    sums, msum, count = unpack_sums(host(got), nmax, lmax)
    assert count == 2000 and msum == pytest.approx(m.sum(), rel=1e-13)
    S, T = ref_coefficients(x, m, nmax, lmax, 0.9)
    assert _rel(sums[0] / msum, S) < 1e-12
    if lmax > 0:
        assert _rel(sums[1] / msum, T) < 1e-12
    else:
        assert not np.any(sums[1])  # no m > 0 terms

    if xp is not np:  # the CUDA kernel against the numba kernel on 50k particles
        x, m = _cloud(rng, 50_000)
        cpu = dispatch.scf_coefficient_sums(x, m, nmax, lmax, 0.9)
        gpu = host(dispatch.scf_coefficient_sums(xp.asarray(x), xp.asarray(m), nmax, lmax,
                                                 0.9))
        sums, msum, count = unpack_sums(cpu, nmax, lmax)
        gsums, gmsum, gcount = unpack_sums(gpu, nmax, lmax)
        assert gcount == count and abs(gmsum / msum - 1) < 1e-13
        for row in range(4):
            assert _rel(gsums[row], sums[row]) < 1e-12 if np.any(sums[row]) else True


@pytest.mark.parametrize("nmax, lmax", [(10, 6), (3, 0), (0, 2), (20, 10)])
def test_scf_evaluate(xp, rng, nmax, lmax):
    x, m = _cloud(rng, 2000)
    S, T = ref_coefficients(x, m, nmax, lmax, 0.9)
    y = rng.normal(size=(300, 3)) * 1.5
    pot, acc, dens = ref_fields(y, S, T, 0.9, 2.5)
    got = {what: dispatch.scf_evaluate(xp.asarray(y), S, T, 0.9, 2.5, what)
           for what in ("potential", "acceleration", "density")}
    for what, v in got.items():
        assert isinstance(v, xp.ndarray) and v.dtype == np.float64, what
    a = host(got["acceleration"])
    assert a.shape == (300, 3)
    assert np.max(np.linalg.norm(a - acc, axis=1) / np.linalg.norm(acc, axis=1)) < 1e-10
    assert np.max(np.abs(host(got["potential"]) / pot - 1)) < 1e-10
    assert _rel(host(got["density"]), dens) < 1e-10

    if xp is not np:  # the CUDA kernel against the numba kernel, z axis and origin included
        x, m = _cloud(rng, 50_000)
        sums, msum, _ = unpack_sums(dispatch.scf_coefficient_sums(x, m, nmax, lmax, 0.9),
                                    nmax, lmax)
        S, T = sums[0] / msum, sums[1] / msum
        y = np.concatenate([x[:5000], [[0, 0, 0], [0, 0, 1.0], [0, 0, -2.0]]])
        for what in ("acceleration", "potential", "density"):
            yy = y if what != "density" else y[np.linalg.norm(y, axis=1) > 0]
            ref = dispatch.scf_evaluate(yy, S, T, 0.9, 2.5, what)
            got = host(dispatch.scf_evaluate(xp.asarray(yy), S, T, 0.9, 2.5, what))
            assert np.all(np.isfinite(got))
            if what == "acceleration":
                scale = np.linalg.norm(ref, axis=1)
                err = np.linalg.norm(got - ref, axis=1)
            else:
                scale = np.abs(ref)
                err = np.abs(got - ref)
            zero = scale == 0  # lmax = 0 at r = 0: the monopole force there is 0 by convention
            assert np.all(err[zero] == 0), what
            assert np.max(err[~zero] / scale[~zero]) < 1e-11, what


# ---------------------------------------------------------------- MEX
def _solid_reference(x, lmax):
    """The stored solid harmonics of every point from scipy's ``sph_harm_y``:
    ``T_lm = sqrt(4 pi (2 - d_m0) / (2l+1)) r^l (-1)^m Y_lm`` (``T_l0`` at ``l^2``,
    ``Re, Im T_lm`` at ``l^2 + 2m - 1, l^2 + 2m``); ``T = (1, 0, ...)`` at ``r = 0``."""
    r = np.linalg.norm(x, axis=1)
    safe = np.where(r > 0, r, 1.0)
    th, ph = np.arccos(np.clip(x[:, 2] / safe, -1, 1)), np.arctan2(x[:, 1], x[:, 0])
    out = np.zeros((len(x), (lmax + 1) ** 2))
    for ell in range(lmax + 1):
        for m in range(ell + 1):
            t = (math.sqrt(4 * math.pi * (2 - (m == 0)) / (2 * ell + 1)) * r**ell * (-1) ** m
                 * sph_harm_y(ell, m, th, ph))
            if m == 0:
                out[:, ell * ell] = t.real
            else:
                out[:, ell * ell + 2 * m - 1] = t.real
                out[:, ell * ell + 2 * m] = t.imag
    out[r == 0] = 0.0
    out[r == 0, 0] = 1.0
    return out


def _sorted_blob(rng, n, origin):
    x, m = blob(rng, n)
    if origin:
        x[0] = 0.0
    order = np.argsort((x * x).sum(1), kind="stable")
    return x[order], m[order]


@pytest.mark.parametrize("lmax", [0, 3, 6, 10])
def test_mex_terms_scan(xp, rng, lmax):
    xs, ms = _sorted_blob(rng, 3000, origin=True)
    T = _solid_reference(xs, lmax)
    ell = np.repeat(np.arange(lmax + 1), 2 * np.arange(lmax + 1) + 1)
    for eps2 in (0.0, 0.01):
        Q, P = dispatch.mex_terms_scan(xp.asarray(xs), xp.asarray(ms), lmax, eps2)
        assert isinstance(Q, xp.ndarray) and isinstance(P, xp.ndarray)
        assert Q.shape == P.shape == (3001, (lmax + 1) ** 2) and Q.dtype == np.float64
        Q, P = host(Q), host(P)
        # Q[i] = sum_{j<i} m_j T_j; P[i] = sum_{j>=i} m_j T_j / (r_j^2 + eps^2)^(l+1/2)
        want_q = np.concatenate([np.zeros((1, T.shape[1])), np.cumsum(ms[:, None] * T, 0)])
        s = (xs * xs).sum(1) + eps2
        irr = np.where(s[:, None] > 0, T / np.where(s > 0, s, 1.0)[:, None] ** (ell + 0.5),
                       0.0)
        want_p = np.concatenate([np.cumsum((ms[:, None] * irr)[::-1], 0)[::-1],
                                 np.zeros((1, T.shape[1]))])
        for got, want in ((Q, want_q), (P, want_p)):
            scale = np.abs(want).max(axis=0) + 1e-300
            assert np.max(np.abs(got - want) / scale) < 1e-12

        if xp is not np:  # the CUDA kernel against the numba kernel
            Qc, Pc = dispatch.mex_terms_scan(xs, ms, lmax, eps2)
            scale = np.abs(Qc).max(axis=0) + 1e-300
            assert np.max(np.abs(Q - Qc) / scale) < 1e-12
            scale = np.abs(Pc).max(axis=0) + 1e-300
            assert np.max(np.abs(P - Pc) / scale) < 1e-12


@pytest.mark.parametrize("lmax", [0, 3, 6, 10])
def test_mex_evaluate(xp, rng, lmax):
    """Forces and potentials at the particles themselves (inner sums before, outer sums
    after each one: no self term) against Legendre pair sums."""
    xs, ms = _sorted_blob(rng, 1500, origin=False)
    Q, P = dispatch.mex_terms_scan(xs, ms, lmax, 0.0)
    iq = np.arange(len(xs))
    acc, phi = dispatch.mex_evaluate(xp.asarray(xs), xp.asarray(Q), xp.asarray(P),
                                     xp.asarray(iq), xp.asarray(iq + 1), lmax, 0.0)
    assert isinstance(acc, xp.ndarray) and isinstance(phi, xp.ndarray)
    assert acc.shape == (1500, 3) and phi.shape == (1500,) and acc.dtype == np.float64
    inner = iq[None, :] < iq[:, None]
    eye = np.eye(len(xs), dtype=bool)
    ref_acc, ref_phi = legendre_reference(xs, xs, ms, inner, lmax, skip=eye)
    keep = np.linalg.norm(ref_acc, axis=1) > 0
    assert rel_err(host(acc)[keep], ref_acc[keep]).max() < 1e-10
    assert rel_err(host(phi), ref_phi).max() < 1e-10

    if xp is not np:  # the CUDA kernel against the numba kernel, a particle at r = 0
        xs, ms = _sorted_blob(rng, 3000, origin=True)
        iq = np.arange(len(xs))
        for eps2 in (0.0, 0.01):
            Qc, Pc = dispatch.mex_terms_scan(xs, ms, lmax, eps2)
            ac, pc = dispatch.mex_evaluate(xs, Qc, Pc, iq, iq + 1, lmax, eps2)
            ag, pg = dispatch.mex_evaluate(xp.asarray(xs), xp.asarray(Qc), xp.asarray(Pc),
                                           xp.asarray(iq), xp.asarray(iq + 1), lmax, eps2)
            keep = np.linalg.norm(ac, axis=1) > 0
            assert rel_err(host(ag)[keep], ac[keep]).max() < 1e-12
            assert rel_err(host(pg), pc).max() < 1e-12
            assert np.all(np.isfinite(host(ag)))
