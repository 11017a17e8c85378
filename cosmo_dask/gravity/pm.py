"""Periodic particle-mesh (PM) gravity as a Dask graph, on the mesh path (``docs/fft.md``).

Graph (one call, ``C`` particle chunks, ``S`` slabs, one or two meshes):

1. ``gravity-pm-check``: one task per chunk checks that the positions lie in
   ``[0, box_size)`` (raises :class:`~cosmo_dask.core.errors.ParameterError` at
   compute time otherwise).
2. ``mesh-split`` / ``mesh-paint``: the CIC deposit of
   :func:`cosmo_dask.density.painting.paint_meshes`: each chunk is routed once to
   the slabs its particles reach (:mod:`cosmo_dask.spatial.slabs`, covering both
   interlaced shifts) and each slab of each mesh is deposited by one task.
3. the solve, slab by slab, with :mod:`cosmo_dask.spatial.fft`: ``fft-r2c`` /
   transpose / ``fft-c2c`` (:func:`~cosmo_dask.spatial.fft.rfftn`; one 3-d plan,
   ``fft-r2c3``, for a one-slab CuPy mesh), then ``gravity-pm-green`` (Green's
   function with the Gaussian split and CIC deconvolution, in one pass per k-space
   slab) and the inverse transform back to real slabs
   (:func:`~cosmo_dask.spatial.fft.irfftn`): with a split per component, the spectral
   gradient in the Green's pass; without one the potential once, differenced in real
   space by ``gravity-pm-fd4`` (the 4-point difference, one task per slab and
   component, each slab with its neighbours' two nearest planes); kernels through the contracts of
   :mod:`~cosmo_dask.gravity.dispatch` (:mod:`~cosmo_dask.gravity.pm_kernels`, numba, or
   :mod:`~cosmo_dask.gravity.pm_kernels_gpu`, CUDA, by the slab's type).
4. ``gravity-pm-interp-slab``: one task per (mesh, slab, chunk) CIC-interpolates
   the slab's force (and potential) components at the chunk's particles that
   reach it; ``gravity-pm-interp``: one task per chunk adds the slabs' parts,
   averages the interlaced pair and returns the chunk's rows in input order.
   With several slabs the meshes are interpolated in passes (:func:`force_passes`:
   one per interlaced mesh, or per mesh and component), the passes before the last
   named ``gravity-pm-interp-part-*``; the last pass's gathers read their columns.

Memory: no task holds more than about :data:`~cosmo_dask.density.painting.TASK_SLABS`
slabs (``4 / S`` of a mesh) unless the mesh is one slab (the default up to a
256 MiB complex mesh: ``n <= 400`` in float32, 320 in float64), whose pipeline
runs in one worker at a time (about 8 meshes). Over the cluster the density's
k-space mesh, one mesh's ``c`` components and the transposes in flight are alive
at once, about ``c + 2`` meshes, when the workers hold them together; else the
component in flight only, about 3 meshes (Dask spills what does not fit). ``n_mesh`` up to
:data:`MAX_N_MESH` (4096), prime factors 2, 3, 5, 7; the memory is checked
before any work (:func:`cosmo_dask.density.painting.mesh_slabs`).
"""

from __future__ import annotations

import functools
import math

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, host, particle_rows, resolve_precision
from ..core.errors import ParameterError
from ..density.painting import centred, meshes_fit, paint_meshes
from ..density.painting import check_n_mesh as check_mesh_size
from ..spatial.fft import MAX_N_MESH, irfftn, map_kslabs, rfftn
from ..spatial.slabs import after as slab_after
from .dispatch import cic_interpolate, fd4_gradient, green_kslab

__all__ = ["pm_accelerations", "MAX_N_MESH", "check_box_size", "check_n_mesh",
           "fd4_meshes", "force_kmesh", "force_meshes", "force_passes", "potential_mesh",
           "gpu_one_slab_meshes", "inside_box", "long_range", "pm_force_meshes",
           "density_kmesh"]


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
    """``n_mesh`` checked for the mesh path (:func:`cosmo_dask.density.painting.check_n_mesh`:
    a positive integer up to :data:`MAX_N_MESH`, prime factors 2, 3, 5, 7)."""
    return check_mesh_size(n_mesh, what)


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
    lo, hi = (float(v) for v in host(xp.stack((block.min(), block.max()))))  # one sync
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


