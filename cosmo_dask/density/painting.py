"""Mesh painting: mass assignment (NGP, CIC, TSC, PCS) of particles onto a periodic mesh.

:func:`paint` returns a lazy dask array ``(n_mesh,)*3`` holding the **mass per
cell** (mass units of the input; density = mesh / cell volume, density
contrast = :func:`density_contrast`, i.e. ``mesh / mesh.mean() - 1``), **in
slabs along axis 0** (``chunks = (slab_chunks(n, S), n, n)``): the layout of
the distributed FFT (:mod:`cosmo_dask.spatial.fft`), so P(k), PM and TreePM
take it from here without regathering (:func:`paint_meshes` is their entry).

Method (the mesh path, :mod:`cosmo_dask.spatial.slabs` and ``docs/fft.md``): every
particle chunk is split by the slabs its assignment kernel reaches (its home
plane, the kernel's spill into the next planes, a one-plane margin, periodic
wrap), and each slab is deposited by one task from the pieces of every chunk
(numba on NumPy chunks, a CuPy atomicAdd kernel on CuPy chunks; see
:mod:`~cosmo_dask.density.paint_kernels` for the convention and weights):
no slab is ever summed from partial meshes, and no task holds more than one
slab. When there are fewer slabs than worker threads (a small mesh: one slab),
a slab's chunks are painted in a few groups in parallel and their slabs summed
by a tree of ``split_every``-way additions.

Slab count ``S``: :func:`~cosmo_dask.spatial.fft.default_slab_count` (one slab
up to a 256 MiB complex mesh, else one per 64 MiB and at least one per worker
thread), raised where a task would not fit a worker; ``slabs=`` or the dask
config key ``cosmo_dask.mesh_slabs`` set it.

Memory (checked before any work by :func:`mesh_slabs`): a deposit task holds
one slab (``8 n^3 / S`` bytes in float64) and the particles sent to it; the
whole mesh, ``8 n^3`` bytes, is spread over the workers (134 MB at 256, 1.07 GB
at 512, 8.6 GB at 1024, 68.7 GB at 2048). ``n_mesh`` may be up to 4096 with
prime factors 2, 3, 5, 7 (:func:`~cosmo_dask.spatial.fft.check_mesh_size`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np

from ..core.backend import array_module, particle_rows, resolve_precision
from ..core.errors import ParameterError
from ..core.progress import compute, worker_count, worker_threads
from ..spatial.fft import (
    default_slab_count,
    irfftn,
    map_kslabs,
    rfftn,
    smooth_size_below,
)
from ..spatial.slabs import SlabExchange, slab_layout
from .dispatch import paint_kernel
from .parameters import (
    SCHEME_DEFAULT,
    SCHEMES,
    check_box_size,
    check_n_mesh,
    check_scheme,
    check_split_every,
)

__all__ = ["paint", "density_contrast", "SCHEMES", "check_n_mesh", "check_scheme",
           "centred", "half_cell_phase", "interlace_kslab", "memory_per_worker", "meshes_fit",
           "mesh_slabs", "mesh_statistic_input", "MeshStatisticInput", "paint_meshes",
           "particles_input", "worker_count"]


def particles_input(snap_or_pos, mass=None, box_size=None, *, what="paint"):
    """Positions, masses and box of a Snapshot or raw arrays, checked.

    Returns ``(pos, mass, box_size, n_particles)``: ``pos`` a dask (N, 3) array
    with one column chunk, ``mass`` a float (all particles alike) or a dask (N,)
    array chunked like ``pos``. Raw positions without ``mass`` get mass 1 each
    (the mesh then counts particles). An array of masses is checked eagerly
    (one pass: all positive and finite).
    """
    from ..store.snapshot import particles_of

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
    box = check_box_size(box, what)
    pos, m, n = particle_rows(pos, mass, what)
    if not isinstance(m, da.Array):
        if not (math.isfinite(m) and m > 0):
            raise ParameterError(f"{what}: masses must be positive and finite, got {m!r}")
        return pos, m, box, n
    (ok,) = compute(((m > 0) & da.isfinite(m)).all(), label=None)
    if not bool(ok):
        raise ParameterError(f"{what}: masses must be positive and finite")
    return pos, m, box, n


@dataclass(frozen=True)
class MeshStatisticInput:
    """What a statistic of the mesh path (P(k), the bispectrum) was given, checked:
    a painted mesh (``mesh``, ``is_mesh``) or particles (``pos``, ``mass``, ``n_particles``),
    the mesh side ``n``, the box, the device (``gpu``) and the length unit."""

    is_mesh: bool
    n: int
    box_size: float
    gpu: bool
    length_unit: str | None
    mesh: Any = None
    pos: Any = None
    mass: Any = None
    n_particles: int | None = None


def mesh_statistic_input(snap_or_mesh, *, n_mesh, box_size, scheme, mass, length_unit,
                         what: str) -> MeshStatisticInput:
    """The one reading of a mesh statistic's first argument: a Snapshot, particle
    positions or an ``(n, n, n)`` painted mesh. A mesh must be cubic, match ``n_mesh``
    when given and come with ``box_size``; particles need ``n_mesh`` and a ``scheme``
    (:func:`particles_input` checks them). ``length_unit`` defaults to a snapshot's.
    ``ParameterError`` naming ``what`` otherwise, before any work."""
    from ..store.snapshot import Snapshot

    if length_unit is None and isinstance(snap_or_mesh, Snapshot):
        length_unit = (snap_or_mesh.units or {}).get("length")
    if not isinstance(snap_or_mesh, Snapshot) and getattr(snap_or_mesh, "ndim", 0) == 3:
        mesh = snap_or_mesh
        shp = tuple(int(s) for s in mesh.shape)
        if len(set(shp)) != 1 or shp[0] < 1:
            raise ParameterError(f"{what}: a mesh must be cubic (n, n, n), got {shp}")
        n = shp[0]
        if n_mesh is not None and check_n_mesh(n_mesh, what) != n:
            raise ParameterError(f"{what}: n_mesh={n_mesh} does not match the mesh ({n}^3)")
        if box_size is None:
            raise ParameterError(f"{what}: a mesh input needs box_size=")
        return MeshStatisticInput(True, n, check_box_size(box_size, what),
                                  array_module(getattr(mesh, "_meta", mesh)) is not np,
                                  length_unit, mesh=mesh)
    if n_mesh is None:
        raise ParameterError(f"{what}: particles need n_mesh= (cells per side)")
    n = check_n_mesh(n_mesh, what)
    if scheme is None:
        raise ParameterError(f"{what}: particles need a scheme ({', '.join(SCHEMES)})")
    pos, m, box, n_part = particles_input(snap_or_mesh, mass, box_size, what=what)
    return MeshStatisticInput(False, n, box, array_module(pos) is not np, length_unit,
                              pos=pos, mass=m, n_particles=n_part)


# ----------------------------------------------------------------------------- memory
def memory_per_worker(gpu: bool) -> tuple[int | None, str]:
    """``(bytes, what)``: the memory one task can use: the GPU's (device 0), the smallest
    ``memory_limit`` of the active distributed client's workers, else this machine's."""
    if gpu:
        import cupy

        return int(cupy.cuda.Device(0).mem_info[1]), "GPU"
    from ..core.progress import active_client

    client = active_client()
    if client is not None:
        limits = [w.get("memory_limit") or 0 for w in
                  client.scheduler_info().get("workers", {}).values()]
        if limits and min(limits) > 0:
            return int(min(limits)), "worker"
    import psutil

    return int(psutil.virtual_memory().total), "machine"


#: a slab task holds about this many slabs at once (one in, one out, an FFT's or a
#: transpose's copy, a Green's function's temporary)
TASK_SLABS = 4
#: a mesh of one slab runs its whole pipeline (deposit, transforms, force components)
#: in one worker: about this many meshes at once
SINGLE_SLAB_MESHES = 8
#: GPU memory does not spill: besides its meshes a GPU holds the transpose's second copy
#: of the slabs in flight, about this many meshes more (the measured peaks:
#: ``benchmarks/RESULTS.md``, mesh path in slabs)
GPU_TRANSIENT_MESHES = 0.7
#: target bytes of one slab on GPU workers (a GPU transforms big slabs fast; small ones
#: only add transpose pieces)
GPU_SLAB_BYTES = 2 * 2**30


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


def meshes_fit(n: int, dtype, meshes: float, *, gpu: bool) -> bool:
    """Whether ``meshes`` meshes of ``n^3`` ``dtype`` fit in the memory of all the workers
    together (:func:`memory_per_worker` times :func:`worker_count`), plus on GPU workers
    :data:`GPU_TRANSIENT_MESHES` (a GPU cannot spill). True when the memory is unknown.

    The one memory check of the mesh path: :func:`mesh_slabs` refuses a mesh that
    fails it, and :func:`cosmo_dask.gravity.pm.long_range` asks it how many force
    meshes it may hold at once.
    """
    per_worker, _ = memory_per_worker(gpu)
    held = meshes + (GPU_TRANSIENT_MESHES if gpu else 0.0)
    return not per_worker or held * float(n) ** 3 * np.dtype(dtype).itemsize \
        <= per_worker * worker_count()


def mesh_slabs(n: int, dtype, slabs: int | None = None, *, gpu: bool, what: str,
               meshes: int = 1, one_slab_meshes: float = SINGLE_SLAB_MESHES) -> int:
    """The number of slabs of an ``n^3`` mesh of ``dtype``, checked against the memory.

    ``slabs`` (or the dask config key ``cosmo_dask.mesh_slabs``) when given, else
    :func:`~cosmo_dask.spatial.fft.default_slab_count` on CPU workers, and on GPU
    workers one slab when the one-slab pipeline fits a GPU, else one slab per
    :data:`GPU_SLAB_BYTES` (2 GiB) and at least one per worker; then made larger
    where a task would not fit one worker.

    Checks, before any work (:func:`memory_per_worker`, :func:`worker_count`):

    * ``meshes`` meshes of ``n^3`` (``dtype``) fit in the memory of all the
      workers together (the mesh is spread over them; the transpose's and
      interlacing's transient second copies may spill to disk);
    * a slab task, about :data:`TASK_SLABS` slabs, fits one worker, and a
      one-slab mesh's pipeline, about ``one_slab_meshes`` meshes (default
      :data:`SINGLE_SLAB_MESHES`; the caller's own figure where its pipeline holds
      more, e.g. an interlaced PM force on a GPU), too.

    Raises
    ------
    ParameterError
        Naming ``n_mesh`` and what would fit: the largest ``n_mesh`` for these
        workers, or the fewest slabs a given mesh needs.
    """
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    mesh_bytes = float(n) ** 3 * item
    per_worker, where = memory_per_worker(gpu)
    workers = worker_count()
    total = (per_worker or 0) * workers
    held = meshes + (GPU_TRANSIENT_MESHES if gpu else 0.0)  # meshes' worth held at once
    if not meshes_fit(n, dtype, meshes, gpu=gpu):
        largest = smooth_size_below((total / (held * item)) ** (1 / 3))
        holder = ("this machine" if where == "machine" else f"one {where}" if workers == 1
                  else f"{workers} {where}s together")
        raise ParameterError(
            f"{what}: n_mesh={n} needs at least {_gib(held * mesh_bytes)} "
            f"({meshes} {dtype.name} mesh{'es' if meshes > 1 else ''} of {n}^3"
            f"{' and the transpose copies on the GPU' if gpu else ''}), more than "
            f"the {_gib(total)} of {holder}; the largest n_mesh that fits is about "
            f"{largest} (or add workers or memory)")
    configured = slabs is not None or dask.config.get("cosmo_dask.mesh_slabs", None) is not None
    if slabs is not None:
        if isinstance(slabs, bool) or not isinstance(slabs, (int, np.integer)) or slabs < 1:
            raise ParameterError(f"{what}: slabs must be a positive integer or None, "
                                 f"got {slabs!r}")
        count = min(int(slabs), n)
    elif gpu and dask.config.get("cosmo_dask.mesh_slabs", None) is None and per_worker:
        count = 1 if one_slab_meshes * mesh_bytes <= per_worker else \
            min(n, max(workers, math.ceil(mesh_bytes / GPU_SLAB_BYTES)))
    else:
        count = default_slab_count((n, n, n), dtype)
    if not per_worker:
        return count
    if count == 1 and one_slab_meshes * mesh_bytes > per_worker:
        if configured:
            raise ParameterError(
                f"{what}: one slab of a {n}^3 {dtype.name} mesh needs about "
                f"{_gib(one_slab_meshes * mesh_bytes)} in one {where}, which has "
                f"{_gib(per_worker)}; use more slabs")
        count = default_slab_count((n, n, n), dtype, single_slab=False)
    fewest = math.ceil(TASK_SLABS * mesh_bytes / per_worker)
    if count > 1 and count < fewest:
        if fewest > n:
            raise ParameterError(
                f"{what}: n_mesh={n} does not fit: even a slab of one plane "
                f"({_gib(TASK_SLABS * mesh_bytes / n)} per task) exceeds one {where}'s "
                f"{_gib(per_worker)}; the largest n_mesh that fits is about "
                f"{smooth_size_below((per_worker / (TASK_SLABS * item)) ** 0.5)}")
        if configured:
            raise ParameterError(
                f"{what}: {count} slabs of a {n}^3 {dtype.name} mesh need about "
                f"{_gib(TASK_SLABS * mesh_bytes / count)} per task, more than one {where}'s "
                f"{_gib(per_worker)}; use slabs >= {fewest}")
        count = fewest
    return count


# ----------------------------------------------------------------------------- deposit
def _deposit_block(pieces, lo, hi, *, n, box, scheme, shift, mdtype, mass_scalar):
    """``mesh-paint``: the slab ``[lo, hi)`` of the pieces' deposits, a fresh array."""
    try:
        mesh = array_module(pieces[0][0]).zeros((hi - lo, n, n), dtype=mdtype)
        for pos, mass, _ in pieces:
            paint_kernel(pos, mass_scalar if mass is None else mass, n, box, scheme, shift,
                         mdtype, planes=(lo, hi), out=mesh)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    return mesh


