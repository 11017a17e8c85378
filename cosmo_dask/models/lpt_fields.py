"""LPT initial-condition fields slab by slab, through the distributed FFT (``docs/fft.md``).

The graph code and the block functions (kernels) behind :func:`~cosmo_dask.models.
zeldovich` and :func:`~cosmo_dask.models.lpt_ics`. No task ever holds the whole
mesh: every field lives in *slabs*, real-space slabs along axis 0 (chunks
``(c0, n, n)``) and k-space slabs along axis 1 (chunks ``(n, c1, n // 2 + 1)``),
and moves between the two through :func:`cosmo_dask.spatial.fft.rfftn` /
:func:`~cosmo_dask.spatial.fft.irfftn`; every k-space step is a
:func:`~cosmo_dask.spatial.fft.map_kslabs` call.

Steps (``n = n_side``; ``S`` slabs; task-name kinds in brackets)

1. white noise ``w`` (``<label>-noise``): unit Gaussian deviates, lattice plane
   ``i`` (all ``(j, k)`` of ``x``-index ``i``) drawn from its own stream
   ``default_rng(SeedSequence([seed, i, 5]))`` (:func:`noise_plane`), so any
   slab split gives the same field;
2. ``w_k = rfftn(w)`` (1 forward FFT), then ``delta_k = w_k sqrt(P(k) / V_cell)``
   per k-slab (``<label>-delta``), ``P`` looked up in a table of the mesh's
   ``|k|^2 = m k_f^2``, ``m = 0 .. 3 (n/2)^2`` (``<label>-power``, one small task:
   ``8 (3 (n/2)^2 + 1)`` bytes, 100 MB at n = 4096); fixed amplitudes and pairing
   act mode by mode here; the ``k = 0`` mode and the Nyquist planes are zeroed;
3. ``D1 psi1_a = irfftn(D1 i k_a delta_k / k^2)`` (``<label>-psi1``, 3 inverse FFTs);
4. (2LPT) ``phi1_ab = irfftn(k_a k_b delta_k / k^2)`` (``<label>-hessian``, 6 inverse
   FFTs), the source ``S = sum_{a<b} phi1_aa phi1_bb - phi1_ab^2`` per real slab
   (``<label>-source``), ``S_k = rfftn(S)`` (1 forward FFT) and
   ``D2 psi2_a = irfftn(-D2 i k_a S_k / k^2)`` with ``phi2``'s ``k = 0`` mode and
   Nyquist planes zeroed (``<label>-psi2``, 3 inverse FFTs);
5. particles (``<label>-particles``, one task per real slab): lattice planes
   ``[i0, i1)`` are particles ``[i0 n^2, i1 n^2)`` (``id = (i n + j) n + k``),
   ``x = q + D1 psi1 + D2 psi2`` wrapped into the box, ``v = a H (f1 D1 psi1 +
   f2 D2 psi2)``.

So 1LPT costs 4 mesh FFTs and 2LPT 14, all in float64 (complex128 in k-space).

Memory per task, in units of the float64 real mesh ``R = 8 n^3`` bytes (the
complex128 k-space mesh is ``16 n^2 (n/2 + 1) ~= R``): noise 1/S; FFT steps about
2/S (:mod:`cosmo_dask.spatial.fft`); a k-slab step about 3/S (its slab in and out,
the ``|k|^2`` index and the amplitudes); the 2LPT source 7/S (six slabs in, one
out); a particle task (2LPT) 6/S in plus its (pos, vel) out (3/S in float32, 6/S in
float64) plus one component's temporaries: at most about **13/S of the mesh**.

Devices: every block function takes its module from its block (NumPy or CuPy).
The noise is drawn on the host, plane by plane with NumPy's generator (several
host threads per task when the block goes to the GPU), and copied to the device,
so the white noise is the same on CPU and GPU; the FFTs (pocketfft or cuFFT)
differ at round-off.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, empty_meta
from ..core.checks import check_positive_int
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from ..spatial.fft import (
    MAX_N_MESH,
    default_slab_count,
    fft_sizes_around,
    irfftn,
    is_fft_size,
    map_kslabs,
    prime_factors,
    rfftn,
    slab_chunks,
)
from ..store.validation import wrap_into_box
from .blocks import TAGS, block_rng
from .cosmology import Cosmology

__all__ = ["MAX_N_SIDE", "GPU_SLAB_BYTES", "check_ics_mesh", "ics_slab_count", "noise_plane",
           "noise_slabs", "amplitude_table", "linear_density_kslabs", "displacement_slabs",
           "second_order_displacement", "particle_slabs"]

#: largest ``n_side`` of the IC generators: the mesh path's limit
MAX_N_SIDE = MAX_N_MESH
#: bytes of one complex128 k-space slab for the default slab count on the GPU
GPU_SLAB_BYTES = 256 * 2**20


# --------------------------------------------------------------------------- sizes
def check_ics_mesh(n_side: Any) -> int:
    """``n_side`` of an IC mesh: an integer in ``[1, 4096]`` with no prime factor above 7.

    Raises
    ------
    ParameterError
        Naming ``n_side``, the limit or the offending factorisation and the nearest
        valid sizes.
    """
    n = check_positive_int(n_side, "n_side")
    if n > MAX_N_SIDE:
        raise ParameterError(
            f"n_side must be at most {MAX_N_SIDE} (the IC generators' mesh limit), got {n}")
    if not is_fft_size(n):
        lo, hi = fft_sizes_around(n)
        raise ParameterError(
            f"n_side must have no prime factor above 7 (the mesh FFTs' sizes), got {n} = "
            f"{' x '.join(map(str, prime_factors(n)))}; nearest valid: {lo} or {hi}")
    return n


def ics_slab_count(n_side: int, slabs: int | None = None, device: str = "cpu") -> int:
    """Number of slabs of the IC meshes.

    ``slabs`` given: itself, at most ``n_side``. Default on the CPU: the FFT's
    :func:`~cosmo_dask.spatial.fft.default_slab_count` for a float64 mesh (one slab
    per 64 MiB of k-space mesh, at least one per worker thread); on the GPU one per
    :data:`GPU_SLAB_BYTES` (256 MiB) of k-space mesh only, so the slab count -- and
    with it the cuFFT batch sizes -- does not depend on the cluster.
    """
    n = int(n_side)
    if slabs is not None:
        return min(check_positive_int(slabs, "slabs"), n)
    if device == "gpu":
        kbytes = n * n * (n // 2 + 1) * 16
        return max(1, min(n, math.ceil(kbytes / GPU_SLAB_BYTES)))
    return default_slab_count((n, n, n), np.float64)


# --------------------------------------------------------------------------- white noise
def noise_plane(seed: int, plane: int, n_side: int, out: np.ndarray | None = None) -> np.ndarray:
    """Unit Gaussian white noise of lattice plane ``plane`` (``x``-index), (n, n) float64.

    Drawn from ``default_rng(SeedSequence([seed, plane, 5]))`` (the Zel'dovich stream
    tag): the one definition of the IC white noise, whatever the slab split.
    """
    rng = block_rng(seed, plane, TAGS["zeldovich"])
    if out is None:
        return rng.standard_normal((n_side, n_side))
    return rng.standard_normal(out=out)


def _host_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def _noise_block(seed: int, i0: int, i1: int, n: int, gpu: bool):
    """Noise of planes ``[i0, i1)``: (i1 - i0, n, n) float64, NumPy or (``gpu``) CuPy."""
    out = np.empty((i1 - i0, n, n), dtype=np.float64)

    def fill(p: int) -> None:
        noise_plane(seed, i0 + p, n, out[p])

    if gpu and i1 - i0 > 1:  # the GPU worker's one thread would draw alone: use the host's
        with ThreadPoolExecutor(min(i1 - i0, _host_threads())) as pool:
            list(pool.map(fill, range(i1 - i0)))
    else:  # a CPU task is one thread; dask runs the slabs in parallel
        for p in range(i1 - i0):
            fill(p)
    if gpu:
        import cupy

        return cupy.asarray(out)
    return out


def noise_slabs(n_side: int, seed: int, slabs: int, device: str = "cpu",
                label: str = "lpt") -> da.Array:
    """The white noise as a dask array of ``slabs`` real slabs along axis 0, float64.

    Task names ``<label>-noise-<token>``; NumPy chunks, or CuPy for ``device="gpu"``
    (drawn on the host, see :func:`noise_plane`).
    """
    n = int(n_side)
    chunks0 = slab_chunks(n, slabs)
    name = f"{label}-noise-{tokenize(n, seed, chunks0, device)}"
    gpu = device == "gpu"
    g, start = TaskGraph(), 0
    for i, c in enumerate(chunks0):
        g.add((name, i, 0, 0), _noise_block, seed, start, start + c, n, gpu)
        start += c
    if gpu:
        import cupy

        meta = cupy.empty((0, 0, 0), dtype=np.float64)
    else:
        meta = np.empty((0, 0, 0), dtype=np.float64)
    return g.array(name, (chunks0, (n,), (n,)), meta)


# --------------------------------------------------------------------------- P(k)
def _kept_max(n: int) -> int:
    """Largest |m| per axis of the modes kept (off the Nyquist planes)."""
    return n // 2 - 1 if n % 2 == 0 else (n - 1) // 2


def amplitude_table(n_side: int, box_size: float, cosmology: Cosmology,
                    power: Callable | None = None) -> np.ndarray:
    """``sqrt(P(k) / V_cell)`` at ``|k| = sqrt(m) k_f`` for ``m = 0 .. 3 (n//2)^2``, float64.

    ``P`` at z = 0 in (Mpc/h)^3: the cosmology's EH98 no-wiggle spectrum
    (``power=None``) or ``power(k)`` (k in h/Mpc, a 1-d float64 array), evaluated
    only on ``1 <= m <= 3 m_max^2``, the range of the kept modes (``m_max = n/2 - 1``
    for even, ``(n-1)/2`` for odd ``n``). Entry 0 (``k = 0``) and the entries above
    that range (reached only on the Nyquist planes, which are zeroed) are 0.

    Raises
    ------
    ParameterError
        When ``power`` returns values that are not finite and >= 0 of its input's shape.
    """
    n = int(n_side)
    table = np.zeros(3 * (n // 2) ** 2 + 1, dtype=np.float64)
    top = 3 * _kept_max(n) ** 2
    if top < 1:  # n_side <= 2: no mode is kept
        return table
    k = np.sqrt(np.arange(1, top + 1, dtype=np.float64)) * (2.0 * math.pi / box_size)
    if power is None:
        p = np.asarray(cosmology.power_spectrum(k), dtype=np.float64)
    else:
        p = np.asarray(power(k), dtype=np.float64)
        if p.shape != k.shape or not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ParameterError(
                "power_spectrum: the callable must return finite values >= 0 of the shape "
                f"of its input k (shape {k.shape}), got shape {p.shape}")
    table[1:top + 1] = np.sqrt(p / (box_size / n) ** 3)
    return table


# --------------------------------------------------------------------------- k-slab kernels
def _mode_index(k, kf: float, xp):
    """Integer mode numbers ``m = k / k_f`` of a wavenumber array."""
    return xp.rint(k / kf).astype(xp.int64)


def _zero_nyquist(out, my, n: int) -> None:
    """Zero the Nyquist planes ``|m_a| = n/2`` of a k-slab in place (even ``n`` only)."""
    if n % 2:
        return
    xp = array_module(out)
    out[n // 2, :, :] = 0
    rows = xp.nonzero(xp.abs(my.reshape(-1)) == n // 2)[0]
    if rows.size:
        out[:, rows, :] = 0
    out[:, :, n // 2] = 0


def _density_kslab(block, kx, ky, kz, table, *, n: int, kf: float, fixed: bool, paired: bool):
    """``delta_k`` of one k-slab from the noise's ``w_k``: amplitude from ``table``."""
    xp = array_module(block)
    mx, my, mz = (_mode_index(k, kf, xp) for k in (kx, ky, kz))
    m2 = mx * mx + my * my + mz * mz
    amp = xp.asarray(table)[m2]
    del m2
    if fixed:  # keep each mode's phase, amplitude sqrt(n^3) (the mean |w_k|)
        mag = xp.abs(block)
        mag[mag == 0.0] = 1.0  # a mode of exactly zero amplitude has no phase to keep
        amp *= float(n) ** 1.5
        amp /= mag
        del mag
    out = block * amp
    del amp
    if paired:
        xp.negative(out, out=out)
    _zero_nyquist(out, my, n)
    return out


def _inverse_k2(kx, ky, kz, xp):
    """``1 / k^2`` on the slab (0 at k = 0)."""
    k2 = kx * kx + ky * ky + kz * kz
    k2[k2 == 0] = xp.inf
    return xp.reciprocal(k2, out=k2)


def _gradient_kslab(block, kx, ky, kz, *, axis: int, factor: float, nyquist: int = 0,
                    kf: float = 1.0):
    """``factor i k_axis block / k^2``: the gradient of the inverse Laplacian times
    ``factor``. ``nyquist = n`` also zeroes the Nyquist planes of the mesh of side ``n``
    (fundamental wavenumber ``kf``); 0 where the field has none."""
    xp = array_module(block)
    coef = _inverse_k2(kx, ky, kz, xp)
    coef *= factor * (kx, ky, kz)[axis]
    out = block * coef
    del coef
    out *= 1j
    if nyquist:
        _zero_nyquist(out, _mode_index(ky, kf, xp), nyquist)
    return out


def _hessian_kslab(block, kx, ky, kz, *, a: int, b: int):
    """``k_a k_b block / k^2``: with ``block = delta_k`` the second derivative
    ``phi1_ab`` of ``phi1`` (``lap phi1 = delta``)."""
    xp = array_module(block)
    ks = (kx, ky, kz)
    coef = _inverse_k2(kx, ky, kz, xp)
    coef *= ks[a] * ks[b]
    return block * coef


# --------------------------------------------------------------------------- real-slab kernels
def _source_block(xx, yy, zz, xy, xz, yz):
    """The 2LPT source ``sum_{a<b} phi_aa phi_bb - phi_ab^2`` of one real slab."""
    src = xx * yy
    tmp = xx + yy
    tmp *= zz
    src += tmp
    for off in (xy, xz, yz):
        xp = array_module(off)
        xp.multiply(off, off, out=tmp)
        src -= tmp
    return src


# --------------------------------------------------------------------------- graphs
def linear_density_kslabs(n_side: int, box_size: float, cosmology: Cosmology, seed: int,
                          power: Callable | None = None, *, fixed: bool = False,
                          paired: bool = False, slabs: int | None = None, device: str = "cpu",
                          label: str = "lpt") -> da.Array:
    """The linear overdensity ``delta_k`` at ``D = 1`` in k-space slabs (complex128).

    ``delta_k = rfftn(w) sqrt(P(k) / V_cell)`` of the white noise ``w``
    (:func:`noise_slabs`), NumPy's unnormalised forward transform, so ``<|delta_k|^2>
    = V P / V_cell^2``; ``k = 0`` and the Nyquist planes are zero. ``fixed``: every
    mode's amplitude set to the mean, ``|w_k| -> sqrt(n^3)``, phases kept (Angulo &
    Pontzen 2016); ``paired``: the sign flipped. Returns a dask array
    ``(n, n, n//2 + 1)`` in ``S`` k-slabs along axis 1 (:func:`ics_slab_count`).
    """
    n = int(n_side)
    count = ics_slab_count(n, slabs, device)
    noise = noise_slabs(n, seed, count, device, label)
    wk = rfftn(noise)
    key = tokenize(n, box_size, cosmology.as_dict(), cosmology.T_cmb, power)
    g = TaskGraph()
    g.add(f"{label}-power-{key}", amplitude_table, n, box_size, cosmology, power)
    table = g.delayed(f"{label}-power-{key}")
    kf = 2.0 * math.pi / float(box_size)
    return map_kslabs(_density_kslab, wk, table, shape=(n, n, n), box_size=box_size,
                      name=f"{label}-delta", n=n, kf=kf, fixed=bool(fixed),
                      paired=bool(paired))


def _gradients(field_k: da.Array, n: int, box_size: float, factor: float, nyquist: bool,
               name: str) -> list[da.Array]:
    """The three real-slab components of ``factor grad(inverse Laplacian(field))``
    (``nyquist``: zero the field's Nyquist planes first)."""
    shape = (n, n, n)
    extra = {"nyquist": n, "kf": 2.0 * math.pi / float(box_size)} if nyquist else {}
    return [irfftn(map_kslabs(_gradient_kslab, field_k, shape=shape, box_size=box_size,
                              name=name, axis=a, factor=float(factor), **extra), shape)
            for a in range(3)]


def displacement_slabs(delta_k: da.Array, box_size: float, *, order: int, growth1: float = 1.0,
                       growth2: float = 1.0, label: str = "lpt") -> list[da.Array]:
    """``[D1 psi1_x, D1 psi1_y, D1 psi1_z]`` (+ ``[D2 psi2_*]`` for ``order=2``) in real slabs.

    Parameters
    ----------
    delta_k : dask array (n, n, n//2 + 1), complex
        The linear overdensity at ``D = 1`` in k-space slabs (as
        :func:`linear_density_kslabs` returns it); its ``k = 0`` mode is ignored.
    box_size : float
        Box side (Mpc/h).
    order : {1, 2}
    growth1, growth2 : float
        ``D1`` and ``D2`` (``D2 ~= -3/7 D1^2``).

    Returns
    -------
    list of dask arrays (n, n, n), float64, real slabs along axis 0, in Mpc/h:
    ``psi1 = -grad phi1`` (``lap phi1 = delta``), ``psi2 = +grad phi2`` (``lap phi2 =
    sum_{a<b} phi1_aa phi1_bb - phi1_ab^2``, its ``k = 0`` mode and Nyquist planes
    zeroed), scaled by the growth factors.
    """
    n = int(delta_k.shape[0])
    shape = (n, n, n)
    # psi1_k = i k delta_k / k^2
    comps = _gradients(delta_k, n, box_size, growth1, False, f"{label}-psi1")
    if order == 1:
        return comps
    pairs = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
    hess = [irfftn(map_kslabs(_hessian_kslab, delta_k, shape=shape, box_size=box_size,
                              name=f"{label}-hessian", a=a, b=b), shape) for a, b in pairs]
    src = da.map_blocks(_source_block, *hess, dtype=np.float64,
                        meta=empty_meta(hess[0], 3, np.float64),
                        name=f"{label}-source-{tokenize(*hess)}")
    # phi2_k = -S_k / k^2, psi2_k = i k phi2_k = -i k S_k / k^2 (Nyquist planes zeroed)
    return comps + _gradients(rfftn(src), n, box_size, -growth2, True, f"{label}-psi2")


def second_order_displacement(delta_k, box_size: float, slabs: int | None = None) -> np.ndarray:
    """2LPT displacement ``psi2 = grad phi2`` of a linear field, (n^3, 3) float64 in id order.

    The slab path of :func:`displacement_slabs` on an in-memory field (for tests and
    small meshes: it computes and returns the whole result).

    Parameters
    ----------
    delta_k : complex array (n, n, n//2+1)
        The linear overdensity ``delta_L`` in rfft layout (numpy's unnormalised
        forward transform of the real-space field); its ``k = 0`` mode is ignored.
    box_size : float
        Side of the box in Mpc/h.
    slabs : int, optional
        Slabs of the computation (default :func:`ics_slab_count`).

    Returns
    -------
    ndarray (n^3, 3)
        ``psi2`` in Mpc/h for ``D1 = 1`` (row ``(i*n + j)*n + k`` is mesh site
        ``(i, j, k)``); the second-order displacement at growth ``D1`` is
        ``D2 psi2`` with ``D2 ~= -3/7 D1^2``. ``lap phi2 = sum_{i<j} (phi1_ii
        phi1_jj - phi1_ij^2)``, ``lap phi1 = delta_L``.
    """
    delta_k = np.asarray(delta_k)
    n = delta_k.shape[0]
    if delta_k.shape != (n, n, n // 2 + 1):
        raise ParameterError(f"delta_k must have rfft shape (n, n, n//2+1), got {delta_k.shape}")
    count = ics_slab_count(n, slabs)
    field = da.from_array(delta_k.astype(np.complex128), chunks=(n, slab_chunks(n, count),
                                                                 n // 2 + 1))
    comps = displacement_slabs(field, box_size, order=2)[3:]
    parts = dask.compute(*comps)
    return np.stack([p.reshape(-1) for p in parts], axis=1)


# --------------------------------------------------------------------------- particles
def _particle_block(i0: int, i1: int, *comps, n: int, box_size: float, vel_factor1: float,
                    vel_factor2: float, dtype: np.dtype):
    """(pos, vel) of lattice planes ``[i0, i1)``, rows in id order, from the slabs of
    ``D1 psi1`` (3 components) and, for 2LPT, ``D2 psi2`` (3 more)."""
    xp = array_module(comps[0])
    c = i1 - i0
    cell = box_size / n
    site = (xp.arange(n, dtype=np.float64) + 0.5) * cell
    q = ((xp.arange(i0, i1, dtype=np.float64) + 0.5).reshape(c, 1, 1) * cell,
         site.reshape(1, n, 1), site.reshape(1, 1, n))
    pos = xp.empty((c, n, n, 3), dtype=dtype)
    vel = xp.empty((c, n, n, 3), dtype=dtype)
    second = len(comps) == 6
    for a in range(3):
        s1 = comps[a]
        s = s1 + comps[3 + a] if second else s1.copy()
        s += q[a]
        pos[..., a] = wrap_into_box(s, box_size, dtype)
        xp.multiply(s1, vel_factor1, out=s)
        if second:
            s += vel_factor2 * comps[3 + a]
        vel[..., a] = s
        del s
    return pos.reshape(-1, 3), vel.reshape(-1, 3)


def particle_slabs(label: str, token: str, comps: Sequence[da.Array], *, box_size: float,
                   vel_factor1: float, vel_factor2: float, dtype: np.dtype) -> dict[str, da.Array]:
    """``{"pos", "vel"}``: (N, 3) dask arrays with one chunk per real slab of ``comps``.

    ``comps``: the 3 (1LPT) or 6 (2LPT) displacement slabs of
    :func:`displacement_slabs`, chunked alike; one task ``<label>-particles-<token>``
    per slab returns both arrays' rows (chunk ``i`` holds ``c_i n^2`` particles).
    """
    n = int(comps[0].shape[1])
    name = f"{label}-particles-{token}"
    block = functools.partial(_particle_block, n=n, box_size=float(box_size),
                              vel_factor1=float(vel_factor1), vel_factor2=float(vel_factor2),
                              dtype=np.dtype(dtype))
    g = TaskGraph(comps)
    lengths, start = [], 0
    for i, c in enumerate(comps[0].chunks[0]):
        g.add((name, i), functools.partial(block, start, start + c),
              *[g.chunk(comp, i, 0, 0) for comp in comps])
        lengths.append(c * n * n)
        start += c
    outputs = [(f"{label}-{out}-{token}", k, (3,), empty_meta(comps[0], 2, dtype))
               for k, out in enumerate(("pos", "vel"))]
    pos, vel = g.item_arrays([(name, i) for i in range(len(lengths))], lengths, outputs)
    return {"pos": pos, "vel": vel}
