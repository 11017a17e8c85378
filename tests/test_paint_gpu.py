"""Mesh painting and P(k) on the GPU: CuPy kernels against the (reference-checked) CPU path."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from cosmo_dask.analysis import power_spectrum
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.density import paint

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("scheme", ["ngp", "cic", "tsc", "pcs"])
@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_gpu_paint_matches_cpu_float64(rng, scheme, shift):
    import cupy

    pos = rng.uniform(-5.0, 55.0, size=(40_000, 3))  # some outside the box: wrapped
    mass = rng.uniform(0.5, 2.0, size=40_000)
    cpu = paint(pos, mass, n_mesh=24, box_size=50.0, scheme=scheme, shift=shift).compute()
    gpos = da.from_array(cupy.asarray(pos), chunks=(10_000, 3), asarray=False)
    gm = da.from_array(cupy.asarray(mass), chunks=10_000, asarray=False)
    gpu = paint(gpos, gm, n_mesh=24, box_size=50.0, scheme=scheme, shift=shift).compute()
    assert isinstance(gpu, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=0, atol=1e-12 * cpu.max())
    assert abs(float(gpu.sum()) - mass.sum()) <= 1e-12 * mass.sum()


def test_gpu_paint_float32_and_scalar_mass(rng):
    import cupy

    pos = rng.uniform(0, 10.0, size=(20_000, 3))
    cpu = paint(pos, 2.0, n_mesh=16, box_size=10.0, scheme="tsc").compute()
    gpu = paint(cupy.asarray(pos.astype(np.float32)), 2.0, n_mesh=16, box_size=10.0,
                scheme="tsc", precision="float32").compute()
    assert gpu.dtype == np.float32
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=2e-4, atol=1e-4 * cpu.max())


def test_gpu_power_spectrum_matches_cpu(rng):
    import cupy

    pos = rng.uniform(0, 100.0, size=(100_000, 3))
    cpu = power_spectrum(pos, n_mesh=32, box_size=100.0, los=2, poles=(0, 2))
    gpu = power_spectrum(cupy.asarray(pos), n_mesh=32, box_size=100.0, los=2, poles=(0, 2))
    np.testing.assert_allclose(gpu["power"].values, cpu["power"].values, rtol=1e-9)
    np.testing.assert_allclose(gpu["multipoles"].values, cpu["multipoles"].values,
                               rtol=1e-8, atol=1e-9 * float(cpu["power"].max()))
    np.testing.assert_array_equal(gpu["n_modes"].values, cpu["n_modes"].values)


def test_gpu_nonfinite_position_raises(rng):
    import cupy

    pos = rng.uniform(0, 10.0, size=(100, 3))
    pos[7, 2] = np.inf
    with pytest.raises(ParameterError, match="not finite"):
        paint(cupy.asarray(pos), n_mesh=8, box_size=10.0).compute()


@pytest.mark.parametrize("slabs", [2, 5])
def test_gpu_slabs_match_cpu(rng, slabs):
    """The mesh path in slabs on CuPy chunks: the painted slabs (CUDA kernel per slab),
    P(k) binned per k-space slab (cuFFT blocks) and the interlaced paint equal the
    NumPy path's."""
    import cupy

    pos = rng.uniform(0, 40.0, size=(30_000, 3))
    gpos = da.from_array(cupy.asarray(pos), chunks=(7_000, 3), asarray=False)
    kw = dict(n_mesh=20, box_size=40.0, scheme="tsc", slabs=slabs)
    cpu = paint(pos, **kw).compute()
    gpu = paint(gpos, **kw)
    assert isinstance(gpu._meta, cupy.ndarray) and len(gpu.chunks[0]) == slabs
    np.testing.assert_allclose(cupy.asnumpy(gpu.compute()), cpu, rtol=0,
                               atol=1e-12 * cpu.max())
    inter_c = paint(pos, interlace=True, **kw).compute()
    inter_g = cupy.asnumpy(paint(gpos, interlace=True, **kw).compute())
    np.testing.assert_allclose(inter_g, inter_c, rtol=0, atol=1e-11 * np.abs(inter_c).max())
    pk_c = power_spectrum(pos, n_mesh=20, box_size=40.0, los=1, poles=(0, 2), slabs=slabs)
    pk_g = power_spectrum(gpos, n_mesh=20, box_size=40.0, los=1, poles=(0, 2), slabs=slabs)
    np.testing.assert_allclose(pk_g["multipoles"].values, pk_c["multipoles"].values,
                               rtol=1e-9, atol=1e-9 * float(pk_c["power"].max()))
