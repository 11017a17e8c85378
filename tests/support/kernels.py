"""Test-side entry points to package kernels that the package itself does not need: the
CPU implementation of a kernel contract, the FOF GPU pipeline with a chosen array module
and kernels (the CUDA source run on the host), and MEX solid harmonics at many points."""

from __future__ import annotations

import numba
import numpy as np

from cosmo_dask.expansion.mex_kernels import _solid, n_terms
from cosmo_dask.halos.fof_kernels import check_arguments
from cosmo_dask.halos.fof_kernels_gpu import fof_pipeline


def cpu_implementation(contract):
    """The CPU implementation of the kernel contract ``contract`` (a ``KernelDispatch``)."""
    return contract.dispatch(np.ndarray)


def fof_local_with(xp, kernels, pos, periods, linking_length, min_friends=1,
                   count_friends=True, events=None):
    """``fof_local_gpu`` with the array module and kernels given (see ``fof_pipeline``):
    the tests run the CUDA source on the host through this, with NumPy arrays."""
    pos = xp.asarray(pos)
    per, ll, kmin = check_arguments(pos.shape, periods, linking_length, min_friends)
    counts = bool(count_friends) or kmin > 1
    if pos.shape[0] == 0:
        return (xp.empty(0, dtype=np.int64), xp.empty(0, dtype=np.int32) if counts else None)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = xp.ascontiguousarray(pos)  # kept in its dtype: no float64 copy of the input
    return fof_pipeline(xp, kernels, pos, per, ll, kmin, counts, events)


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
