"""Zel'dovich-approximation initial conditions for a periodic LambdaCDM box."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.fft
from dask.base import tokenize

from ..backend import resolve_precision
from ..checks import check_positive, check_positive_int, check_seed
from ..errors import ParameterError
from ..units import gravitational_constant
from ..validation import wrap_into_box
from ._blocks import (
    GEN_BLOCK,
    TAGS,
    block_rng,
    from_mesh,
)
from .cosmology import Cosmology
from .lattice import lattice_sites

ZELDOVICH_UNITS = {"length": "Mpc/h", "velocity": "km/s (peculiar)", "mass": "1e10 Msun/h"}
#: G in (Mpc/h) (km/s)^2 / (1e10 Msun/h), from the unit system (astropy's CODATA G):
#: 43.00917
G_COSMO = gravitational_constant(ZELDOVICH_UNITS)
#: critical density today, 3 H0^2 / (8 pi G), in 1e10 Msun/h per (Mpc/h)^3 (H0 = 100 h
#: km/s/Mpc): 27.75366
RHO_CRIT_1E10 = 3 * 100.0**2 / (8 * math.pi * G_COSMO)


def check_redshift(redshift: Any) -> float:
    """A finite redshift > -1, as a float (else :class:`ParameterError`)."""
    ok = isinstance(redshift, (int, float, np.integer, np.floating)) and not isinstance(
        redshift, bool)
    if not ok or not math.isfinite(float(redshift)) or float(redshift) <= -1:
        raise ParameterError(f"redshift must be a finite number > -1, got {redshift!r}")
    return float(redshift)


def white_noise(n_side: int, seed: int) -> np.ndarray:
    """Unit-variance Gaussian white noise on the mesh, shape (n_side,)*3, float64.

    Value of site ``(i, j, k)`` is element ``id = (i*n_side + j)*n_side + k`` of a
    sequence drawn in generation blocks of ``GEN_BLOCK`` ids (as for particles).
    """
    n = n_side**3
    noise = np.empty(n, dtype=np.float64)
    for b in range((n + GEN_BLOCK - 1) // GEN_BLOCK):
        b0 = b * GEN_BLOCK
        size = min(GEN_BLOCK, n - b0)
        noise[b0:b0 + size] = block_rng(seed, b, TAGS["zeldovich"]).standard_normal(size)
    return noise.reshape(n_side, n_side, n_side)


def mesh_wavenumbers(n_side: int, box_size: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """kx, ky (full) and kz (half, rfft) wavenumbers of the mesh in h/Mpc, broadcastable."""
    kf = 2.0 * np.pi / box_size
    k_full = np.fft.fftfreq(n_side, d=1.0 / n_side) * kf
    k_half = np.fft.rfftfreq(n_side, d=1.0 / n_side) * kf
    return k_full[:, None, None], k_full[None, :, None], k_half[None, None, :]


def mode_power(k2: np.ndarray, cosmology: Cosmology, power=None) -> np.ndarray:
    """``P(k)`` at ``z = 0`` in (Mpc/h)^3 on the rfft mesh of squared wavenumbers ``k2``.

    ``power=None``: ``cosmology.power_spectrum`` on every entry (as the Zel'dovich
    generator always did). A callable ``power(k)`` (k in h/Mpc, a 1-d float64 array)
    is evaluated only on the modes that are kept, ``0 < |k|`` off the Nyquist planes
    (so a tabulated spectrum need not cover ``k = 0``, its dummy entry or the Nyquist
    modes); the other entries are 0. A callable must return finite values >= 0 of the
    shape of its input, else :class:`ParameterError`.
    """
    if power is None:
        return cosmology.power_spectrum(np.sqrt(k2))
    n = k2.shape[0]
    keep = np.ones(k2.shape, dtype=bool)
    keep[0, 0, 0] = False
    if n % 2 == 0:
        keep[n // 2, :, :] = False
        keep[:, n // 2, :] = False
        keep[:, :, n // 2] = False
    k = np.sqrt(k2[keep])
    if k.size == 0:  # n_side <= 2: no mode is kept
        return np.zeros(k2.shape, dtype=np.float64)
    p = np.asarray(power(k), dtype=np.float64)
    if p.shape != k.shape or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ParameterError(
            "power_spectrum: the callable must return finite values >= 0 of the shape of "
            f"its input k (shape {k.shape}), got shape {p.shape}")
    out = np.zeros(k2.shape, dtype=np.float64)
    out[keep] = p
    return out


def linear_density_k(n_side: int, box_size: float, cosmology: Cosmology, growth: float,
                     seed: int, power=None, *, fixed: bool = False,
                     paired: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Linear overdensity at growth ``D`` in Fourier space, and the mesh's ``|k|^2``.

    White noise ``w`` -> ``delta_k = FFT(w) sqrt(P(k) / V_cell) D`` (numpy's
    unnormalised forward rfft, so ``<|delta_k|^2> = V P(k) D^2 / V_cell^2``), with
    the ``k = 0`` mode and the Nyquist planes set to zero. ``P`` from
    :func:`mode_power` (``power=None``: the cosmology's EH98 no-wiggle spectrum).
    Returns ``(delta_k, k2)``: complex128 ``(n, n, n//2+1)`` and float64 of the same
    shape with ``k2[0, 0, 0] = 1`` (a placeholder: divide by it safely).

    ``fixed=True`` keeps each mode's phase and sets its amplitude to the mean,
    ``|FFT(w)| -> sqrt(n^3)`` (so ``|delta_k|^2`` is exactly ``V P D^2 / V_cell^2``:
    "fixed" fields, Angulo & Pontzen 2016); ``paired=True`` flips the sign of the
    field (the phases shifted by pi: the pair of a paired-and-fixed set). Both
    default to False (the Gaussian field, unchanged).
    """
    n = n_side
    delta_k = scipy.fft.rfftn(white_noise(n, seed))
    if fixed:
        amp = np.abs(delta_k)
        amp[amp == 0.0] = 1.0  # a mode of exactly zero amplitude has no phase to keep
        delta_k *= math.sqrt(float(n) ** 3) / amp
        del amp
    if paired:
        np.negative(delta_k, out=delta_k)
    kx, ky, kz = mesh_wavenumbers(n, box_size)
    k2 = kx * kx + ky * ky + kz * kz
    k2[0, 0, 0] = 1.0  # the k = 0 mode is zeroed below
    v_cell = (box_size / n) ** 3
    delta_k *= np.sqrt(mode_power(k2, cosmology, power) / v_cell) * growth
    delta_k[0, 0, 0] = 0.0
    if n % 2 == 0:
        delta_k[n // 2, :, :] = 0.0
        delta_k[:, n // 2, :] = 0.0
        delta_k[:, :, n // 2] = 0.0
    return delta_k, k2


def displacement_mesh(n_side: int, box_size: float, cosmology: Cosmology, growth: float,
                      seed: int, dtype: np.dtype, power=None, *, fixed: bool = False,
                      paired: bool = False) -> np.ndarray:
    """Zel'dovich displacement at growth ``D``: (n_side^3, 3) array in id order, Mpc/h.

    ``delta_k`` from :func:`linear_density_k` (``power``: None for the cosmology's
    spectrum, or a callable ``P(k)`` at z = 0); ``psi_k = i k delta_k / k^2`` (so
    that ``delta = -div psi``), transformed back one component at a time. Returns
    ``3 n_side^3 * dtype.itemsize`` bytes; peak memory of the call is about
    ``50 n_side^3`` bytes (measured, float32 or float64). ``fixed``, ``paired``: see
    :func:`linear_density_k`.
    """
    n = n_side
    delta_k, k2 = linear_density_k(n, box_size, cosmology, growth, seed, power, fixed=fixed,
                                   paired=paired)
    delta_k /= k2
    del k2
    kx, ky, kz = mesh_wavenumbers(n, box_size)
    out = np.empty((n**3, 3), dtype=dtype)
    for axis, k_axis in enumerate((kx, ky, kz)):
        psi = scipy.fft.irfftn(delta_k * (1j * k_axis), s=(n, n, n))
        out[:, axis] = psi.reshape(-1)
        del psi
    return out


def _zeldovich_chunk(mesh: np.ndarray, start: int, stop: int, *, n_side: int, box_size: float,
                     vel_factor: float, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    psi = mesh[start:stop].astype(np.float64)
    q = lattice_sites(start, stop - start, n_side, box_size / n_side)
    pos = wrap_into_box(q + psi, box_size, dtype)
    vel = (vel_factor * psi).astype(dtype)
    return pos, vel


def zeldovich(n_side: int, *, box_size: float, redshift: float,
              cosmology: Cosmology | Mapping[str, Any] | None = None, seed: int = 0,
              precision=None, chunks: int | None = None):
    """Zel'dovich-approximation initial conditions in a periodic flat LambdaCDM box.

    A Gaussian random field with the linear power spectrum (Eisenstein & Hu 1998
    no-wiggle transfer function, normalised to ``sigma8``) is realised on the
    ``n_side^3`` Lagrangian mesh; the displacement ``psi`` (``delta = -div psi``),
    scaled by the growth factor ``D(a)`` (``D(1) = 1``), moves each particle from
    its lattice site ``q = ((i, j, k) + 0.5) * box_size / n_side`` (cell centres,
    as in :func:`perturbed_lattice`): ``x = q + psi`` wrapped into ``[0, box_size)``,
    and gives the peculiar velocity ``v = a H(a) f(a) psi`` (km/s), with
    ``f = dln D/dln a``. The ``k = 0`` mode and the Nyquist planes are zero.

    Memory: the displacement mesh is built whole inside one dask task
    (``zeldovich-mesh-<token>``) and holds ``3 * n_side^3 * itemsize`` bytes (24
    n_side^3 bytes in float64, 12 n_side^3 in float32: 3.2 GB / 1.6 GB for
    n_side = 512); building it needs about ``50 n_side^3`` bytes at peak on that
    worker (6.7 GB for n_side = 512). Particle chunks slice it (x-major order = id order)
    and are otherwise built chunk by chunk.

    Parameters
    ----------
    n_side : int
        Particles per side, >= 1 (N = n_side^3).
    box_size : float
        Side of the periodic box in Mpc/h, > 0.
    redshift : float
        Redshift of the output, > -1 (``scale_factor = 1 / (1 + z)``).
    cosmology : Cosmology or dict, optional
        Flat LambdaCDM parameters (keys ``Omega_m, Omega_b, Omega_L, h, sigma8,
        n_s, T_cmb``; missing keys take the Planck 2018-like defaults of
        :class:`Cosmology`). The snapshot's ``cosmology`` attribute holds the first six.
    seed : int
        Non-negative seed of the white noise; the realisation does not depend on
        ``chunks``.
    precision : {"float32", "float64"}, optional
        Dtype of pos/vel and of the mesh (default: dask config ``cosmo_dask.precision``).
    chunks : int, optional
        Particles per dask chunk (default: ``default_chunk_size()``).

    Returns
    -------
    Snapshot
        ``pos`` in Mpc/h, ``vel`` peculiar velocities in km/s, ids on the
        Lagrangian grid ``id = (i*n_side + j)*n_side + k`` (int64),
        ``lagrangian_shape = (n_side,)*3``, ``box_size``, ``scale_factor``,
        ``cosmology``, ``particle_mass = Omega_m * 27.7536627 * (box_size/n_side)^3``
        in 1e10 Msun/h, ``G = 43.00917`` (Mpc/h) (km/s)^2 / (1e10 Msun/h).
    """
    from ..snapshot import Snapshot

    n_side = check_positive_int(n_side, "n_side")
    box_size = check_positive(box_size, "box_size")
    redshift = check_redshift(redshift)
    cosmo = Cosmology.coerce(cosmology)
    seed = check_seed(seed)
    dtype = resolve_precision(precision)

    a = 1.0 / (1.0 + redshift)
    growth = float(cosmo.growth_factor(a))
    vel_factor = a * 100.0 * float(cosmo.E(a)) * float(cosmo.growth_rate(a))  # km/s per Mpc/h
    cosmo.power_spectrum(1.0)  # fix the sigma8 normalisation here, once, not in the task
    n = n_side**3
    token = tokenize("zeldovich", n_side, box_size, redshift, cosmo.as_dict(), cosmo.T_cmb,
                     seed, dtype.name, chunks)
    mesh = dask.delayed(displacement_mesh, pure=True)(
        n_side, box_size, cosmo, growth, seed, dtype, dask_key_name=f"zeldovich-mesh-{token}")
    arrays = from_mesh("zeldovich", token, mesh, _zeldovich_chunk, n=n, chunks=chunks,
                       outputs=[("pos", (3,), dtype), ("vel", (3,), dtype)],
                       n_side=n_side, box_size=box_size, vel_factor=vel_factor, dtype=dtype)
    ids = da.arange(n, chunks=arrays["pos"].chunks[0], dtype=np.int64)
    return Snapshot.from_arrays(
        arrays["pos"], arrays["vel"], ids, None, box_size=box_size,
        particle_mass=cosmo.Omega_m * RHO_CRIT_1E10 * (box_size / n_side) ** 3,
        lagrangian_shape=(n_side, n_side, n_side), scale_factor=a,
        cosmology=cosmo.as_dict(), units=dict(ZELDOVICH_UNITS), G=G_COSMO,
    )
