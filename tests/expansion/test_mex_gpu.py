"""MEX on CuPy chunks: CUDA kernels against the numba kernels and the references."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.expansion import MEX
from cosmo_dask.expansion import mex_kernels as cpu
from tests.support.expansion import blob, legendre_reference, rel_err, self_masks, shell_reference

pytestmark = pytest.mark.gpu


@pytest.fixture
def cp():
    return pytest.importorskip("cupy")


# the float64 CUDA kernels against the numba kernels: tests/test_kernel_contracts_expansion.py


def test_float32_kernels(cp, rng):
    from cosmo_dask.expansion import mex_kernels_gpu as gpu

    x, m = blob(rng, 2000)
    a64, _ = cpu.forces_local(x, m, 6)
    a32, p32 = gpu.forces_local(cp.asarray(x, dtype=cp.float32),
                                cp.asarray(m, dtype=cp.float32), 6)
    assert a32.dtype == cp.float32 and p32.dtype == cp.float32
    err = rel_err(a32.get().astype(np.float64), a64)
    assert np.median(err) < 1e-5 and np.percentile(err, 99) < 1e-3


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


def test_gpu_lmax0_shell_theorem(cp, rng):
    x, m = blob(rng, 3000)
    dx = da.from_array(cp.asarray(x), chunks=(700, 3), asarray=False)
    mex = MEX(lmax=0).fit(dx, cp.asarray(m))
    acc = mex.accelerations().compute().get()
    ref, _ = shell_reference(x - mex.center_, m)
    keep = np.linalg.norm(ref, axis=1) > 0
    assert rel_err(acc[keep], ref[keep]).max() < 1e-12