def _interp_piece(piece, lo, hi, *slabs, box, shifts):
    """``gravity-pm-interp-slab``: the slab's part of the CIC interpolation of ``slabs`` at
    one piece's particles, ``(rows, (m, c) float64)``. ``slabs`` holds ``len(shifts)``
    meshes' ``c`` components in turn, each mesh offset by its shift (cells); with several
    the values are their sum, each mesh's sums added to the earlier ones in order (the
    contract's ``add_to``: no second array)."""
    pos, _, rows = piece
    c = len(slabs) // len(shifts)
    out = None
    for k, shift in enumerate(shifts):
        out = cic_interpolate(pos, slabs[k * c:(k + 1) * c], box, shift, x_lo=lo, add_to=out)
    return rows, out


def _finish(vals, mass=None, *, c, n_meshes, self_coef, mass_scalar, out_dtype, summed=False):
    """``gravity-pm-interp``: the mean over the interlaced meshes, plus the self term
    ``self_coef * m`` on the potential column (4 of 4). ``vals``: the meshes' ``(m, c)``
    values side by side, or (``summed``) already added up, in place (a chunk's own
    array); the same float64 values either way (mesh 0, plus mesh 1, ..., then the
    division)."""
    if summed:
        out = vals
    else:
        out = vals[:, :c].copy()
        for k in range(1, n_meshes):
            out += vals[:, k * c:(k + 1) * c]
    if n_meshes > 1:
        out *= 1.0 / n_meshes
    if self_coef and c == 4:
        m = mass.astype(np.float64) if mass is not None else mass_scalar
        out[:, 3] += self_coef * m
    return out.astype(out_dtype, copy=False)


def _finish_passes(vals, *args, finish, n_before: int):
    """:func:`_finish` of a chunk's columns of every pass: ``args`` starts with the
    chunk's ``(m, k)`` values of the ``n_before`` earlier passes, in order."""
    before = args[:n_before]
    xp = array_module(vals)
    return finish(xp.concatenate([*before, vals], axis=1), *args[n_before:])


def density_kmesh(mass_mesh: da.Array) -> da.Array:
    """The k-space mesh (k-space slabs) of a mass mesh in slabs: ``rfftn`` of the mesh
    less its mean (:func:`cosmo_dask.density.painting.centred`: more accurate in
    float32; the ``k = 0`` mode is dropped anyway)."""
    return rfftn(centred(mass_mesh))


def force_kmesh(fk: da.Array, component: int, *, G: float, box_size: float,
                r_split: float) -> da.Array:
    """The k-space mesh of acceleration ``component`` 0, 1, 2, or of the potential (3), from
    a :func:`density_kmesh`: the Green's function (``scale = -4 pi G / H^3``) and, for an
    acceleration, the gradient (spectral with a split, the 4-point difference without;
    :func:`~cosmo_dask.gravity.pm_kernels.derivative_factor`) in one pass per k-space
    slab, the contract :data:`~cosmo_dask.gravity.dispatch.green_kslab`
    (``gravity-pm-green`` tasks)."""
    n = int(fk.shape[0])
    cell = box_size / n
    return map_kslabs(green_kslab, fk, shape=(n, n, n), box_size=box_size,
                      name="gravity-pm-green", kdtype=np.float64, cell=cell,
                      rs=float(r_split), scale=-4.0 * math.pi * float(G) / cell**3,
                      axis=None if component == 3 else int(component),
                      kind="spectral" if r_split > 0 else "fd4")


def _planes(mesh: da.Array, first: int, count: int) -> da.Array:
    """Planes ``first .. first + count - 1`` (modulo ``n``) of a periodic mesh in slabs."""
    n = int(mesh.shape[0])
    return da.concatenate([mesh[(first + q) % n:(first + q) % n + 1] for q in range(count)])


def _fd4_block(phi, lo, hi, *, axis: int, cell: float):
    return fd4_gradient(phi, lo, hi, axis=axis, cell=cell)


