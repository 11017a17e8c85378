"""Periodic particle-mesh (PM) gravity: CPU kernels (numba + NumPy) on mesh slabs.

The kernels act on one slab of a mesh at a time (the mesh path, ``docs/fft.md``,
:mod:`cosmo_dask.spatial.fft`, :mod:`cosmo_dask.spatial.slabs`): the Green's
function and the gradient on one **k-space slab** given its wavenumbers
(:func:`~cosmo_dask.spatial.fft.map_kslabs`), the interpolation on one **real
slab** of planes ``x_lo .. x_lo + nx - 1``; a one-slab mesh is the whole mesh.
The FFTs are :mod:`cosmo_dask.spatial.fft`'s.

Mesh convention: the one of :mod:`cosmo_dask.density.paint_kernels` (the
deposit is done there, by :func:`cosmo_dask.density.painting.paint_meshes` with
``scheme="cic"``): ``n^3`` cells of side ``H = L / n``, node ``j`` at
``(j + 1/2) H``, mesh coordinate ``u = x / H - 1/2``, CIC weights
``1 - |u - j|`` per axis, indices modulo ``n``. The interpolation here is the
exact transpose of that deposit (same nodes, same weights; it reuses the
deposit's weight function), which makes the PM force conserve momentum and
cancels the self-force (see below).

Solver, on the real-to-complex (``rfftn``) mesh of the mass per cell ``M_g``:

``phi_k = -4 pi G (M_k / H^3) exp(-k^2 rs^2) / (k^2 W(k)^2)``,  ``phi_0 = 0``,

with ``k = 2 pi m / L`` (``m`` the integer frequencies of ``fftfreq``), the
Gaussian long-range split ``exp(-k^2 rs^2)`` (``rs = 0``: none, plain PM) and
the CIC window ``W(k) = prod_a sinc^2(k_a H / 2)``, ``sinc(x) = sin x / x``,
divided out twice (once for the deposit, once for the interpolation, as in
Gadget-2). Zeroing ``k = 0`` is the uniform neutralising background: the
mesh potential has zero mean.

Without a split (``rs = 0``) the window is **not** divided out: ``1 / W^2``
amplifies the aliased small scales up to ``(pi/2)^12 ~ 230`` times at the
corner of the mesh and, not damped by the Gaussian, they ring through the
whole box (measured: a pair 5-11 cells apart, 32^3 mesh, up to 170 % force error
with the deconvolution, 1.9 % without). Plain PM is therefore accurate to a
few per cent only beyond ~5 cells; use a split for accurate forces.

Gradient: **spectral** with a split, ``a_k = -i k phi_k``, each component
brought back by its own ``irfftn`` (three inverse FFTs, plus one for the
potential). The derivative wave number is set to zero on the Nyquist plane of
its axis (the odd derivative of the Nyquist mode has no real representation),
so the gradient operator is real and antisymmetric on the mesh. With the
default split (``rs = 1.2 H``) the potential is band limited
(``exp(-k^2 rs^2) < 1e-6`` at the Nyquist frequency), so the spectral
derivative is exact on it, while the 4-point difference errs by
``(k H)^4 / 30`` (about 3 % of the force at ``k = 1 / rs``).
**Without a split** (``rs = 0``) the potential is not band limited and the
spectral derivative of the sharply truncated ``1/k^2`` rings (Gibbs), worst
along the mesh axes: a pair 8-11 cells apart on a 32^3 mesh, 30 orientations,
erred by up to 210 % spectrally and 1.8 % with the 4-point difference, so
``rs = 0`` uses the **4-point finite difference** (its Fourier multiplier
``(8 sin kH - sin 2kH) / 6H``, zero at the Nyquist frequency) instead.

Because deposit and interpolation use the same CIC weights and the mesh
operator (Green's function times ``-i k``) is antisymmetric, ``sum_i m_i a_i``
vanishes to rounding and a particle exerts no force on itself (Hockney &
Eastwood 1988, section 5-5).

Interlacing (used by default by :func:`cosmo_dask.gravity.pm.pm_accelerations`):
the whole solve is repeated on a second mesh shifted by half a cell along each
axis (``shift = 1/2``: deposit and interpolation both) and the two particle
forces are averaged, which cancels the odd aliasing images. Measured on 2000
random particles, 32^3 mesh, ``rs = 1.2 H``: median error of the long-range
force 6.7e-3 of the total force with one mesh, 1.6e-3 interlaced. (The
Hockney-Eastwood optimal influence function ``U^2 / (sum_n U_n^2)^2`` instead
of ``1 / U^2`` changed it by < 2 % with the split and did not cure the
ringing without it, so the plain deconvolution is kept.)
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..core.backend import array_module
from ..density.paint_kernels import assignment_weights, into_period

__all__ = ["green_factors", "green_axes", "green_derivative", "green_kslab", "green_slab",
           "derivative_factor", "cic_interpolate_nb", "cic_interpolate_numpy", "fd4_gradient"]


def green_factors(k, cell: float, rs: float):
    """Per-axis factors of the Green's function: ``exp(-k^2 rs^2) / sinc(k H / 2)^4``
    (float64, the module of ``k``); all ones without a split (``rs = 0``, no
    deconvolution). ``k`` is one axis's wavenumbers (1 / length), ``H = cell``."""
    xp = array_module(k)
    k = k.astype(np.float64)
    if rs <= 0:
        return xp.ones_like(k)
    q = 0.5 * cell * k
    safe = xp.where(q == 0, 1.0, q)
    s = xp.where(q == 0, 1.0, xp.sin(safe) / safe)
    return xp.exp(-k * k * (rs * rs)) / (s * s * s * s)