def paint_meshes(pos: da.Array, mass, *, n_mesh: int, box_size: float, scheme: str,
                 shifts=(0.0,), dtype, slabs: int | None = None, split_every: int = 8,
                 what: str = "paint", exchange=None, after=(), layout_shifts=None,
                 gpu_pipeline_meshes: float | None = None):
    """Meshes painted with each of ``shifts``, in slabs, and the particles' exchange.

    The one deposit of the mesh path (painting, P(k), PM, TreePM): the particle
    chunks are routed once to the slabs (:class:`~cosmo_dask.spatial.slabs.SlabExchange`,
    reach covering every shift) and each mesh is deposited slab by slab.

    Parameters
    ----------
    pos : dask array (N, 3)
        Checked positions (rows-chunked; NumPy or CuPy chunks).
    mass : dask array (N,) or float
        Masses (chunked like ``pos``) or one mass.
    n_mesh : int
        Cells per side (checked by the caller).
    box_size : float
    scheme : str
        Assignment scheme.
    shifts : tuple of float
        Mesh shifts in cells, one mesh each (``(0, 0.5)``: an interlaced pair).
    layout_shifts : tuple of float, optional
        The shifts the routing must cover (default ``shifts``): all the meshes
        later painted from the same ``exchange``.
    dtype : dtype
        Mesh dtype.
    slabs : int, optional
        Slab count (:func:`mesh_slabs` checks it, or picks it).
    gpu_pipeline_meshes : float, optional
        On GPU workers, the meshes the caller's one-slab pipeline holds at once
        (default :data:`SINGLE_SLAB_MESHES`): a GPU cannot spill, so a mesh whose
        pipeline would not fit one GPU is split into slabs.
    split_every : int
        Fan-in of the sums of a slab's partial deposits (only used when a slab's
        chunks are painted in several groups).
    what : str
        Caller's name for errors.
    exchange : SlabExchange, optional
        Reuse this routing (its layout fixes the slabs and must cover ``shifts``).
    after : sequence of dask arrays
        Computed before any deposit starts (:func:`cosmo_dask.spatial.slabs.after`):
        orders the meshes of a pipeline to bound its memory.

    Returns
    -------
    meshes : list of dask arrays (n, n, n), chunks ``(slab_chunks(n, S), n, n)``
    exchange : SlabExchange
        For interpolating back (:meth:`~cosmo_dask.spatial.slabs.SlabExchange.interpolate`).
    """
    n = int(n_mesh)
    dtype = np.dtype(dtype)
    if exchange is None:
        gpu = array_module(pos) is not np
        # interlaced meshes follow one another on CPU workers (spilling the first if need
        # be); a GPU cannot spill, so there they count together
        one_slab = (gpu_pipeline_meshes if gpu and gpu_pipeline_meshes is not None
                    else SINGLE_SLAB_MESHES)
        count = mesh_slabs(n, dtype, slabs, gpu=gpu, what=what,
                           meshes=len(shifts) if gpu else 1, one_slab_meshes=one_slab)
        layout = slab_layout(n, count, box_size, order=SCHEMES[scheme],
                             shifts=shifts if layout_shifts is None else layout_shifts)
        exchange = SlabExchange(pos, mass, layout, name="mesh")
    count = exchange.layout.n_slabs
    # CPU workers paint a slab's chunks in parallel groups when slabs are fewer than their
    # threads; a GPU paints every chunk of its slab at memory speed, so there a slab is
    # one task (groups would cost a mesh-sized partial sum each: ~70 ms at 1024^3)
    gpu = array_module(exchange.pos) is not np
    groups = 1 if gpu else max(1, math.ceil(worker_threads() / count))
    scalar = 0.0 if isinstance(mass, da.Array) else float(mass)
    meshes = [exchange.deposit(_deposit_block, name="mesh-paint", dtype=dtype, groups=groups,
                               split_every=split_every, after=after, n=n,
                               box=float(box_size), scheme=scheme, shift=float(s),
                               mdtype=dtype, mass_scalar=scalar)
              for s in shifts]
    return meshes, exchange


