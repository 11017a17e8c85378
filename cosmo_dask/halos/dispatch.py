"""The halo kernels' contracts: one :class:`~cosmo_dask.core.dispatch.KernelDispatch` per
computation, chosen by the type of the chunk it is given.

The CPU kernels (numba, :mod:`.fof_kernels`, :mod:`.center_kernels`) are registered here
for ``numpy.ndarray``; the GPU kernels (CUDA via CuPy, :mod:`.fof_kernels_gpu`,
:mod:`.center_kernels_gpu`) are named and imported on the first CuPy chunk. Both take the
same arguments in the same order, the chunk first, and return the same results. The
graph code (:mod:`.fof_graph`, :mod:`.catalog`) calls these objects; this is the only module of
the package that names a ``*_gpu`` module.

Adding a GPU kernel: write it in ``<name>_gpu.py`` with the CPU kernel's signature and
results, name it here with ``gpu="cosmo_dask.halos.<name>_gpu:<function>"``, and add its
backend to the contract's test in ``tests/halos/test_kernel_contracts.py``.
"""

from __future__ import annotations

from ..core.dispatch import KernelDispatch
from . import center_kernels, fof_kernels

__all__ = ["fof_local", "group_rows", "segment_max", "segment_mbp", "segment_potentials"]

#: ``(pos (m, 3), periods, linking_length, min_friends=1, count_friends=True) ->
#: (root int64 (m,), friends int32 (m,) or None)``: one domain's friends-of-friends
#: groups (root: the smallest index of each particle's group), as arrays of pos's kind
fof_local = KernelDispatch("fof_local", fof_kernels.fof_local,
                           gpu="cosmo_dask.halos.fof_kernels_gpu:fof_local_gpu")

#: ``(root (n,), cls (n,), ids (n,), crossing (n,), min_members) -> int64 (rows, 3)`` on
#: the host: ``(class, count, smallest id)`` of one domain's local groups that have at
#: least ``min_members`` members there or cross a domain face, in root order
group_rows = KernelDispatch("group_rows", fof_kernels.group_rows,
                            gpu="cosmo_dask.halos.fof_kernels_gpu:group_rows_gpu")

#: ``(pos (n, 3), mass, starts (h+1,), *, box_size=None, softening=0.0, G=1.0) ->
#: float64 (n,)``: the exact potential of every particle due to its own segment
segment_potentials = KernelDispatch(
    "segment_potentials", center_kernels.segment_potentials,
    gpu="cosmo_dask.halos.center_kernels_gpu:segment_potentials_gpu")

#: ``(pos (n, 3), mass, starts (h+1,), *, box_size=None, softening=0.0, G=1.0) ->
#: (rows int64 (h,), potentials float64 (h,))`` on the host: each segment's most bound
#: member (the argmin of the exact potentials, ties to the first; -1 and NaN when empty)
segment_mbp = KernelDispatch("segment_mbp", center_kernels.segment_mbp,
                             gpu="cosmo_dask.halos.center_kernels_gpu:segment_mbp_gpu")

#: ``(values (n,) float64 >= 0, starts (h+1,)) -> float64 (h,)``: the largest value of
#: each (non-empty) segment, exact, as an array of ``values``' kind (the catalog's r_max)
segment_max = KernelDispatch("segment_max", center_kernels.segment_max,
                             gpu="cosmo_dask.halos.center_kernels_gpu:segment_max_gpu")
