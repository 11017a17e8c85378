"""The kernel contracts of ``density``: one :class:`~cosmo_dask.core.dispatch.KernelDispatch`
per computation, chosen by the type of the chunk it is given.

Each contract has one signature, shared by its CPU implementation (NumPy/numba,
imported here eagerly) and its GPU implementation (CuPy/CUDA, named by its module
and imported on the first CuPy chunk). Graph code and public functions call these
objects and never import a ``*_gpu`` module; CPU kernel modules never import their
GPU twins. Adding a GPU kernel: write it in a ``*_gpu`` module with the CPU
kernel's signature (CuPy in, CuPy out) and name it in the contract's ``gpu=``;
its test goes in ``tests/density/test_kernel_contracts.py`` (parametrized over the
backends, against a float64 reference).

Contracts whose first argument is a computed block column (a tuple) or a list of
columns dispatch on the column's first array (``chunk_of``).
"""

from __future__ import annotations

from ..core.dispatch import KernelDispatch
from .paint_kernels import paint_numpy
from .tessellation_kernels import column_bboxes, column_block_tets, rows_tets
from .tet_volume import deposit_tets_cpu, tet_cube_volume_cpu

__all__ = ["paint_kernel", "tet_cube_volume_kernel", "deposit_tets_kernel",
           "column_tets_kernel", "rows_tets_kernel", "column_bboxes_kernel"]

_PKG = "cosmo_dask.density"


def column_chunk(column):
    """The array a column kernel dispatches on: the column's first array."""
    return column[0]


def columns_chunk(columns):
    """The array a many-column kernel dispatches on: the first column's first array."""
    return columns[0][0]


#: ``(pos, mass, n, box_size, scheme, shift=0.0, dtype=float64, planes=None, out=None)
#: -> mesh (hi - lo, n, n)``: mass assignment of one chunk onto mesh planes ``[lo, hi)``
#: (``ValueError`` for non-finite positions).
paint_kernel = KernelDispatch("paint", paint_numpy, gpu=f"{_PKG}.paint_kernels_gpu:paint_gpu")

#: ``(tets (T, 4, 3), cube_lo (C, 3) | (3,), cube_size) -> (T, C) | (T,) float64``:
#: exact tetrahedron-cube intersection volumes.
tet_cube_volume_kernel = KernelDispatch(
    "tet_cube_volume", tet_cube_volume_cpu, gpu=f"{_PKG}.tet_volume_gpu:tet_cube_volume_gpu")

#: ``(tets (T, 4, 3), mass, grid_lo, cell_size, shape, *, periodic=False, out=None)
#: -> (nx, ny, nz) float64``: mass of tetrahedra on a grid by exact overlap volumes.
deposit_tets_kernel = KernelDispatch(
    "deposit_tets", deposit_tets_cpu, gpu=f"{_PKG}.tet_volume_gpu:deposit_tets_gpu")

#: ``(column, bks, block, ncz, box_size, particle_mass, shifts=None) -> (tets, mass)``:
#: tetrahedra of blocks ``bks`` of one computed column.
column_tets_kernel = KernelDispatch(
    "column_block_tets", column_block_tets,
    gpu=f"{_PKG}.tessellation_kernels_gpu:column_block_tets_gpu", chunk_of=column_chunk)

#: ``(columns, rows (R, 5), block, ncz, box_size, particle_mass) -> (tets, mass)``:
#: tetrahedra of many columns' blocks in row order.
rows_tets_kernel = KernelDispatch("rows_tets", rows_tets,
                                  gpu=f"{_PKG}.tessellation_kernels_gpu:rows_tets_gpu",
                                  chunk_of=columns_chunk)

#: ``(column, block, ncz, box_size) -> (lo (nbk, 3), hi (nbk, 3))``: bounding boxes of
#: every block's tetrahedra in one column.
column_bboxes_kernel = KernelDispatch("column_bboxes", column_bboxes,
                                      gpu=f"{_PKG}.tessellation_kernels_gpu:column_bboxes_gpu",
                                      chunk_of=column_chunk)
