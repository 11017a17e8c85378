"""Mesh painting: mass assignment (NGP, CIC, TSC, PCS) of particles onto a periodic mesh.

:func:`paint` returns a lazy dask array ``(n_mesh,)*3`` holding the **mass per
cell** (mass units of the input; density = mesh / cell volume, density
contrast = :func:`density_contrast`, i.e. ``mesh / mesh.mean() - 1``).

Method: every particle chunk is painted onto its own full partial mesh (numba on
NumPy chunks, a CuPy atomicAdd kernel on CuPy chunks; see
:mod:`~cosmo_dask.density.paint_kernels` for the convention and weights) and
the partial meshes are added by a tree reduction (``split_every`` of them per
task, default up to 8, fewer where half a worker's memory holds fewer): the only
global step. The result is one chunk.

Memory: each painting task holds one ``n_mesh^3`` mesh (``8 n_mesh^3`` bytes in
float64: 134 MB at 256, 1.07 GB at 512, 8.6 GB at 1024) and each reduction task
holds up to ``split_every`` of them, so a worker needs about
``(threads + split_every) * 8 n_mesh^3`` bytes at peak. Meshes beyond ~1024^3
(or that do not fit a worker a few times) are out of scope of this
implementation: slab decomposition (each chunk depositing only into the z slabs
it touches) is not implemented.
"""

from __future__ import annotations

import math

import dask
import dask.array as da
import numpy as np

from ..backend import array_module, particle_rows, resolve_precision
from ..errors import ParameterError
from ..progress import compute
from .paint_kernels import SCHEMES

__all__ = ["paint", "density_contrast", "SCHEMES"]


def check_n_mesh(n_mesh, what):
    if isinstance(n_mesh, bool) or not isinstance(n_mesh, (int, np.integer)) or n_mesh < 1:
        raise ParameterError(f"{what}: n_mesh must be a positive integer, got {n_mesh!r}")
    return int(n_mesh)


def check_scheme(scheme, what):
    if not isinstance(scheme, str) or scheme.lower() not in SCHEMES:
        raise ParameterError(f"{what}: scheme must be one of {', '.join(SCHEMES)}, "
                             f"got {scheme!r}")
    return scheme.lower()


def particles_input(snap_or_pos, mass=None, box_size=None, *, what="paint"):
    """Positions, masses and box of a Snapshot or raw arrays, checked.

    Returns ``(pos, mass, box_size, n_particles)``: ``pos`` a dask (N, 3) array
    with one column chunk, ``mass`` a float (all particles alike) or a dask (N,)
    array chunked like ``pos``. Raw positions without ``mass`` get mass 1 each
    (the mesh then counts particles). An array of masses is checked eagerly
    (one pass: all positive and finite).
    """
    from ..snapshot import particles_of

    pos, mass, box, snap = particles_of(snap_or_pos, mass, box_size, what=what)
    if box is None:
        if snap is not None:
            raise ParameterError(f"{what}: {snap.source or 'the snapshot'} is not periodic "
                                 "(no box_size); pass box_size= (the side of a periodic cube "
                                 "[0, box_size)^3 to paint into)")
        raise ParameterError(f"{what}: raw positions need box_size= (the side of the "
                             "periodic cube [0, box_size)^3)")
    if mass is None:
        mass = 1.0
    try:
        box = float(box)
    except (TypeError, ValueError):
        raise ParameterError(f"{what}: box_size must be a positive number, got {box!r}") \
            from None
    if not (math.isfinite(box) and box > 0):
        raise ParameterError(f"{what}: box_size must be a positive number, got {box!r}")
    pos, m, n = particle_rows(pos, mass, what)
    if not isinstance(m, da.Array):
        if not (math.isfinite(m) and m > 0):
            raise ParameterError(f"{what}: masses must be positive and finite, got {m!r}")
        return pos, m, box, n
    (ok,) = compute(((m > 0) & da.isfinite(m)).all(), label=None)
    if not bool(ok):
        raise ParameterError(f"{what}: masses must be positive and finite")
    return pos, m, box, n


def _paint_block(pos, mass=None, *, mass_scalar, n, box, scheme, shift, dtype):
    m = mass_scalar if mass is None else mass
    try:
        if array_module(pos) is not np:
            from .paint_kernels_gpu import paint_cupy

            mesh = paint_cupy(pos, m, n, box, scheme, shift, dtype)
        else:
            from .paint_kernels import paint_numpy

            mesh = paint_numpy(pos, m, n, box, scheme, shift, dtype)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    return mesh[None]


def _add(*meshes):
    """Sum partial meshes into the first (each partial has this task as only consumer)."""
    out = meshes[0]
    for m in meshes[1:]:
        out += m
    return out


def _squeeze(mesh):
    return mesh[0]


