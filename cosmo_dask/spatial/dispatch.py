"""The kernel contracts of spatial: Morton keys and the octree build, chosen by the type of
the positions they are given (:class:`~cosmo_dask.core.dispatch.KernelDispatch`).

``morton_keys(pos, root_lo, root_size, *, box_size=None)``
    Level-21 Morton keys, ``(N,)`` uint64 (:func:`cosmo_dask.spatial.morton.morton_keys`,
    numba; :func:`cosmo_dask.spatial.octree_gpu.morton_keys_gpu`, CuPy).
``build_octree(pos, mass, *, max_leaf=64, max_group=64, root_lo=None, root_size=None,
box_size=None)``
    The :class:`~cosmo_dask.spatial.octree_layout.Octree` of a particle set, with NumPy or
    CuPy arrays like ``pos`` (:func:`cosmo_dask.spatial.octree.build_octree`, numba;
    :func:`cosmo_dask.spatial.octree_gpu.build_octree_gpu`, CuPy).

One signature and one test suite each (``tests/spatial/test_kernel_contracts.py``). The
CPU kernels are imported here, the GPU ones named and imported on the first CuPy array;
callers that may hold either use these objects instead of importing
:mod:`~cosmo_dask.spatial.octree_gpu`. Adding a GPU kernel: give it the CPU kernel's
signature in a ``*_gpu`` module (it may import the CPU module's shared pieces, never the
reverse), name it here and add the contract test's ``"gpu"`` case.
"""

from __future__ import annotations

from ..core.dispatch import KernelDispatch
from . import morton, octree

__all__ = ["build_octree", "morton_keys"]

morton_keys = KernelDispatch("spatial.morton_keys", morton.morton_keys,
                             gpu="cosmo_dask.spatial.octree_gpu:morton_keys_gpu")
build_octree = KernelDispatch("spatial.build_octree", octree.build_octree,
                              gpu="cosmo_dask.spatial.octree_gpu:build_octree_gpu")
