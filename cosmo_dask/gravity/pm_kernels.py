"""Periodic particle-mesh (PM) gravity: CPU kernels (numba + NumPy/SciPy FFT).

Mesh convention: the one of :mod:`cosmo_dask.density.paint_kernels` (the
deposit is done there, by :func:`cosmo_dask.density.paint.partial_meshes` with
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
import scipy.fft

from ..density.paint_kernels import assignment_weights, into_period

__all__ = ["green_multiply", "derivative_wavenumbers", "long_range_meshes",
           "long_range_meshes_numpy", "cic_interpolate", "cic_interpolate_numpy",
           "mesh_bytes"]


@numba.njit(nogil=True, cache=True, parallel=True)
def green_multiply(fk, n, box_size, rs, scale):
    """Multiply the rfft mesh ``fk`` (n, n, n//2 + 1) in place by the PM Green's function.

    ``fk[i, j, l] *= scale * exp(-k^2 rs^2) / (k^2 W(k)^2)`` and ``fk[0, 0, 0] = 0``,
    with ``k^2 = (2 pi / L)^2 (i'^2 + j'^2 + l^2)`` (``i'`` the signed frequency)
    and ``W = prod sinc^2(pi m / n)``. ``scale = -4 pi G / H^3`` turns a mesh of
    mass per cell into the potential.
    """
    nz = n // 2 + 1
    kf = 2.0 * math.pi / box_size
    rs2 = rs * rs
    for i in numba.prange(n):
        mi = i if i <= n // 2 else i - n
        qx = math.pi * mi / n
        sx = 1.0 if mi == 0 else math.sin(qx) / qx
        for j in range(n):
            mj = j if j <= n // 2 else j - n
            qy = math.pi * mj / n
            sy = 1.0 if mj == 0 else math.sin(qy) / qy
            for lz in range(nz):
                if i == 0 and j == 0 and lz == 0:
                    fk[0, 0, 0] = 0.0
                    continue
                qz = math.pi * lz / n
                sz = 1.0 if lz == 0 else math.sin(qz) / qz
                k2 = kf * kf * (mi * mi + mj * mj + lz * lz)
                if rs > 0.0:
                    w = sx * sy * sz
                    w2 = w * w * w * w  # W(k)^2 = (prod sinc^2)^2
                    fk[i, j, lz] *= scale * math.exp(-k2 * rs2) / (k2 * w2)
                else:
                    fk[i, j, lz] *= scale / k2


def derivative_wavenumbers(n: int, box_size: float, kind: str = "spectral"):
    """``k_a`` of the derivative along x, y (full axes) and z (rfft axis), 1/length.

    ``kind="spectral"``: ``k`` itself, with the Nyquist frequency ``m = -n/2``
    (even ``n``) set to 0. ``kind="fd4"``: the Fourier multiplier of the
    4-point difference ``(4/3) D_1 - (1/3) D_2``, ``(8 sin(kH) - sin(2kH)) / (6H)``
    (identical to differencing the potential mesh in real space). Broadcastable
    to (n, n, n//2 + 1).
    """
    kf = 2.0 * math.pi / box_size
    full = np.fft.fftfreq(n, d=1.0 / n) * kf
    half = np.fft.rfftfreq(n, d=1.0 / n) * kf
    if kind == "fd4":
        h = box_size / n
        full = (8.0 * np.sin(full * h) - np.sin(2.0 * full * h)) / (6.0 * h)
        half = (8.0 * np.sin(half * h) - np.sin(2.0 * half * h)) / (6.0 * h)
    elif n % 2 == 0:
        full[n // 2] = 0.0
        half[-1] = 0.0
    return full[:, None, None], full[None, :, None], half[None, None, :]


def mesh_bytes(n_mesh: int, itemsize: int, potential: bool) -> int:
    """Peak bytes of :func:`long_range_meshes` on one worker (input mesh included).

    Mass mesh ``n^3`` + the potential spectrum ``n^2 (n/2+1)`` complex + one
    component spectrum in flight + the ``3`` or ``4`` output meshes:
    about ``(6 or 7) n^3 itemsize`` (float64: 7.5 GB at 512^3, 60 GB at 1024^3).
    """
    n3 = n_mesh**3
    spec = n_mesh * n_mesh * (n_mesh // 2 + 1) * 2 * itemsize
    return n3 * itemsize + 2 * spec + (4 if potential else 3) * n3 * itemsize


def long_range_meshes(xp, rfftn, irfftn, green, mass_mesh, box_size: float, rs: float, G: float,
                      potential: bool):
    """Force (and potential) meshes from a mass mesh; module-generic core.

    Parameters
    ----------
    xp : module
        numpy or cupy.
    rfftn, irfftn : callables
        Forward/inverse real FFTs over all three axes of that module.
    green : callable
        ``green(fk, n, box_size, rs, scale)`` multiplying in place (this
        module's :func:`green_multiply` or the CuPy kernel).
    mass_mesh : (n, n, n) array
        Mass per cell (float32 or float64; the FFTs run in that precision).
    box_size, rs, G : float
        Box side and split scale (length units), gravitational constant.
    potential : bool
        Also return the potential mesh.

    Returns
    -------
    (3 or 4, n, n, n) array of the mesh dtype
        ``a_x, a_y, a_z`` (acceleration units, ``G M / L^2``) and, if asked,
        the potential (``G M / L``), at the mesh nodes.
    """
    n = mass_mesh.shape[0]
    dtype = mass_mesh.dtype
    h = box_size / n
    fk = rfftn(mass_mesh)
    green(fk, n, float(box_size), float(rs), -4.0 * math.pi * float(G) / h**3)
    out = xp.empty((4 if potential else 3, n, n, n), dtype=dtype)
    kd = derivative_wavenumbers(n, box_size, "spectral" if rs > 0 else "fd4")
    for a in range(3):
        ka = xp.asarray(kd[a].astype(dtype))
        out[a] = irfftn(fk * (-1j * ka), s=(n, n, n))
    if potential:
        out[3] = irfftn(fk, s=(n, n, n))
    return out


def _rfftn(x):
    return scipy.fft.rfftn(x, workers=-1)


def _irfftn(x, s):
    return scipy.fft.irfftn(x, s=s, workers=-1)


def long_range_meshes_numpy(mass_mesh: np.ndarray, box_size: float, rs: float, G: float,
                            potential: bool = True) -> np.ndarray:
    """:func:`long_range_meshes` on the CPU (SciPy pocketfft, all cores; numba Green)."""
    return long_range_meshes(np, _rfftn, _irfftn, green_multiply, np.asarray(mass_mesh),
                             box_size, rs, G, potential)


@numba.njit(nogil=True, cache=True, parallel=True)
def cic_interpolate(pos, meshes, n, box_size, shift, out):
    """CIC-interpolate ``c`` meshes at the particles: ``out[p, q] = sum_g W(x_p - g) mesh_q[g]``.

    The transpose of the CIC deposit of :func:`cosmo_dask.density.paint_kernels.paint_chunk`
    with the same ``shift`` (mesh coordinate ``u = x / H - 1/2 + shift``).

    Parameters
    ----------
    pos : (m, 3) float32/float64
        Positions (any values: the nodes wrap modulo ``n``).
    meshes : (c, n^3) float32/float64
        Flattened C-order meshes.
    n : int
    box_size : float
    shift : float
        In cells (0, or 1/2 for the interlaced mesh).
    out : (m, c) float64
        Filled in place (weights and sums in float64).
    """
    inv_h = n / box_size
    off = shift - 0.5
    fn = float(n)
    nn = np.int64(n)
    c = meshes.shape[0]
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
            jx = (np.int64(ix + a) % nn) * nn
            for b in range(2):
                jxy = (jx + np.int64(iy + b) % nn) * nn
                wab = wx[a] * wy[b]
                for cc in range(2):
                    g = jxy + np.int64(iz + cc) % nn
                    w = wab * wz[cc]
                    for q in range(c):
                        out[p, q] += w * meshes[q, g]


def cic_interpolate_numpy(pos, meshes, box_size: float, shift: float = 0.0) -> np.ndarray:
    """CIC interpolation of ``meshes`` (c, n, n, n) at ``pos`` (m, 3): (m, c) float64."""
    pos = np.ascontiguousarray(pos)
    c, n = meshes.shape[0], meshes.shape[1]
    flat = np.ascontiguousarray(meshes).reshape(c, n * n * n)
    out = np.empty((pos.shape[0], c), dtype=np.float64)
    if pos.shape[0]:
        cic_interpolate(pos, flat, int(n), float(box_size), float(shift), out)
    return out
