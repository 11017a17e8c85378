"""Test-side entry points to package kernels that the package itself does not need: the
CPU implementation of a kernel contract and MEX solid harmonics at many points."""

from __future__ import annotations

import numba
import numpy as np

from cosmo_dask.expansion.mex_kernels import _solid, n_terms


def cpu_implementation(contract):
    """The CPU implementation of the kernel contract ``contract`` (a ``KernelDispatch``)."""
    return contract.dispatch(np.ndarray)


def solid_harmonics(pos, lmax: int) -> np.ndarray:
    """MEX solid harmonics ``T`` of every point, (n, (lmax+1)**2) float64."""
    pos = np.asarray(pos, dtype=np.float64)
    out = np.empty((pos.shape[0], n_terms(lmax)))
    _solid_many(pos, int(lmax), out)
    return out


@numba.njit(nogil=True)
def _solid_many(pos, lmax, out):
    T = np.empty(out.shape[1], np.float64)
    for i in range(pos.shape[0]):
        _solid(pos[i, 0], pos[i, 1], pos[i, 2], lmax, T)
        out[i, :] = T