@numba.njit(nogil=True, cache=True, parallel=True)
def green_slab(fk, out, k2x, k2y, k2z, gx, gy, gz, scale, axis, d):
    """``out = fk * scale gx gy gz / k^2`` (0 at ``k = 0``) on a k-space slab, per element;
    with ``axis`` 0, 1 or 2 also times ``-i d`` (``d`` the derivative factor along that
    axis, 1-d): one acceleration component's k-space slab in one pass.

    ``k2x, k2y, k2z`` are the squared wavenumbers along the slab's three axes
    and ``gx, gy, gz`` the :func:`green_factors`, all float64 and 1-d; ``out``
    has ``fk``'s shape and dtype (the factor is float64, the product rounded
    to it). ``axis = -1``: no derivative (``d`` unused).
    """
    for i in numba.prange(fk.shape[0]):
        for j in range(fk.shape[1]):
            gij = gx[i] * gy[j]
            k2ij = k2x[i] + k2y[j]
            for lz in range(fk.shape[2]):
                k2 = k2ij + k2z[lz]
                if k2 == 0.0:
                    out[i, j, lz] = 0.0
                    continue
                f = scale * gij * gz[lz] / k2
                v = fk[i, j, lz]
                if axis < 0:
                    out[i, j, lz] = v * f
                else:
                    f *= d[i] if axis == 0 else (d[j] if axis == 1 else d[lz])
                    out[i, j, lz] = complex(v.imag * f, -v.real * f)  # v * (-i f)


def green_axes(kx, ky, kz, cell: float, rs: float):
    """The per-axis pieces of the Green's function of a k-space slab, in ``kx``'s module:
    ``(k2x, k2y, k2z, gx, gy, gz)``, the squared wavenumbers (1 / length^2) and the
    :func:`green_factors` along the slab's three axes, float64 and 1-d (shared by the
    CPU and GPU kernels)."""
    axes = [k.ravel().astype(np.float64) for k in (kx, ky, kz)]
    return tuple(k * k for k in axes) + tuple(green_factors(k, cell, rs) for k in axes)


