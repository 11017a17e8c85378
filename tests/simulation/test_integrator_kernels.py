"""The integrator's per-chunk updates (``cosmo_dask.simulation.dispatch``): kick and drift
on every backend against float64 references written out here, and the CUDA text of
``cuda/integrator.cu`` compiled for the host (tests/support/cuda_host.py) against the
NumPy kernels bit for bit, on the values that test the wrap (negative coordinates, the
box edge, coordinates that round up to it, NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.backend import host
from cosmo_dask.simulation import dispatch, integrator_kernels
from tests.support import cuda_host

BOX = 100.0


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def xp(request):
    if request.param == "gpu":
        return pytest.importorskip("cupy")
    return np


def _drift_case(rng, pos_t, mom_t):
    """Positions in the box and at its edges, momenta that carry some across either face
    (or several boxes), and a coordinate that lands a hair below 0 (it wraps to a value
    that rounds up to the box edge in float32)."""
    pos = rng.random((4000, 3)) * BOX
    pos[:5, 0] = (0.0, np.nextafter(BOX, 0), BOX / 2, 1e-30, 99.999999)
    mom = rng.normal(scale=30.0, size=pos.shape)
    mom[:5, 0] = (-1e-9, 1e-9, 0.0, -1e-28, 250.0)
    mom[5, 1] = np.nan
    mom[6, 2] = -3.5 * BOX / 0.7
    return pos.astype(pos_t), mom.astype(mom_t)


def _drift_reference(pos, mom, factor, dtype):
    """The drift by its definition: float64 sum, floored remainder, cast, box edge -> 0."""
    x = pos.astype(np.float64) + mom.astype(np.float64) * factor
    r = x - BOX * np.floor(x / BOX)
    r = np.where(r >= BOX, r - BOX, r).astype(dtype)
    hi = np.nextafter(np.dtype(dtype).type(BOX), np.dtype(dtype).type(0))
    return np.where(r > hi, 0, r).astype(dtype)


@pytest.mark.parametrize("pos_t, mom_t", [("float32", "float32"), ("float64", "float64"),
                                          ("float32", "float64")])
def test_drift_block(xp, rng, pos_t, mom_t):
    pos, mom = _drift_case(rng, pos_t, mom_t)
    got = dispatch.drift_block(xp.asarray(pos), xp.asarray(mom), 0.7, BOX, np.dtype(pos_t))
    assert isinstance(got, xp.ndarray) and got.dtype == np.dtype(pos_t)
    want = _drift_reference(pos, mom, 0.7, pos_t)
    got = host(got)
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=4 * np.spacing(np.float32(BOX))
                               if pos_t == "float32" else 1e-12)
    assert np.isnan(got[5, 1]) and np.all((got[ok] >= 0) & (got[ok] < BOX))
    if xp is not np:  # and bit for bit the CPU kernel
        cpu = integrator_kernels.drift_block(pos, mom, 0.7, BOX, np.dtype(pos_t))
        np.testing.assert_array_equal(got, cpu)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kick_block(xp, rng, dtype):
    mom = rng.normal(size=(3000, 3)).astype(dtype)
    acc = rng.normal(scale=1e3, size=(3000, 3)).astype(dtype)
    got = dispatch.kick_block(xp.asarray(mom), xp.asarray(acc), 0.0123)
    assert isinstance(got, xp.ndarray) and got.dtype == np.dtype(dtype)
    f = np.dtype(dtype).type(0.0123)
    want = mom.astype(np.float64) + acc.astype(np.float64) * float(f)
    np.testing.assert_allclose(host(got), want, rtol=1e-6 if dtype == "float32" else 1e-15,
                               atol=1e-3 if dtype == "float32" else 1e-12)
    if xp is not np:
        np.testing.assert_array_equal(host(got), integrator_kernels.kick_block(mom, acc, 0.0123))


def _host_kernel(name, **defines):
    if cuda_host.compiler() is None:
        pytest.skip("no host C++ compiler")
    return cuda_host.host_kernels("integrator", defines, order="reversed")[name]


@pytest.mark.parametrize("pos_t, mom_t", [("float32", "float32"), ("float64", "float64"),
                                          ("float32", "float64"), ("float64", "float32")])
def test_drift_cuda_text_on_host(rng, pos_t, mom_t):
    ctype = {"float32": "float", "float64": "double"}
    kern = _host_kernel("drift", POS_T=ctype[pos_t], MOM_T=ctype[mom_t], KICK_T="double")
    pos, mom = _drift_case(rng, pos_t, mom_t)
    hi = float(np.nextafter(np.dtype(pos_t).type(BOX), np.dtype(pos_t).type(0)))
    for factor in (0.7, -13.0, 0.0):
        out = np.empty_like(pos)
        kern((5,), (7,), (pos, mom, np.int64(pos.size), np.float64(factor), np.float64(BOX),
                          np.float64(hi), out))
        want = integrator_kernels.drift_block(pos, mom, factor, BOX, np.dtype(pos_t))
        np.testing.assert_array_equal(out, want)
    tiny = np.array([[0.0, 0.0, 0.0]], dtype=pos_t)  # -1e-9 wraps to just under the box
    step = np.array([[-1e-9, 1e-300, -0.0]], dtype=mom_t)
    out = np.empty_like(tiny)
    kern((1,), (1,), (tiny, step, np.int64(3), np.float64(1.0), np.float64(BOX),
                      np.float64(hi), out))
    np.testing.assert_array_equal(out, integrator_kernels.drift_block(tiny, step, 1.0, BOX,
                                                                      np.dtype(pos_t)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kick_cuda_text_on_host(rng, dtype):
    kern = _host_kernel("kick", POS_T="double", MOM_T="double",
                        KICK_T="float" if dtype == "float32" else "double")
    mom = rng.normal(size=(2000, 3)).astype(dtype)
    acc = rng.normal(scale=1e3, size=(2000, 3)).astype(dtype)
    out = np.empty_like(mom)
    kern((5,), (7,), (mom, acc, np.int64(mom.size), np.float64(0.0123), out))
    np.testing.assert_array_equal(out, integrator_kernels.kick_block(mom, acc, 0.0123))