def centred(mesh: da.Array) -> da.Array:
    """``mesh`` minus its mean (a lazy scalar, summed in float64), in ``mesh``'s dtype.

    Only the ``k = 0`` mode changes, which P(k) and PM discard; the FFT's
    rounding errors scale with the norm of its input, so a float32 transform
    of a nearly uniform mesh (initial conditions: density contrasts of a few
    per cent) is that many times more accurate without the mean.
    """
    return mesh - mesh.mean(dtype=np.float64).astype(mesh.dtype)


# ----------------------------------------------------------------------------- interlacing
def half_cell_phase(kx, ky, kz, cell: float):
    """``exp(i (kx + ky + kz) H / 2)`` on a k-space slab's wavenumbers (``H = cell``):
    the phase that brings a mesh painted with ``shift = 1/2`` back onto the unshifted
    nodes (broadcast shape of the slab, complex128, the wavenumbers' module)."""
    xp = array_module(kx)
    half = 0.5 * cell
    return (xp.exp(1j * half * kx.astype(np.float64)) * xp.exp(1j * half * ky.astype(np.float64))
            * xp.exp(1j * half * kz.astype(np.float64)))


def interlace_kslab(f0, kx, ky, kz, f1, *, cell: float):
    """``(f0 + f1 exp(i (kx + ky + kz) H / 2)) / 2``: one k-space slab of an interlaced
    pair (Hockney & Eastwood; Sefusatti et al. 2016), in ``f0``'s dtype."""
    out = (f0 + f1 * half_cell_phase(kx, ky, kz, cell)) * 0.5
    return out.astype(f0.dtype, copy=False)