def green_derivative(kx, ky, kz, cell: float, axis: int | None, kind: str):
    """``(axis code, d)`` of a slab's force component: ``-1`` and a dummy without ``axis``,
    else the axis and its :func:`derivative_factor` (float64, 1-d, ``kx``'s module)."""
    if axis is None:
        return -1, (kx, ky, kz)[0].ravel()[:1].astype(np.float64)
    return int(axis), derivative_factor((kx, ky, kz)[axis].ravel(), cell, kind)


def green_kslab(fk, kx, ky, kz, *, cell: float, rs: float, scale: float,
                axis: int | None = None, kind: str = "fd4"):
    """The potential's k-space slab: ``fk`` times the PM Green's function (a new array);
    with ``axis``, acceleration component ``axis``'s k-space slab instead.

    ``phi_k = scale exp(-k^2 rs^2) / (k^2 W(k)^2) M_k`` with the CIC window
    ``W = prod_a sinc^2(k_a H / 2)`` (divided out only with a split, ``rs > 0``),
    ``phi_0 = 0``; ``scale = -4 pi G / H^3`` turns a mesh of mass per cell into
    the potential. ``axis`` 0, 1 or 2: ``-i D_axis(k) phi_k``, the gradient of
    :func:`gradient_kslab` (``kind`` "spectral" or "fd4") applied in the same pass,
    the two factors multiplied in float64 before they touch ``fk`` (one rounding).
    ``kx, ky, kz``: the slab's wavenumbers (1 / length, float64, from
    :func:`~cosmo_dask.spatial.fft.map_kslabs`); ``cell = H`` and ``rs`` in length units.
    The CPU kernel (numba) of the contract :data:`cosmo_dask.gravity.dispatch.green_kslab`
    (GPU twin: :func:`cosmo_dask.gravity.pm_kernels_gpu.green_kslab_gpu`).
    """
    out = np.empty_like(fk)
    code, d = green_derivative(kx, ky, kz, cell, axis, kind)
    green_slab(fk, out, *green_axes(kx, ky, kz, cell, rs), float(scale), code, d)
    return out


def derivative_factor(k, cell: float, kind: str):
    """The Fourier multiplier of ``d/dx`` along one axis (1 / length, float64).

    ``kind="spectral"``: ``k`` itself, 0 at the Nyquist frequency ``|k| H = pi``
    (even ``n``: the odd derivative of that mode has no real representation).
    ``kind="fd4"``: the multiplier of the 4-point difference
    ``(4/3) D_1 - (1/3) D_2``, ``(8 sin(kH) - sin(2kH)) / (6H)`` (identical to
    differencing the potential mesh in real space). ``H = cell``.
    """
    xp = array_module(k)
    k = k.astype(np.float64)
    if kind == "fd4":
        return (8.0 * xp.sin(k * cell) - xp.sin(2.0 * k * cell)) / (6.0 * cell)
    nyquist = xp.abs(xp.abs(k) * cell - math.pi) < 1e-6
    return xp.where(nyquist, 0.0, k)


def fd4_gradient(phi, lo, hi, *, axis: int, cell: float):
    """Acceleration component ``axis`` of a real potential slab by the 4-point difference.

    ``out = -(8 (phi[+1] - phi[-1]) - (phi[+2] - phi[-2])) / (12 H)`` along ``axis``
    (``H = cell``): in real space the operator whose Fourier multiplier is
    :func:`derivative_factor` ``kind="fd4"``, so one inverse FFT of the potential and
    three of these passes give what three inverse FFTs of ``-i D(k) phi_k`` give, to
    rounding. The differences and the product are taken in float64 and rounded to
    ``phi``'s dtype once; float32 potentials lose about ``|phi| / (H |grad phi|)`` ulps
    to the cancellation (benchmarks/RESULTS.md, PM step).

    ``phi``: planes ``x_lo .. x_lo + nx - 1`` ``(nx, n, n)`` of an ``n^3`` periodic mesh;
    ``lo``, ``hi``: the two planes before (``x_lo - 2``, ``x_lo - 1``) and after it
    ``(2, n, n)`` (periodic; a whole mesh's are its own last and first two). Axes 1 and 2
    wrap inside the slab. Returns a new slab of ``phi``'s shape and dtype. The CPU kernel
    of the contract :data:`cosmo_dask.gravity.dispatch.fd4_gradient` (GPU twin:
    :func:`cosmo_dask.gravity.pm_kernels_gpu.fd4_gradient_gpu`).
    """
    out = np.empty_like(phi)
    _fd4_nb(phi, lo, hi, int(axis), -1.0 / (12.0 * float(cell)), out)
    return out