def fd4_meshes(phi: da.Array, axes, *, cell: float) -> list[da.Array]:
    """Acceleration components ``axes`` of a real potential mesh in slabs by the 4-point
    difference in real space (the contract :data:`~cosmo_dask.gravity.dispatch.fd4_gradient`,
    ``gravity-pm-fd4`` tasks, one per slab and component), each slab with the two planes
    before and after it (periodic): the same operator as the k-space multiplier
    ``(8 sin kH - sin 2kH) / 6H``, for one inverse FFT of the potential instead of one per
    component."""
    bounds = np.cumsum((0,) + phi.chunks[0])
    lo = da.concatenate([_planes(phi, int(b) - 2, 2) for b in bounds[:-1]]).rechunk({0: 2})
    hi = da.concatenate([_planes(phi, int(b), 2) for b in bounds[1:]]).rechunk({0: 2})
    token = tokenize(phi, float(cell))
    return [da.blockwise(functools.partial(_fd4_block, axis=int(a), cell=float(cell)), "ijk",
                         phi, "ijk", lo, "ijk", hi, "ijk", align_arrays=False,
                         dtype=phi.dtype, meta=phi._meta,
                         name=f"gravity-pm-fd4-{a}-{token}")
            for a in axes]


def potential_mesh(fk: da.Array, *, G: float, box_size: float, r_split: float) -> da.Array:
    """The real potential mesh of a :func:`density_kmesh` (its slabs and dtype)."""
    n = int(fk.shape[0])
    return irfftn(force_kmesh(fk, 3, G=G, box_size=box_size, r_split=r_split), (n, n, n),
                  overwrite_input=True)  # the potential's k-space mesh: a temporary


def force_meshes(fk: da.Array, comps, *, G: float, box_size: float, r_split: float,
                 phi: da.Array | None = None) -> list[da.Array]:
    """Real meshes of force components ``comps`` (0, 1, 2; 3 the potential) from a
    :func:`density_kmesh`, in its slabs and dtype. With a split (spectral gradient) each
    is :func:`force_kmesh` and its own ``irfftn``; without one (the 4-point difference)
    the potential (``phi``, or :func:`potential_mesh` of ``fk``) is differenced in real
    space (:func:`fd4_meshes`): one inverse FFT per mesh instead of one per component."""
    n = int(fk.shape[0])
    if r_split > 0:
        return [irfftn(force_kmesh(fk, a, G=G, box_size=box_size, r_split=r_split), (n, n, n),
                       overwrite_input=True)  # each component's k-space mesh: a temporary
                for a in comps]
    if phi is None:
        phi = potential_mesh(fk, G=G, box_size=box_size, r_split=r_split)
    acc = iter(fd4_meshes(phi, [a for a in comps if a < 3], cell=box_size / n))
    return [phi if a == 3 else next(acc) for a in comps]


def pm_force_meshes(mass_mesh: da.Array, *, G: float, box_size: float, r_split: float,
                    potential: bool) -> list[da.Array]:
    """Force (and potential) meshes of a mass mesh (mass per cell) in slabs:
    :func:`density_kmesh` and :func:`force_meshes`. Returns ``[a_x, a_y, a_z]`` (+ the
    potential), each ``(n, n, n)`` in ``mass_mesh``'s slabs and dtype (accelerations in
    ``G M / L^2``, the potential in ``G M / L``)."""
    return force_meshes(density_kmesh(mass_mesh), range(4 if potential else 3), G=G,
                        box_size=box_size, r_split=r_split)


#: meshes a one-slab PM force holds on a GPU per (interlaced) mesh, besides its
#: component meshes: the mass mesh, its transform, the potential and cuFFT's work area.
#: With a split (spectral gradients) each component has a k-space and a real mesh: an
#: interlaced 1024^3 float32 force of 3 components peaked at 19 meshes of CuPy pool
#: (benchmarks/RESULTS.md, mesh path in slabs), and 2 (4 + 2 c) = 20. Without one the
#: components are differenced from the real potential (one real mesh each): 2 (4 + c)
#: = 14, above the 8.0 meshes such a force peaked at (benchmarks/RESULTS.md, one GPU)
GPU_ONE_SLAB_BASE_MESHES = 4


def gpu_one_slab_meshes(c: int, *, spectral: bool = True) -> float:
    """Meshes a one-slab PM force of ``c`` components holds per (interlaced) mesh on a
    GPU: :data:`GPU_ONE_SLAB_BASE_MESHES` + ``2 c`` with spectral gradients (a split),
    + ``c`` with the real-space 4-point difference (:func:`fd4_meshes`)."""
    return GPU_ONE_SLAB_BASE_MESHES + (2 * c if spectral else c)


