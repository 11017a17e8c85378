"""Public functions on tetrahedra: exact tetrahedron-cube overlap volumes and
tetrahedron mass deposits onto a regular grid.

Both take NumPy or CuPy tetrahedra and run the kernel of the contract for that
array type (:mod:`.dispatch`): the numba kernels of :mod:`.tet_volume` or the CUDA
kernels of :mod:`.tet_volume_gpu` (method, cost and accuracy in their docstrings).
"""

from __future__ import annotations

from ..core.backend import array_module
from .dispatch import deposit_tets_kernel, tet_cube_volume_kernel

__all__ = ["tet_cube_volume", "deposit_tets"]


def _as_array(x):
    """``x`` as an array of its own module (a list or tuple becomes a NumPy array)."""
    return array_module(x).asarray(x)


def tet_cube_volume(tets, cube_lo, cube_size):
    """Exact volume of the intersection of each tetrahedron with each axis-aligned cube.

    Parameters
    ----------
    tets : array_like, (T, 4, 3) or (4, 3)
        Vertex coordinates, float32 or float64, NumPy or CuPy. Vertex order and
        orientation do not matter.
    cube_lo : array_like, (C, 3) or (3,)
        Lower corners of the cubes.
    cube_size : float or array_like (C,)
        Cube sides (> 0); a scalar applies to every cube.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        (T, C) volumes: every tetrahedron against every cube (outer product).
        A (3,) ``cube_lo`` drops the cube axis: (T,). A (4, 3) ``tets`` keeps
        the tet axis (T = 1). NumPy input gives float64 (float32 input is
        converted to float64 first). CuPy input runs the GPU kernel of
        :mod:`.tet_volume_gpu` (float64 arithmetic and output there too).

    Notes
    -----
    Method and cost: see :mod:`.tet_volume` (clip against the six cube planes,
    depth first; fast paths for disjoint, tet-in-cube and cube-in-tet). Work
    is O(T * C); the CPU loop is parallel over tetrahedra (numba ``prange``).
    Degenerate (zero-volume) tetrahedra give 0, never NaN.
    """
    return tet_cube_volume_kernel(_as_array(tets), cube_lo, cube_size)


def deposit_tets(tets, mass, grid_lo, cell_size, shape, *, periodic=False, out=None):
    """Deposit the mass of tetrahedra onto a regular grid by exact overlap volumes.

    Cell ``(i, j, k)`` is the cube ``grid_lo + (i, j, k) * cell_size + [0, cell_size]^3``.
    Each tetrahedron adds ``mass * overlap / volume`` to every cell it overlaps
    (its mass is spread uniformly over its volume).

    Parameters
    ----------
    tets : array_like, (T, 4, 3)
        Vertices (float32 or float64; NumPy, or CuPy for the GPU kernel).
    mass : array_like, (T,) or float
        Mass of each tetrahedron.
    grid_lo : (3,) float
        Lower corner of cell (0, 0, 0).
    cell_size : float
        Cell side (> 0).
    shape : (int, int, int)
        Cells per axis.
    periodic : bool
        True: cell indices wrap modulo ``shape`` (a periodic box of side
        ``shape * cell_size`` starting at ``grid_lo``), so tetrahedra unwrapped
        across the box edge are deposited whole. False: mass falling outside
        the grid is dropped (a patch of a larger grid).
    out : ndarray (nx, ny, nz) float64, optional
        Accumulate into this array (same device as ``tets``) instead of a new one.

    Returns
    -------
    ndarray, (nx, ny, nz) float64
        Mass per cell (NumPy for NumPy input, CuPy for CuPy input).

    Notes
    -----
    Coordinates are rescaled to cell units (float64); each tetrahedron is then
    voxelised by cutting its four faces at the grid planes (see :mod:`.tet_volume`;
    exact overlap volumes, like :func:`tet_cube_volume`). A
    tetrahedron inside one cell puts all its mass there, a zero-volume one puts
    its whole mass into the cell holding its vertex centroid, and one whose
    bounding box misses a non-periodic grid is skipped after a box test. The CPU
    loop is serial (deterministic sums; parallelism comes from dask tasks over
    blocks). Cost ~ the cells each tetrahedron's faces reach (a few polygon
    cuts each), not the cells of its bounding box. Mass is conserved to
    rounding when every tetrahedron lies in the grid (or ``periodic``): ~1e-15
    relative per ordinary tetrahedron, up to ~1e-11 for slivers of 1e-5 cell
    volumes (the rounding of their own volume).
    """
    return deposit_tets_kernel(_as_array(tets), mass, grid_lo, cell_size, shape,
                               periodic=periodic, out=out)
