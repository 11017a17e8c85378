"""Tetrahedron-cube intersection volumes and tetrahedron deposits on the GPU (CuPy).

Deposit: ``deposit_lattice`` (what :func:`deposit_tets_gpu` runs by default)
---------------------------------------------------------------------------
One warp per tetrahedron; no clipping stack, no per-cell clip. In cell units,
relative to the cell ``floor(bbox min)`` (exact translations), the mass in cell
``(i, j, k)`` is an inclusion-exclusion over the four vertical lattice lines
around the cell column::

    cell(i, j, k) = Phi(i+1, j+1, k) - Phi(i, j+1, k) - Phi(i+1, j, k) + Phi(i, j, k)
    Phi(a, b, k)  = fraction of the tetrahedron in {x < a, y < b, k < z < k+1}

Each lane computes ``Phi`` along one line ``(a, b)``: the tetrahedron (vertices
pre-sorted by x) is cut once by ``x < a`` (0, 1 or 3 pieces: tetrahedron or
prism split), each piece (sorted by y) once by ``y < b``, and every resulting
piece's z-distribution is closed-form: with ``d = c - z`` at its sorted
vertices, its fraction below the plane ``z = c`` is ``d0^3 / prod(d0 - dj)``
(one vertex below), a three-term positive sum (two below) or
``1 - prod`` rewritten as a positive sum (three below), one division each.
Piece volumes are never formed from determinants: every piece carries its
fraction of the parent (products of the same clip parameters), so the deposit
is ``mass * fraction`` and thin z=0 tetrahedra lose nothing to cancellation
(the tetrahedron's own volume is used only to detect degenerate ones, which
go whole to the cell of their vertex centroid, as on the CPU). The ``Phi``
rows live in a per-warp shared-memory buffer of ``CAP`` doubles; bounding
boxes whose lattice does not fit are processed in chunks (lines on a chunk's
lower planes are recomputed). Cells rejected by the CPU's face-plane test or
with a non-positive value (rounding noise of exactly empty cells) are
skipped, the rest go to the grid with one float64 ``atomicAdd`` each. Work
per tetrahedron (128^3 Zel'dovich z=0, 100 Mpc/h, 256^3 grid, counted on the
CPU): 27 lines, 56 y-cuts, 89 pieces, 200 closed-form fractions, 148 cells
scanned, 41 atomics.

Accuracy (float64): exact-rational checks of the worst cells of a 64^3 z=0
deposit give errors of ~1e-17 of the largest cell for this kernel and ~2e-12
for the CPU deposit's per-cell clip (and the older GPU kernels), whose piece
volumes are determinants of thin tetrahedra; so GPU-CPU differences of
~1e-12 of the largest cell are the CPU's. Absolute errors here scale as
eps x (tetrahedron's section in cells^2): ~3e-13 of the largest cell for
tetrahedra ~100 cells across. Mass is conserved to ~4e-16 (whole grid).
``arithmetic="float32"``: the line geometry in float, ``Phi`` sums and the
grid in double, no cell masking (exactly telescoping sums): total mass still
conserved to 4e-16, each cell within ~1e-7 of the largest cell (8e-8 at
box 100, 6e-8 at box 250 against float64; 4e-7 against the CPU clip), empty
cells may receive float32 rounding noise of either sign.

Throughput, the patch deposit and the tuning of ``PQ_SMEM``/``WARPS`` on the GPU:
``benchmarks/RESULTS.md`` (Densities, tetrahedron deposit on the GPU).

Implementation notes (what CuPy's NVRTC made of earlier forms of this kernel):
with ``line_add`` as a ``__noinline__`` function the caller's loop bound was
corrupted across the call (lines beyond the lattice were computed; found with
compute-sanitizer racecheck/memcheck and device printf), and with every
function inlined, lanes that handled more than one line per chunk in one
divergent loop produced wrong cells, although the host emulation of the
same source (one thread, and 32 threads with a barrier per ``__syncwarp``)
was exact. Hence everything is force-inlined, and lanes take lines, cells
and zeroing in warp-uniform rounds with a ``__syncwarp`` after each round of
lines; compute-sanitizer racecheck then reports no hazard. The kernel core
(all of ``cosmo_dask/cuda/tet_volume_lattice.cu`` but the kernel wrapper) is plain
C++ under the macros at the top of that file, so it can be compiled and checked on
a CPU.

``deposit_tets_gpu`` synchronises nothing with the host (a scalar mass is a
kernel argument, the grid origin travels by value): one launch per call,
tetrahedra outside a non-periodic grid cost a load of their 12 coordinates and
a bounding-box test, so patches can be given all candidate tetrahedra.

Tetrahedron-cube volumes (``tet_cube_volume_gpu``)
-------------------------------------------------
Same geometry as :mod:`cosmo_dask.density.tet_volume`'s clip (against the six
cube planes depth first with a 16-slot stack per thread, prism splits, the
same fast paths and operation order; the device functions of
``cosmo_dask/cuda/tet_clip.cuh``), compiled with NVRTC ``--fmad=false`` so
float64 results match the numba kernel to rounding; one thread per
(tetrahedron, cube) pair. float32 input is upcast to float64 unless
``arithmetic="float32"`` (float clip: 28% mass error at z=0, determinant
cancellation; not for production). The per-cell clip deposits built on the
same functions (one thread or one warp per tetrahedron, ~60-90x slower than
the lattice) are kept for comparison in ``benchmarks/density/tet_deposit_clip_gpu.py``.
The lattice deposit sums with atomics, so the order of additions (and the last
bits of each cell) may vary from run to run.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import cuda
from ..core.backend import require_gpu
from ..core.errors import ParameterError
from .tet_volume import _as_cubes, _as_tets, check_grid

# compile-time settings of deposit_lattice: warps per block, doubles of the per-warp
# lattice buffer, clip pieces in shared memory (128 instead of 164 registers), lanes
# 0..11 convert the vertices and share them, FMA contraction, -lineinfo (sanitizers)
LATTICE_DEFAULTS = {"WARPS": 4, "CAP": 1024, "PQ_SMEM": 0, "WARP_SHUFFLE": 1, "FMAD": 1,
                    "LINEINFO": 0}
BLOCKS_PER_SM = 16


@functools.cache
def _pairs_kernel(device_id: int, real: str):
    """The compiled ``tet_cube_pairs`` kernel (``tet_volume.cu``, no fused multiply-adds) for
    one device and arithmetic type ("double" or "float")."""
    import cupy

    with cupy.cuda.Device(device_id):
        module = cuda.module("tet_volume", {"REAL": real}, cuda.NO_FMAD)
        return module.get_function("tet_cube_pairs")


def lattice_defines(real: str = "double", **settings) -> dict:
    """The defines of ``tet_volume_lattice.cu`` (the ``deposit_lattice`` kernel; ``real``:
    "double" or "float"; ``settings`` over :data:`LATTICE_DEFAULTS`)."""
    opts = {**LATTICE_DEFAULTS, **settings}
    return {"REAL": real, "LATTICE_MASK": int(real == "double"),
            **{k: int(v) for k, v in opts.items()}}


@functools.cache
def _lattice_kernel(device_id: int, real: str, settings: tuple = ()):
    import cupy

    opts = {**LATTICE_DEFAULTS, **dict(settings)}
    options = () if opts["FMAD"] else cuda.NO_FMAD
    options += ("-lineinfo",) if opts["LINEINFO"] else ()
    with cupy.cuda.Device(device_id):
        module = cuda.module("tet_volume_lattice", lattice_defines(real, **dict(settings)),
                             options)
        return module.get_function("deposit_lattice")


@functools.cache
def _sm_count(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def _prepare(tets, cp, arithmetic="float64"):
    """Contiguous tets and the kernel type. float32 input is upcast to float64 unless
    ``arithmetic="float32"`` is asked for explicitly (see the module docstring)."""
    t = _as_tets(tets, cp)
    if arithmetic == "float32":
        return cp.ascontiguousarray(t, dtype=cp.float32), "float"
    return cp.ascontiguousarray(t, dtype=cp.float64), "double"


def _blocks(n: int, threads: int, cp) -> int:
    sms = _sm_count(cp.cuda.Device().id)
    return int(max(1, min(-(-n // threads), sms * 32)))


def tet_cube_volume_gpu(tets, cube_lo, cube_size, *, arithmetic="float64"):
    """GPU version of :func:`cosmo_dask.density.tet_cube_volume` (CuPy in, CuPy out).

    One thread per (tetrahedron, cube) pair; float64 arithmetic and result
    (float32 input is upcast). ``arithmetic="float32"``: float kernel and
    float32 result (cube corners and sides rounded to float32), for
    well-shaped tetrahedra only.
    """
    cp = require_gpu("tet_cube_volume on CuPy arrays")
    t, real = _prepare(tets, cp, arithmetic)
    lo, h, single = _as_cubes(cube_lo, cube_size, cp)
    nt, nc = t.shape[0], lo.shape[0]
    out = cp.zeros((nt, nc), dtype=t.dtype)
    if nt and nc:
        k = _pairs_kernel(cp.cuda.Device().id, real)
        threads = 128
        k((_blocks(nt * nc, threads, cp),), (threads,),
          (t, lo, h, np.int64(nt), np.int64(nc), out))
    return out[:, 0] if single else out


def _mass_arg(mass, nt, cp):
    """(device array or None, scalar): a scalar mass travels as a kernel argument."""
    if isinstance(mass, cp.ndarray):
        m = mass.astype(cp.float64, copy=False)
        if m.shape != (nt,):
            m = cp.broadcast_to(m, (nt,))
        return cp.ascontiguousarray(m), 0.0
    a = np.asarray(mass, dtype=np.float64)
    if a.size == 1:
        np.broadcast_to(a, (nt,))  # shape check as on the CPU
        return None, float(a.reshape(-1)[0])
    return cp.asarray(np.ascontiguousarray(np.broadcast_to(a, (nt,)))), 0.0


def _launch_lattice(t, mass, glo, cs, shp, periodic, grid, real, settings=()):
    import cupy as cp

    dev = cp.cuda.Device().id
    kern = _lattice_kernel(dev, real, tuple(sorted(dict(settings).items())))
    warps = {**LATTICE_DEFAULTS, **dict(settings)}["WARPS"]
    nt = t.shape[0]
    m, mconst = _mass_arg(mass, nt, cp)
    blocks = max(1, min(-(-nt // warps), _sm_count(dev) * BLOCKS_PER_SM))
    kern((blocks,), (32 * warps,),
         (t, m if m is not None else np.uint64(0), np.float64(mconst), np.int64(nt),
          np.float64(glo[0]), np.float64(glo[1]), np.float64(glo[2]), np.float64(cs),
          np.int32(shp[0]), np.int32(shp[1]), np.int32(shp[2]), np.int32(bool(periodic)),
          grid))


def deposit_tets_gpu(tets, mass, grid_lo, cell_size, shape, *, periodic=False, out=None,
                     method="auto", arithmetic="float64"):
    """GPU version of :func:`cosmo_dask.density.deposit_tets` (CuPy arrays).

    One kernel launch, no host synchronisation (a scalar ``mass`` is passed by
    value; an array ``mass`` should already be on the GPU), so it can be called
    once per grid patch with all candidate tetrahedra: those whose bounding
    box misses a non-periodic grid cost one load and a comparison.

    Parameters
    ----------
    method : {"auto", "lattice"}
        ``"lattice"`` (what ``"auto"`` runs): one warp per tetrahedron, volumes
        from the clip-fraction lattice described in the module docstring. (The
        older per-cell clip deposits are kept for comparison in
        ``benchmarks/density/tet_deposit_clip_gpu.py``.)
    arithmetic : {"float64", "float32"}
        Kernel arithmetic. In float32: geometry in float, sums and the grid in
        double; total mass conserved to double rounding, each cell to ~1e-7 of
        the largest cell (see the module docstring).

    Returns
    -------
    cupy.ndarray (nx, ny, nz) float64
    """
    cp = require_gpu("deposit_tets on CuPy arrays")
    if method not in ("auto", "lattice"):
        raise ParameterError(f"method must be 'auto' or 'lattice', got {method!r}")
    if arithmetic not in ("float64", "float32"):
        raise ParameterError(f"arithmetic must be 'float64' or 'float32', got {arithmetic!r}")
    t = cp.ascontiguousarray(_as_tets(tets, cp), dtype=cp.float64)
    real = "double" if arithmetic == "float64" else "float"
    nt = t.shape[0]
    glo, cs, shp = check_grid(grid_lo, cell_size, shape)
    grid = cp.zeros(shp, dtype=cp.float64) if out is None else out
    if grid.shape != shp or grid.dtype != np.float64 or not isinstance(grid, cp.ndarray):
        raise ParameterError(f"out must be a float64 CuPy array of shape {shp}")
    if not grid.flags.c_contiguous:
        raise ParameterError("out must be C-contiguous")
    if nt == 0:
        return grid
    _launch_lattice(t, mass, glo, cs, shp, periodic, grid, real)
    return grid