#: meshes a force pass holds besides its component meshes: the density's k-space
#: mesh and the transposes (second copies) of the component meshes in flight
PASS_EXTRA_MESHES = 2


def force_passes(n: int, dtype, c: int, *, n_slabs: int, gpu: bool) -> str:
    """How :func:`long_range` interpolates the ``c`` force (and potential) components of
    its (interlaced) ``n^3`` meshes of ``dtype`` in ``n_slabs`` slabs.

    * ``"all"``: a one-slab mesh (its whole pipeline runs in one worker): one
      interpolation reads every component of every mesh;
    * ``"shift"``: one interpolation per mesh reads its ``c`` components (the second
      mesh painted once the first is interpolated), when ``c +``
      :data:`PASS_EXTRA_MESHES` meshes fit the workers' memory together
      (:func:`cosmo_dask.density.painting.meshes_fit`);
    * ``"component"``: one interpolation per mesh and component (each component's
      mesh made once the previous one is interpolated), holding about 3 meshes.

    Every choice gives the same values bit for bit (each column's sums are the same,
    in the same slab order); fewer passes mean fewer tasks (an interpolation pass at
    2048^3 in 129 slabs is about 9,900 tasks). Several meshes in one pass are not
    offered: at 2048^3 a task gathering the values of both meshes (the way back of
    two-stage exchanges) would read about 2 GiB.
    """
    if n_slabs == 1:
        return "all"
    if meshes_fit(n, dtype, c + PASS_EXTRA_MESHES, gpu=gpu):
        return "shift"
    return "component"


def long_range(pos: da.Array, mass, *, G: float, box_size: float, n_mesh: int, r_split: float,
               dtype, potential: bool, interlace: bool, slabs: int | None = None,
               what: str = "pm_accelerations") -> da.Array:
    """(N, 3 or 4) PM accelerations (and potentials) of checked positions, chunked like ``pos``.

    The graph of the module docstring; ``slabs`` as in
    :func:`cosmo_dask.density.painting.paint_meshes` (default: chosen and checked
    against the workers' memory). A mesh in several slabs is interpolated in
    passes (:func:`force_passes`): one per interlaced mesh, reading all its
    components, when the workers hold ``c +`` :data:`PASS_EXTRA_MESHES` meshes
    together; else one per mesh and force component (each component's mesh made
    once the previous one has been interpolated), so that the cluster holds the
    density's k-space mesh and one component at a time. The second interlaced
    mesh is painted once the first is interpolated
    (:func:`cosmo_dask.spatial.slabs.after`). The last pass's gathers finish the
    chunks. A one-slab mesh interpolates all its components in one task per chunk.
    The values are the same bit for bit in every case.
    """
    shifts = (0.0, 0.5) if interlace else (0.0,)
    c = 4 if potential else 3
    n = int(n_mesh)
    self_coef = G / (math.sqrt(math.pi) * r_split) if (potential and r_split > 0) else 0.0
    mass_array = isinstance(mass, da.Array)
    finish = functools.partial(_finish, c=c, n_meshes=len(shifts), self_coef=float(self_coef),
                               mass_scalar=0.0 if mass_array else float(mass),
                               out_dtype=np.dtype(dtype))
    finish_args = [mass] if mass_array else []
    meshes, exchange = paint_meshes(pos, mass, n_mesh=n_mesh, box_size=box_size, scheme="cic",
                                    shifts=shifts[:1], layout_shifts=shifts, dtype=dtype,
                                    slabs=slabs, what=what,
                                    gpu_pipeline_meshes=len(shifts) * gpu_one_slab_meshes(
                                        c, spectral=r_split > 0))
    passes = force_passes(n, dtype, c, n_slabs=exchange.layout.n_slabs,
                          gpu=array_module(pos) is not np)
    if passes == "all":  # the one-slab path: one task per chunk reads every mesh
        if interlace:
            meshes += paint_meshes(pos, mass, n_mesh=n_mesh, box_size=box_size, scheme="cic",
                                   shifts=shifts[1:], dtype=dtype, exchange=exchange)[0]
        # one group: every mesh's components, their values added up as they are made
        forces = [f for mesh in meshes
                  for f in pm_force_meshes(mesh, G=G, box_size=box_size, r_split=r_split,
                                           potential=potential)]
        group = [(functools.partial(_interp_piece, box=float(box_size), shifts=shifts),
                  forces, len(forces))]
        return exchange.interpolate(group, name="gravity-pm-interp", dtype=dtype,
                                    finish=functools.partial(finish, summed=True),
                                    finish_args=finish_args)
    # one pass per mesh ("shift") or per mesh and component ("component"), in order
    plan = [(shift, comps) for shift in shifts
            for comps in ([tuple(range(c))] if passes == "shift" else [(a,) for a in range(c)])]
    columns: list[da.Array] = []  # (N, len(comps)) float64 of each pass but the last
    for i, (shift, comps) in enumerate(plan):
        if comps[0] == 0:  # a new mesh: the second is painted once the first is interpolated
            if columns:
                meshes = paint_meshes(pos, mass, n_mesh=n, box_size=box_size, scheme="cic",
                                      shifts=(shift,), dtype=dtype, exchange=exchange,
                                      after=columns[-1:])[0]
            fk = density_kmesh(meshes[0])
            # without a split the components are differences of one potential mesh
            phi = None if r_split > 0 else potential_mesh(fk, G=G, box_size=box_size,
                                                          r_split=r_split)
        # per component: each once the previous one is interpolated (the gate sits on the
        # density's k-space mesh, or the potential mesh, so that the Green's function and
        # the first inverse FFT, or the difference, stay one task)
        gate = columns and passes == "component"
        forces = force_meshes(slab_after(fk, columns[-1]) if gate else fk, comps, G=G,
                              box_size=box_size, r_split=r_split,
                              phi=slab_after(phi, columns[-1]) if gate and phi is not None
                              else phi)
        group = [(functools.partial(_interp_piece, box=float(box_size), shifts=(shift,)),
                  forces, len(comps))]
        if i < len(plan) - 1:
            columns.append(exchange.interpolate(group, name="gravity-pm-interp-part",
                                                dtype=np.float64))
            continue
        # the last pass's gathers finish every chunk: its columns after the earlier passes'
        return exchange.interpolate(
            group, name="gravity-pm-interp", dtype=dtype,
            finish=functools.partial(_finish_passes, finish=finish, n_before=len(columns)),
            finish_args=[*columns, *finish_args])