@numba.njit(nogil=True, cache=True)
def _fd4_nb(phi, lo, hi, axis, coef, out):
    """The loops of :func:`fd4_gradient` (the arithmetic of ``cuda/pm.cu``'s ``fd4``, in
    float64, one rounding to ``out``'s dtype): no temporaries (worker processes return
    freed memory to the system at once, and a plane-by-plane NumPy version paid a page
    fault per temporary)."""
    nx, ny, nz = phi.shape
    for i in range(nx):
        if axis == 0:  # planes i + 1, i - 1, i + 2, i - 2 (before or after the slab: lo, hi)
            p1 = _fd4_plane(phi, lo, hi, i + 1)
            m1 = _fd4_plane(phi, lo, hi, i - 1)
            p2 = _fd4_plane(phi, lo, hi, i + 2)
            m2 = _fd4_plane(phi, lo, hi, i - 2)
            for j in range(ny):
                for k in range(nz):
                    out[i, j, k] = (8.0 * (np.float64(p1[j, k]) - np.float64(m1[j, k]))
                                    - (np.float64(p2[j, k]) - np.float64(m2[j, k]))) * coef
        elif axis == 1:
            for j in range(ny):
                jp1 = (j + 1) % ny
                jm1 = (j - 1 + ny) % ny
                jp2 = (j + 2) % ny
                jm2 = (j - 2 + ny) % ny
                for k in range(nz):
                    out[i, j, k] = (8.0 * (np.float64(phi[i, jp1, k]) - np.float64(phi[i, jm1, k]))
                                    - (np.float64(phi[i, jp2, k])
                                       - np.float64(phi[i, jm2, k]))) * coef
        else:
            for j in range(ny):
                row = phi[i, j]
                for k in range(2, nz - 2):  # the interior without a modulo (vectorised)
                    out[i, j, k] = (8.0 * (np.float64(row[k + 1]) - np.float64(row[k - 1]))
                                    - (np.float64(row[k + 2]) - np.float64(row[k - 2]))) * coef
                for k in (0, 1, nz - 2, nz - 1):
                    if 0 <= k < nz and (k < 2 or k >= nz - 2):
                        out[i, j, k] = (8.0 * (np.float64(row[(k + 1) % nz])
                                               - np.float64(row[(k - 1 + nz) % nz]))
                                        - (np.float64(row[(k + 2) % nz])
                                           - np.float64(row[(k - 2 + nz) % nz]))) * coef


@numba.njit(nogil=True, cache=True)
def _fd4_plane(phi, lo, hi, i):
    """Plane ``i`` of the slab ``phi`` (``lo`` holds planes -2, -1; ``hi`` nx, nx + 1)."""
    nx = phi.shape[0]
    if i < 0:
        return lo[i + 2]
    if i >= nx:
        return hi[i - nx]
    return phi[i]