def paint(snap_or_pos, mass=None, *, n_mesh, box_size=None, scheme=SCHEME_DEFAULT,
          interlace=False,
          shift=0.0, precision="float64", split_every=None, slabs=None) -> da.Array:
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
        Cells per side, 1 to 4096, prime factors 2, 3, 5 and 7 only
        (:func:`~cosmo_dask.spatial.fft.check_mesh_size`).
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
        aliasing images; costs a second painting pass and three distributed
        FFTs (:mod:`cosmo_dask.spatial.fft`).
        :func:`cosmo_dask.analysis.power_spectrum` does its own interlacing and
        does not need this.
    shift : float
        Shift of the mesh coordinate in cells (``u = x/H - 1/2 + shift``); 0.5
        gives the second mesh of an interlaced pair.
    precision : {"float64", "float32"}
        Dtype of the mesh (weights are computed in float64 on both devices).
    split_every : int, optional
        Fan-in of the sums of a slab's partial deposits, used when a slab's
        chunks are painted in several groups (fewer slabs than worker threads);
        >= 2, default 8.
    slabs : int, optional
        Number of slabs along axis 0 (default:
        :func:`~cosmo_dask.spatial.fft.default_slab_count`, or the dask config
        key ``cosmo_dask.mesh_slabs``); checked against the workers' memory.

    Returns
    -------
    dask.array.Array
        ``(n_mesh, n_mesh, n_mesh)`` in slabs along axis 0 (``chunks =
        (slab_chunks(n_mesh, S), n_mesh, n_mesh)``), mass per cell (sum = total
        mass to rounding: ~1e-15 relative in float64) in the snapshot's mass
        unit. Divide by ``(L/n)^3`` for a density; see :func:`density_contrast`.
        :func:`~cosmo_dask.density.mesh_store.write_mesh` with ``units=snap.units``
        stores it with its units.

    Raises
    ------
    ParameterError
        ``n_mesh`` not a valid mesh side, an unknown scheme, no ``box_size``
        for raw positions or an isolated snapshot, masses not positive and
        finite, wrong shapes, empty input, a mesh that does not fit the
        workers' memory (naming what fits), bad ``slabs``; at compute time,
        non-finite positions.

    Notes
    -----
    Cost: O(N order^3) scattered additions (numba, serial per slab task; or GPU
    atomics), one zeroing of each slab, and the routing of the particles to
    the slabs (a sort per chunk). Memory: one slab per deposit task (see the
    module docstring); no task holds the whole mesh unless it is one slab.
    """
    what = "paint"
    n = check_n_mesh(n_mesh, what)
    scheme = check_scheme(scheme, what)
    dtype = resolve_precision(precision)
    split_every = check_split_every(split_every, what)
    try:
        shift = float(shift)
    except (TypeError, ValueError):
        raise ParameterError(f"{what}: shift must be a number of cells, got {shift!r}") \
            from None
    if not math.isfinite(shift):
        raise ParameterError(f"{what}: shift must be finite, got {shift!r}")
    pos, m, box, _ = particles_input(snap_or_pos, mass, box_size, what=what)
    shifts = (shift, shift + 0.5) if interlace else (shift,)
    meshes, _ = paint_meshes(pos, m, n_mesh=n, box_size=box, scheme=scheme, shifts=shifts,
                             dtype=dtype, slabs=slabs, split_every=split_every, what=what)
    if not interlace:
        return meshes[0]
    k0, k1 = rfftn(meshes[0]), rfftn(meshes[1])
    both = map_kslabs(interlace_kslab, k0, k1, shape=(n, n, n), box_size=box,
                      name="mesh-interlace", kdtype=np.float64, cell=box / n)
    return irfftn(both, (n, n, n))


def density_contrast(mesh):
    """``delta = mesh / mean(mesh) - 1`` (lazy for dask input; same module as ``mesh``)."""
    return mesh / mesh.mean() - 1.0