def memory_per_worker(gpu: bool) -> tuple[int | None, str]:
    """``(bytes, what)``: the memory one task can use: the GPU's (device 0), the smallest
    ``memory_limit`` of the active distributed client's workers, else this machine's."""
    if gpu:
        import cupy

        return int(cupy.cuda.Device(0).mem_info[1]), "GPU"
    from ..progress import active_client

    client = active_client()
    if client is not None:
        limits = [w.get("memory_limit") or 0 for w in
                  client.scheduler_info().get("workers", {}).values()]
        if limits and min(limits) > 0:
            return int(min(limits)), "worker"
    import psutil

    return int(psutil.virtual_memory().total), "machine"


def check_mesh_fits(n: int, *, gpu: bool, meshes: int = 2) -> None:
    """ParameterError when ``meshes`` float64 ``n^3`` meshes (a task's least: the mesh it
    paints and one it adds) exceed one worker's memory, naming the largest n that fits."""
    need = meshes * 8 * n**3
    have, where = memory_per_worker(gpu)
    if have and need > have:
        largest = int((have / (meshes * 8)) ** (1 / 3))
        raise ParameterError(
            f"n_mesh={n} needs at least {need / 2**30:.1f} GiB in one {where} "
            f"({meshes} float64 meshes of {n}^3), which has {have / 2**30:.1f} GiB; "
            f"the largest n_mesh that fits is about {largest}")


def partial_meshes(pos, mass, *, n_mesh, box_size, scheme, shift, dtype) -> da.Array:
    """Per-chunk meshes, dask array ``(n_chunks, n, n, n)`` (one chunk per partial)."""
    n = n_mesh
    check_mesh_fits(n, gpu=array_module(pos) is not np)
    kw = dict(new_axes={"x": n, "y": n, "z": n}, adjust_chunks={"i": 1}, concatenate=True,
              dtype=dtype, meta=array_module(pos).empty((0, 0, 0, 0), dtype=dtype), n=n,
              box=box_size, scheme=scheme, shift=float(shift), mdtype=np.dtype(dtype))
    if isinstance(mass, da.Array):
        return da.blockwise(_paint_pair, "ixyz", pos, "ij", mass, "i", **kw)
    return da.blockwise(_paint_single, "ixyz", pos, "ij", mass_scalar=float(mass), **kw)


def _paint_pair(pos, mass, *, n, box, scheme, shift, mdtype):
    return _paint_block(pos, mass, mass_scalar=0.0, n=n, box=box, scheme=scheme, shift=shift,
                        dtype=mdtype)


def _paint_single(pos, *, mass_scalar, n, box, scheme, shift, mdtype):
    return _paint_block(pos, None, mass_scalar=mass_scalar, n=n, box=box, scheme=scheme,
                        shift=shift, dtype=mdtype)


def tree_sum(parts: da.Array, split_every: int | None = None) -> da.Array:
    """Sum the partial meshes of ``parts`` ``(k, n, n, n)`` by a tree of ``split_every``-way
    additions (in place, no concatenation): returns a one-chunk ``(n, n, n)`` dask array.

    The default takes as many meshes per addition as fill half of one worker's memory
    (:func:`memory_per_worker`), between 2 and 8: with 2 GB workers and 256^3 float64
    meshes that is 7, with 1 GB 3 (8 would need 1 GiB of inputs in one task, which the
    scheduler refuses to place)."""
    n = parts.shape[1:]
    if split_every is None:
        mesh_bytes = math.prod(n) * parts.dtype.itemsize
        have, _ = memory_per_worker(array_module(parts._meta) is not np)
        split_every = max(2, min(8, int(0.5 * have / mesh_bytes))) if have else 8
    nodes = list(parts.to_delayed(optimize_graph=False).ravel())
    add = dask.delayed(_add, pure=True)
    while len(nodes) > 1:
        nodes = [add(*nodes[i:i + split_every]) if len(nodes[i:i + split_every]) > 1
                 else nodes[i] for i in range(0, len(nodes), split_every)]
    final = dask.delayed(_squeeze, pure=True)(nodes[0])
    return da.from_delayed(final, shape=n, dtype=parts.dtype, meta=parts._meta.reshape((0, 0, 0)))


def _interlace_block(m0, m1):
    """Average of ``m0`` and ``m1`` (painted with a half-cell shift) combined in Fourier space."""
    xp = array_module(m0)
    n = m0.shape[0]
    f0 = xp.fft.rfftn(m0)
    f1 = xp.fft.rfftn(m1)
    phase = half_cell_phase(xp, n)
    out = xp.fft.irfftn((f0 + f1 * phase) * 0.5, s=m0.shape, axes=(0, 1, 2))
    return out.astype(m0.dtype, copy=False)


def half_cell_phase(xp, n):
    """``exp(i (kx + ky + kz) H / 2)`` on the rfft half-space of an n^3 mesh (H = cell)."""
    q = 2.0 * np.pi * np.fft.fftfreq(n)  # k H for the full axes
    qz = 2.0 * np.pi * np.fft.rfftfreq(n)
    ph = lambda v: xp.asarray(np.exp(0.5j * v))  # noqa: E731
    return ph(q)[:, None, None] * ph(q)[None, :, None] * ph(qz)[None, None, :]