@numba.njit(nogil=True, cache=True, parallel=True)
def cic_interpolate_nb(pos, meshes, n, box_size, shift, out, x_lo, nx):
    """CIC-interpolate ``c`` mesh slabs: ``out[p, q] = sum_g W(x_p - g) mesh_q[g]``.

    The transpose of the CIC deposit of :func:`cosmo_dask.density.paint_kernels.paint_chunk`
    with the same ``shift`` (mesh coordinate ``u = x / H - 1/2 + shift``), over
    the nodes of the slab's planes ``x_lo .. x_lo + nx - 1`` only (the other
    planes' part of a particle's sum comes from the slabs holding them).

    Parameters
    ----------
    pos : (m, 3) float32/float64
        Positions (any values: the nodes wrap modulo ``n``).
    meshes : tuple of c (nx n^2,) float32/float64 arrays
        Flattened C-order slabs (one dtype).
    n : int
    box_size : float
    shift : float
        In cells (0, or 1/2 for the interlaced mesh).
    out : (m, c) float64
        Filled in place (weights and sums in float64).
    x_lo, nx : int
        The slab's first plane and plane count (the whole mesh: 0, n).
    """
    inv_h = n / box_size
    off = shift - 0.5
    fn = float(n)
    nn = np.int64(n)
    c = len(meshes)
    for p in numba.prange(pos.shape[0]):
        wx = np.empty(4, dtype=np.float64)
        wy = np.empty(4, dtype=np.float64)
        wz = np.empty(4, dtype=np.float64)
        ux = np.float64(pos[p, 0]) * inv_h + off
        uy = np.float64(pos[p, 1]) * inv_h + off
        uz = np.float64(pos[p, 2]) * inv_h + off
        ix = assignment_weights(into_period(ux, fn), 2, wx)
        iy = assignment_weights(into_period(uy, fn), 2, wy)
        iz = assignment_weights(into_period(uz, fn), 2, wz)
        for q in range(c):
            out[p, q] = 0.0
        for a in range(2):
            lx = np.int64(ix + a) % nn - x_lo
            if lx < 0 or lx >= nx:
                continue
            jx = lx * nn
            for b in range(2):
                jxy = (jx + np.int64(iy + b) % nn) * nn
                wab = wx[a] * wy[b]
                for cc in range(2):
                    g = jxy + np.int64(iz + cc) % nn
                    w = wab * wz[cc]
                    for q in range(c):
                        out[p, q] += w * meshes[q][g]


def cic_interpolate_numpy(pos, meshes, box_size: float, shift: float = 0.0,
                          x_lo: int = 0, add_to: np.ndarray | None = None) -> np.ndarray:
    """CIC interpolation at ``pos`` (m, 3) of mesh slabs: (m, c) float64.

    ``meshes`` is a sequence of ``c`` slabs ``(nx, n, n)`` of one dtype (or one
    ``(c, nx, n, n)`` array) holding planes ``x_lo .. x_lo + nx - 1`` of ``n^3``
    meshes (default: whole meshes). With ``add_to`` (an ``(m, c)`` C-contiguous
    float64 array) the values are added to it in place and it is returned: the float64
    sums ``add_to + cic_interpolate_numpy(...)`` (here by a second array and one more
    pass; the GPU kernel adds as it writes).
    The CPU kernel of the contract :data:`cosmo_dask.gravity.dispatch.cic_interpolate`
    (GPU twin: :func:`cosmo_dask.gravity.pm_kernels_gpu.cic_interpolate_gpu`).
    """
    pos = np.ascontiguousarray(pos)
    slabs = tuple(np.ascontiguousarray(m) for m in meshes)
    nx, n = slabs[0].shape[0], slabs[0].shape[1]
    flat = tuple(m.reshape(-1) for m in slabs)
    check_add_to(add_to, pos.shape[0], len(flat))
    out = np.empty((pos.shape[0], len(flat)), dtype=np.float64)
    if pos.shape[0]:
        cic_interpolate_nb(pos, flat, int(n), float(box_size), float(shift), out, int(x_lo),
                           int(nx))
    if add_to is not None:
        add_to += out
        return add_to
    return out


def check_add_to(add_to, m: int, c: int):
    """``add_to`` of :func:`cic_interpolate_numpy` (and its GPU twin) checked: ``None``,
    or a C-contiguous ``(m, c)`` float64 array (raises ``ValueError`` otherwise)."""
    if add_to is None:
        return None
    if add_to.shape != (m, c) or add_to.dtype != np.float64 or not add_to.flags.c_contiguous:
        raise ValueError(f"cic_interpolate: add_to must be a C-contiguous ({m}, {c}) float64 "
                         f"array, got {add_to.shape} {add_to.dtype}")
    return add_to
