"""Periodic particle-mesh (PM) gravity as a Dask graph.

Graph (one call, ``C`` particle chunks):

1. ``gravity-pm-check``: one task per chunk checks that the positions lie in
   ``[0, box_size)`` (raises :class:`~cosmo_dask.errors.ParameterError` at
   compute time otherwise).
2. CIC deposit: :func:`cosmo_dask.density.paint.partial_meshes` paints every
   chunk onto its own ``n^3`` mass mesh (numba or CuPy) and
   :func:`cosmo_dask.density.paint.tree_sum` adds them (8 per task): the mesh
   painting of the density package, not a second deposit.
3. ``gravity-pm-fft``: **one task** per mesh (two when interlaced), each on one
   worker: ``rfftn``, Green's function with the Gaussian split and CIC
   deconvolution, spectral gradient, 3 or 4 ``irfftn`` (:mod:`~cosmo_dask.gravity.pm_kernels`, or
   :mod:`~cosmo_dask.gravity.pm_kernels_gpu` for a CuPy mesh). Output: one
   ``(3 or 4, n, n, n)`` chunk of force (and potential) meshes.
4. ``gravity-pm-interp``: one task per particle chunk CIC-interpolates the
   meshes at its particles (and averages the two interlaced meshes); the
   outputs follow the input's row chunks.

Size limit: the FFT task holds the whole mesh, about ``7 n^3`` words at peak
(:func:`~cosmo_dask.gravity.pm_kernels.mesh_bytes`: 7.5 GB at ``n = 512``, 60 GB
at 1024 in float64, half in float32), and every interpolation task reads the
``(4, n, n, n)`` meshes (4 GB at 512 in float64), which the scheduler copies once
to each worker. ``n_mesh > MAX_N_MESH`` (1024) raises ``NotImplementedError``:
a mesh split over workers (slab or pencil FFT) is not implemented.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..backend import array_module, particle_rows, resolve_precision
from ..density.paint import check_n_mesh as check_mesh_size
from ..density.paint import partial_meshes, tree_sum
from ..errors import ParameterError

__all__ = ["pm_accelerations", "MAX_N_MESH", "check_box_size", "check_n_mesh",
           "inside_box", "long_range", "pm_meshes", "pm_interpolate"]

#: the largest mesh whose FFT task runs on one worker
MAX_N_MESH = 1024


def check_box_size(box_size, what: str) -> float:
    """``box_size`` as a positive float; ``None`` (isolated system) is refused."""
    if box_size is None:
        raise ParameterError(f"{what}: box_size is required: PM forces are periodic and the "
                             "input is isolated (box_size=None); use method 'tree' or "
                             "'direct' for an isolated system")
    ok = not isinstance(box_size, bool) and isinstance(box_size, (int, float, np.integer,
                                                                 np.floating))
    if not ok or not math.isfinite(float(box_size)) or float(box_size) <= 0:
        raise ParameterError(f"{what}: box_size must be a finite number > 0, got {box_size!r}")
    return float(box_size)


def check_n_mesh(n_mesh, what: str) -> int:
    """``n_mesh`` as a positive int (:func:`cosmo_dask.density.paint.check_n_mesh`); above
    :data:`MAX_N_MESH` raises NotImplementedError."""
    n_mesh = check_mesh_size(n_mesh, what)
    if n_mesh > MAX_N_MESH:
        raise NotImplementedError(
            f"{what}: n_mesh={n_mesh} is larger than {MAX_N_MESH}: the PM FFT runs on one "
            f"worker (about 56 n_mesh^3 bytes in float64) and a mesh split over workers "
            "(slab/pencil FFT) is not implemented")
    return int(n_mesh)


def _check_number(value, name: str, what: str, *, allow_zero: bool) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    ok = ok and math.isfinite(float(value)) and (float(value) >= 0 if allow_zero
                                                 else float(value) > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ParameterError(f"{what}: {name} must be a finite number {bound}, got {value!r}")
    return float(value)


def _check_inside_block(block, box, what, block_info=None):
    xp = array_module(block)
    if block.shape[0] == 0:
        return block
    lo, hi = float(block.min()), float(block.max())
    if math.isfinite(lo) and math.isfinite(hi) and lo >= 0 and hi < box:
        return block
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    bad = ~(xp.isfinite(block) & (block >= 0) & (block < box)).all(axis=1)
    i = int(xp.argmax(bad))
    value = block[i].tolist()
    raise ParameterError(f"{what}: particle {offset + i} at {value} is outside the periodic box "
                         f"[0, {box:g}) (positions must be finite with 0 <= x < box_size; "
                         "wrap them into the box first)")


def inside_box(pos: da.Array, box_size: float, what: str) -> da.Array:
    """``pos`` with a per-chunk check (``gravity-pm-check``) that every position is in the box."""
    return pos.map_blocks(_check_inside_block, box_size, what, dtype=pos.dtype, meta=pos._meta,
                          name=f"gravity-pm-check-{tokenize(pos, box_size)}")


def checked_particles(pos, mass, box_size: float, what: str):
    """``(pos, mass, n)`` for a periodic mesh method: rows checked, a mass required
    (positive and finite when one number), every position checked to lie in the box
    when it is computed (:func:`inside_box`)."""
    pos, m, n = particle_rows(pos, mass, what)
    if m is None:
        raise ParameterError(f"{what}: mass is required (an (N,) array or one number)")
    if not isinstance(m, da.Array) and not (math.isfinite(m) and m > 0):
        raise ParameterError(f"{what}: mass must be positive and finite, got {m!r}")
    return inside_box(pos, box_size, what), m, n


def _fft_block(mass_mesh, *, box, rs, G, potential):
    if array_module(mass_mesh) is np:
        from .pm_kernels import long_range_meshes_numpy

        return long_range_meshes_numpy(mass_mesh, box, rs, G, potential)
    from .pm_kernels_gpu import long_range_meshes_cupy

    return long_range_meshes_cupy(mass_mesh, box, rs, G, potential)


def _interp_block(pos, mass, *meshes, box, shifts, self_coef, out_dtype):
    """Average over ``shifts`` of the CIC-interpolated ``meshes``, + self term on column 3."""
    xp = array_module(pos)
    if xp is np:
        from .pm_kernels import cic_interpolate_numpy as interp
    else:
        from .pm_kernels_gpu import cic_interpolate_cupy as interp
    vals = interp(pos, meshes[0], box, shifts[0])
    for mesh, shift in zip(meshes[1:], shifts[1:], strict=True):
        vals += interp(pos, mesh, box, shift)
    if len(meshes) > 1:
        vals *= 1.0 / len(meshes)
    if self_coef and vals.shape[1] == 4:
        m = mass.astype(np.float64) if hasattr(mass, "shape") else float(mass)
        vals[:, 3] += self_coef * m
    return vals.astype(out_dtype, copy=False)


def pm_meshes(pos: da.Array, mass, *, G: float, box_size: float, n_mesh: int, r_split: float,
              dtype, potential: bool, shift: float = 0.0) -> da.Array:
    """The ``gravity-pm-fft`` output: a one-chunk ``(3 or 4, n, n, n)`` dask array.

    ``pos`` must already be checked (rows-chunked dask array inside the box);
    ``shift`` (cells) is the mesh offset of :func:`cosmo_dask.density.paint.paint`.
    """
    n = n_mesh
    mesh = tree_sum(partial_meshes(pos, mass, n_mesh=n, box_size=box_size, scheme="cic",
                                   shift=float(shift), dtype=dtype))
    c = 4 if potential else 3
    token = tokenize(mesh, G, box_size, r_split, potential)
    return da.blockwise(_fft_block, "cxyz", mesh, "xyz", new_axes={"c": c}, dtype=dtype,
                        meta=array_module(pos).empty((0, 0, 0, 0), dtype=dtype),
                        name=f"gravity-pm-fft-{token}", box=box_size, rs=r_split, G=G,
                        potential=potential)


def pm_interpolate(pos: da.Array, mass, meshes, shifts, *, box_size: float, self_coef: float,
                   dtype) -> da.Array:
    """``gravity-pm-interp``: (N, c) mean over ``meshes`` of their values at ``pos``.

    ``meshes`` is a list of :func:`pm_meshes` outputs painted with the given
    ``shifts``; one task per chunk of ``pos`` reads them all. ``self_coef * m_i``
    is added to the last column when there are 4 (the potential's self-pair
    correction). The output is chunked like ``pos``.
    """
    c = meshes[0].shape[0]
    token = tokenize(pos, mass, meshes, shifts, box_size, self_coef)
    mesh_args = [x for mm in meshes for x in (mm, "cxyz")]
    mass_arg = (mass, "i") if isinstance(mass, da.Array) else (float(mass), None)
    return da.blockwise(_interp_block, "ij", pos, "ij", *mass_arg, *mesh_args,
                        adjust_chunks={"j": c}, concatenate=True, dtype=dtype,
                        meta=array_module(pos).empty((0, 0), dtype=dtype),
                        name=f"gravity-pm-interp-{token}", box=box_size,
                        shifts=tuple(float(x) for x in shifts), self_coef=float(self_coef),
                        out_dtype=np.dtype(dtype))


def long_range(pos: da.Array, mass, *, G: float, box_size: float, n_mesh: int, r_split: float,
               dtype, potential: bool, interlace: bool) -> da.Array:
    """(N, 3 or 4) PM accelerations (and potentials) of checked positions, chunked like ``pos``."""
    shifts = (0.0, 0.5) if interlace else (0.0,)
    meshes = [pm_meshes(pos, mass, G=G, box_size=box_size, n_mesh=n_mesh, r_split=r_split,
                        dtype=dtype, potential=potential, shift=s) for s in shifts]
    self_coef = G / (math.sqrt(math.pi) * r_split) if (potential and r_split > 0) else 0.0
    return pm_interpolate(pos, mass, meshes, shifts, box_size=box_size, self_coef=self_coef,
                          dtype=dtype)


def pm_accelerations(pos, mass, *, G: float, box_size: float, n_mesh: int, r_split: float = 0.0,
                     precision: str = "float64", potential: bool = True,
                     interlace: bool = True):
    """Periodic PM accelerations and potentials (long-range part when ``r_split > 0``).

    Parameters
    ----------
    pos : (N, 3) dask array (or NumPy/CuPy array)
        Positions in ``[0, box_size)`` (length units). CuPy chunks run on the GPU.
    mass : (N,) dask array or float
        Particle masses (mass units), or one mass for all.
    G : float
        Gravitational constant (length^3 / (mass time^2)), > 0.
    box_size : float
        Side of the periodic cube, > 0. ``None`` (an isolated snapshot) raises.
    n_mesh : int
        Mesh cells per side, 1..:data:`MAX_N_MESH`.
    r_split : float
        Gaussian split scale ``rs`` (length units, >= 0): the mesh force is the
        long-range part ``exp(-k^2 rs^2)`` of the periodic force, i.e. the pair
        force ``-G m r/r^3 [erf(x) - (2x/sqrt(pi)) exp(-x^2)]``, ``x = r/(2 rs)``.
        0 means no split (plain PM).
    precision : {"float32", "float64"}
        Dtype of the meshes, the FFTs and the outputs (CIC weights and
        interpolation sums are float64).
    potential : bool
        Also compute the potential.
    interlace : bool
        Average the forces of two meshes offset by half a cell (default): about
        4x smaller mesh force errors for twice the PM cost (see
        :mod:`~cosmo_dask.gravity.pm_kernels`).

    Returns
    -------
    acc : (N, 3) dask array
        Accelerations (length / time^2), input order and row chunks.
    pot : (N,) dask array or None
        Specific potential (length^2 / time^2). For ``r_split > 0`` it is the
        long-range part with zero-mean kernel, ``phi_i = -G sum_j m_j psi_L(x_i - x_j)
        + G m_i / (sqrt(pi) rs)`` with
        ``psi_L(r) = (4 pi / L^3) sum_{k != 0} exp(-k^2 rs^2) cos(k.r) / k^2``; the
        last term removes the self pair's ``r -> 0`` limit, so the ``j = i`` term
        left is the particle's own periodic images. For ``r_split = 0`` the
        ``j = i`` term also holds the particle's mesh self-energy (a mesh
        artefact of order ``G m / H``, ``H = L / n_mesh``).

    Raises
    ------
    ParameterError
        ``box_size`` missing or not positive, ``n_mesh`` not a positive
        integer, negative ``r_split``, ``G`` not positive, bad precision or
        shapes; at compute time, a position outside ``[0, box_size)``.
    NotImplementedError
        ``n_mesh > MAX_N_MESH`` (the mesh would not fit one worker).

    Notes
    -----
    Accuracy (measured in ``tests/test_pm.py`` against the Ewald long-range
    sum): see the test docstrings. The mesh force conserves momentum
    (``sum m a = 0`` to rounding) and has no self-force. Cost: O(N) deposit
    and interpolation, O(n^3 log n) for the 4-5 FFTs in one task.
    """
    what = "pm_accelerations"
    box = check_box_size(box_size, what)
    n = check_n_mesh(n_mesh, what)
    rs = _check_number(r_split, "r_split", what, allow_zero=True)
    G = _check_number(G, "G", what, allow_zero=False)
    dtype = resolve_precision(precision)
    pos, m, _ = checked_particles(pos, mass, box, what)
    vals = long_range(pos, m, G=G, box_size=box, n_mesh=n, r_split=rs, dtype=dtype,
                      potential=bool(potential), interlace=bool(interlace))
    acc = vals[:, :3]
    pot = vals[:, 3] if potential else None
    return acc, pot