def pm_accelerations(pos, mass, *, G: float, box_size: float, n_mesh: int, r_split: float = 0.0,
                     precision: str = "float64", potential: bool = True,
                     interlace: bool = True, slabs: int | None = None):
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
        Mesh cells per side, 1..:data:`MAX_N_MESH` (4096), prime factors 2, 3,
        5, 7 only.
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
    slabs : int, optional
        Slabs of the mesh path (default:
        :func:`~cosmo_dask.spatial.fft.default_slab_count` or the dask config key
        ``cosmo_dask.mesh_slabs``; checked against the workers' memory).

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
        ``box_size`` missing or not positive, ``n_mesh`` not a valid mesh side
        (above 4096, or a prime factor above 7), negative ``r_split``, ``G`` not
        positive, bad precision, shapes or ``slabs``, a mesh that does not fit
        the workers' memory (naming what fits); at compute time, a position
        outside ``[0, box_size)``.

    Notes
    -----
    Accuracy (measured in ``tests/gravity/test_pm.py`` against the Ewald long-range
    sum): see the test docstrings. The mesh force conserves momentum
    (``sum m a = 0`` to rounding) and has no self-force. Cost: O(N) deposit
    and interpolation, O(n^3 log n) for the 4-5 FFTs per mesh, slab by slab.
    """
    what = "pm_accelerations"
    box = check_box_size(box_size, what)
    n = check_n_mesh(n_mesh, what)
    rs = _check_number(r_split, "r_split", what, allow_zero=True)
    G = _check_number(G, "G", what, allow_zero=False)
    dtype = resolve_precision(precision)
    pos, m, _ = checked_particles(pos, mass, box, what)
    vals = long_range(pos, m, G=G, box_size=box, n_mesh=n, r_split=rs, dtype=dtype,
                      potential=bool(potential), interlace=bool(interlace), slabs=slabs,
                      what=what)
    acc = vals[:, :3]
    pot = vals[:, 3] if potential else None
    return acc, pot
