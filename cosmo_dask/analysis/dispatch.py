"""The analysis kernels' contracts: one :class:`~cosmo_dask.core.dispatch.KernelDispatch`
per computation, chosen by the type of the chunk it is given.

The CPU kernel (numba, :mod:`.pair_count_kernels`) is registered here for
``numpy.ndarray``; the GPU kernel (CUDA via CuPy, :mod:`.pair_count_kernels_gpu`) is named
and imported on the first CuPy chunk. Both take the same arguments in the same order, the
chunk first, and return the same results. The graph code (:mod:`.correlation`) calls
these objects; this is the only module of the package that names a ``*_gpu`` module of
``analysis``.
"""

from __future__ import annotations

from ..core.dispatch import KernelDispatch
from . import pair_count_kernels

__all__ = ["pair_count"]

#: ``(pos (m, 3), n_owned, geometry, r_edges, mu_edges, los, box_size, pos2=None) ->
#: int64 (nr, nmu)`` on the host: one domain's periodic pair counts (ordered pairs whose
#: first member is owned for an auto count; owned rows of ``pos`` with every row of
#: ``pos2`` for a cross count), :func:`.pair_count_kernels.pair_count`
pair_count = KernelDispatch("pair_count", pair_count_kernels.pair_count,
                            gpu="cosmo_dask.analysis.pair_count_kernels_gpu:pair_count_gpu")