def paint(snap_or_pos, mass=None, *, n_mesh, box_size=None, scheme="cic", interlace=False,
          shift=0.0, precision="float64", split_every=None) -> da.Array:
    """Paint particles' masses onto a periodic ``n_mesh^3`` mesh (mass per cell).

    Parameters
    ----------
    snap_or_pos : Snapshot or array (N, 3)
        A periodic snapshot, or positions (NumPy, CuPy or dask arrays; CuPy chunks
        are painted on the GPU and give a CuPy-backed mesh). Positions outside
        ``[0, box_size)`` are wrapped periodically.
    mass : array (N,) or float, optional
        Default: the snapshot's masses (``mass`` array or ``particle_mass``);
        1 per particle for raw positions (the mesh then counts particles). An
        array is checked eagerly (positive, finite).
    n_mesh : int
        Cells per side, >= 1.
    box_size : float, optional
        Side of the periodic cube. Required for raw positions and for a
        snapshot without ``box_size`` (isolated).
    scheme : {"ngp", "cic", "tsc", "pcs"}
        Mass-assignment kernel of order 1-4: nearest grid point, cloud in cell,
        triangular-shaped cloud, piecewise cubic spline. Each particle touches
        ``order^3`` cells. Cell ``i`` covers ``[i H, (i+1) H)``, ``H = L/n``; the
        kernels are centred on cell centres.
    interlace : bool
        Return the average of this mesh and the mesh painted with positions
        shifted by half a cell, the latter phase-shifted back in Fourier space
        (Hockney & Eastwood; Sefusatti et al. 2016). This cancels the odd
        aliasing images; costs a second painting pass and three FFTs of the whole
        mesh in one task. :func:`cosmo_dask.analysis.power_spectrum` does its own
        interlacing and does not need this.
    shift : float
        Shift of the mesh coordinate in cells (``u = x/H - 1/2 + shift``); 0.5
        gives the second mesh of an interlaced pair.
    precision : {"float64", "float32"}
        Dtype of the mesh (weights are computed in float64 on both devices).
    split_every : int, optional
        Partial meshes added per reduction task (>= 2; default: as many as fill half
        of one worker's memory, at most 8).

    Returns
    -------
    dask.array.Array
        ``(n_mesh, n_mesh, n_mesh)``, one chunk, mass per cell (sum = total mass
        to rounding: ~1e-15 relative in float64) in the snapshot's mass unit.
        Divide by ``(L/n)^3`` for a density; see :func:`density_contrast`.
        :func:`~cosmo_dask.density.mesh_store.write_mesh` with ``units=snap.units``
        stores it with its units.

    Raises
    ------
    ParameterError
        ``n_mesh`` not a positive integer, an unknown scheme, no ``box_size``
        for raw positions or an isolated snapshot, masses not positive and
        finite, wrong shapes, empty input; at compute time, non-finite positions.

    Notes
    -----
    Cost: O(N order^3) scattered additions (numba, serial per chunk; or GPU
    atomics), plus ``n_chunks`` mesh zeroings and ``n_chunks - 1`` mesh
    additions (memory bound: 8 n^3 bytes each). Memory: one ``n_mesh^3`` mesh per
    painting task in flight and up to ``split_every`` per reduction task (see the
    module docstring); no slab decomposition.
    """
    what = "paint"
    n = check_n_mesh(n_mesh, what)
    scheme = check_scheme(scheme, what)
    dtype = resolve_precision(precision)
    if split_every is not None and (isinstance(split_every, bool) or not isinstance(
            split_every, (int, np.integer)) or split_every < 2):
        raise ParameterError(f"{what}: split_every must be an integer >= 2, got {split_every!r}")
    try:
        shift = float(shift)
    except (TypeError, ValueError):
        raise ParameterError(f"{what}: shift must be a number of cells, got {shift!r}") \
            from None
    if not math.isfinite(shift):
        raise ParameterError(f"{what}: shift must be finite, got {shift!r}")
    pos, m, box, _ = particles_input(snap_or_pos, mass, box_size, what=what)
    mesh = tree_sum(partial_meshes(pos, m, n_mesh=n, box_size=box, scheme=scheme, shift=shift,
                                   dtype=dtype), split_every)
    if not interlace:
        return mesh
    mesh2 = tree_sum(partial_meshes(pos, m, n_mesh=n, box_size=box, scheme=scheme,
                                    shift=shift + 0.5, dtype=dtype), split_every)
    return da.map_blocks(_interlace_block, mesh, mesh2, dtype=dtype)


def density_contrast(mesh):
    """``delta = mesh / mean(mesh) - 1`` (lazy for dask input; same module as ``mesh``)."""
    return mesh / mesh.mean() - 1.0
