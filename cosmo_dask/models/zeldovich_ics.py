"""Zel'dovich-approximation initial conditions for a periodic LambdaCDM box."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import check_device, require_gpu, resolve_precision, to_device
from ..core.checks import check_cube_side, check_seed
from ..core.errors import ParameterError
from ..units import gravitational_constant
from .blocks import chunk_lengths
from .cosmology import Cosmology
from .lpt_fields import (
    check_ics_mesh,
    displacement_slabs,
    ics_slab_count,
    linear_density_kslabs,
    noise_plane,
    particle_slabs,
)
from .parameters import SEED_DEFAULT

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
    """Unit-variance Gaussian white noise of the IC generators on the whole mesh,
    shape (n_side,)*3, float64.

    Plane ``i`` (``noise[i]``) is :func:`~cosmo_dask.models.lpt_fields.noise_plane`
    ``(seed, i, n_side)``, as in the generators' slab tasks; this in-memory copy is for
    references and small meshes.
    """
    n = check_ics_mesh(n_side)
    noise = np.empty((n, n, n), dtype=np.float64)
    for i in range(n):
        noise_plane(seed, i, n, noise[i])
    return noise


def mesh_wavenumbers(n_side: int, box_size: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """kx, ky (full) and kz (half, rfft) wavenumbers of the mesh in h/Mpc, broadcastable."""
    kf = 2.0 * np.pi / box_size
    k_full = np.fft.fftfreq(n_side, d=1.0 / n_side) * kf
    k_half = np.fft.rfftfreq(n_side, d=1.0 / n_side) * kf
    return k_full[:, None, None], k_full[None, :, None], k_half[None, None, :]


def linear_density_k(n_side: int, box_size: float, cosmology: Cosmology, growth: float,
                     seed: int, power=None, *, fixed: bool = False, paired: bool = False,
                     slabs: int | None = None) -> np.ndarray:
    """The generators' linear overdensity at growth ``D`` in Fourier space, computed whole.

    ``delta_k = D rfftn(w) sqrt(P(k) / V_cell)`` (numpy's unnormalised forward rfft
    of the white noise :func:`white_noise`, so ``<|delta_k|^2> = V P(k) D^2 /
    V_cell^2``), the ``k = 0`` mode and the Nyquist planes zero; ``P`` from
    ``power`` (None: the cosmology's EH98 no-wiggle spectrum; or a callable ``P(k)``
    at z = 0). ``fixed=True`` keeps each mode's phase and sets ``|rfftn(w)| ->
    sqrt(n^3)`` (so ``|delta_k|^2`` is exactly ``V P D^2 / V_cell^2``: "fixed" fields,
    Angulo & Pontzen 2016); ``paired=True`` flips the sign (the phases shifted by pi).

    This is the slab graph of :func:`~cosmo_dask.models.lpt_fields.
    linear_density_kslabs` computed into one complex128 ``(n, n, n//2+1)`` array: for
    tests and small meshes.
    """
    n = check_ics_mesh(n_side)
    field = linear_density_kslabs(n, box_size, Cosmology.coerce(cosmology), seed, power,
                                  fixed=fixed, paired=paired, slabs=slabs)
    out = field.compute()
    out *= growth
    return out


def lpt_snapshot(label: str, n_side: int, *, box_size: float, redshift: float, order: int,
                 cosmology: Cosmology, seed: int, dtype: np.dtype, chunks: int | None,
                 power=None, fixed: bool = False, paired: bool = False,
                 slabs: int | None = None, device: str = "cpu"):
    """The lazy LPT snapshot of :func:`zeldovich` and :func:`~cosmo_dask.models.lpt_ics`
    (checked arguments): the slab graph of :mod:`~cosmo_dask.models.lpt_fields`, task
    names ``<label>-*``, particle chunks of ``chunks`` rows (default
    ``default_chunk_size()``) rechunked from the slab chunks."""
    from ..store.snapshot import Snapshot

    cosmo = cosmology
    a = 1.0 / (1.0 + redshift)
    growth1 = float(cosmo.growth_factor(a))
    hubble = a * 100.0 * float(cosmo.E(a))  # a H(a) in km/s per Mpc/h
    vel_factor1 = hubble * float(cosmo.growth_rate(a))
    growth2 = float(cosmo.growth_factor_2lpt(a)) if order == 2 else 0.0
    vel_factor2 = hubble * float(cosmo.growth_rate_2lpt(a)) if order == 2 else 0.0
    if power is None:
        cosmo.power_spectrum(1.0)  # fix the sigma8 normalisation here, once, not in the task
    count = ics_slab_count(n_side, slabs, device)
    n = n_side**3
    lengths = chunk_lengths(n, chunks)
    token = tokenize(label, order, n_side, box_size, redshift, cosmo.as_dict(), cosmo.T_cmb,
                     seed, dtype.name, lengths, power, fixed, paired, count, device)
    delta_k = linear_density_kslabs(n_side, box_size, cosmo, seed, power, fixed=fixed,
                                    paired=paired, slabs=count, device=device, label=label)
    comps = displacement_slabs(delta_k, box_size, order=order, growth1=growth1,
                               growth2=growth2, label=label)
    arrays = particle_slabs(label, token, comps, box_size=box_size, vel_factor1=vel_factor1,
                            vel_factor2=vel_factor2, dtype=dtype)
    pos, vel = (arrays[k].rechunk((lengths, 3)) for k in ("pos", "vel"))
    ids = to_device(da.arange(n, chunks=(lengths,), dtype=np.int64), device)
    return Snapshot.from_arrays(
        pos, vel, ids, None, box_size=box_size,
        particle_mass=cosmo.Omega_m * RHO_CRIT_1E10 * (box_size / n_side) ** 3,
        lagrangian_shape=(n_side, n_side, n_side), scale_factor=a,
        cosmology=cosmo.as_dict(), units=dict(ZELDOVICH_UNITS), G=G_COSMO,
    )


def check_ics_device(device: Any, what: str) -> str:
    """``"cpu"`` or ``"gpu"`` (the latter only with CuPy and a GPU: else DeviceError)."""
    device = check_device(device)
    if device == "gpu":
        require_gpu(f"{what}(device='gpu')")
    return device


def zeldovich(n_side: int, *, box_size: float, redshift: float,
              cosmology: Cosmology | Mapping[str, Any] | None = None, seed: int = SEED_DEFAULT,
              precision=None, chunks: int | None = None, slabs: int | None = None,
              device: str = "cpu"):
    """Zel'dovich-approximation initial conditions in a periodic flat LambdaCDM box.

    A Gaussian random field with the linear power spectrum (Eisenstein & Hu 1998
    no-wiggle transfer function, normalised to ``sigma8``) is realised on the
    ``n_side^3`` Lagrangian mesh; the displacement ``psi`` (``delta = -div psi``),
    scaled by the growth factor ``D(a)`` (``D(1) = 1``), moves each particle from
    its lattice site ``q = ((i, j, k) + 0.5) * box_size / n_side`` (cell centres,
    as in :func:`perturbed_lattice`): ``x = q + psi`` wrapped into ``[0, box_size)``,
    and gives the peculiar velocity ``v = a H(a) f(a) psi`` (km/s), with
    ``f = dln D/dln a``. The ``k = 0`` mode and the Nyquist planes are zero. Same
    particles, bit for bit, as ``lpt_ics(..., order=1)``.

    The fields are made slab by slab through the distributed FFT
    (:mod:`cosmo_dask.models.lpt_fields`: white noise drawn per lattice plane, 1
    forward and 3 inverse FFTs in float64, one particle task per slab); no task holds
    the whole mesh: a task holds at most about 10/S of the float64 mesh (``8
    n_side^3`` bytes) for S slabs.

    Parameters
    ----------
    n_side : int
        Particles per side, 1 to 4096, with no prime factor above 7 (N = n_side^3).
    box_size : float
        Side of the periodic box in Mpc/h, > 0.
    redshift : float
        Redshift of the output, > -1 (``scale_factor = 1 / (1 + z)``).
    cosmology : Cosmology or dict, optional
        Flat LambdaCDM parameters (keys ``Omega_m, Omega_b, Omega_L, h, sigma8,
        n_s, T_cmb``; missing keys take the Planck 2018-like defaults of
        :class:`Cosmology`). The snapshot's ``cosmology`` attribute holds the first six.
    seed : int
        Non-negative seed of the white noise; the particles do not depend on
        ``chunks`` nor on the scheduler or its workers (bit for bit).
    precision : {"float32", "float64"}, optional
        Dtype of pos/vel (default: dask config ``cosmo_dask.precision``); the fields
        are computed in float64.
    chunks : int, optional
        Particles per dask chunk of the result (default: ``default_chunk_size()``),
        rechunked from the slabs' ``c n_side^2`` rows.
    slabs : int, optional
        Number of mesh slabs (at most ``n_side``); default
        :func:`~cosmo_dask.models.lpt_fields.ics_slab_count`.
    device : {"cpu", "gpu"}
        NumPy or CuPy chunks (the FFTs and particles on the GPU; the white noise is
        drawn on the host and is the same on both).

    Returns
    -------
    Snapshot
        ``pos`` in Mpc/h, ``vel`` peculiar velocities in km/s, ids on the
        Lagrangian grid ``id = (i*n_side + j)*n_side + k`` (int64),
        ``lagrangian_shape = (n_side,)*3``, ``box_size``, ``scale_factor``,
        ``cosmology``, ``particle_mass = Omega_m * 27.7536627 * (box_size/n_side)^3``
        in 1e10 Msun/h, ``G = 43.00917`` (Mpc/h) (km/s)^2 / (1e10 Msun/h).

    Raises
    ------
    ParameterError
        Bad ``n_side`` (above 4096 or with a prime factor above 7), ``box_size``,
        ``redshift``, ``seed``, ``chunks``, ``slabs``, ``device`` or cosmology.
    DeviceError
        ``device="gpu"`` without CuPy or a GPU.
    """
    n_side = check_ics_mesh(n_side)
    box_size = check_cube_side(box_size, "box_size")
    redshift = check_redshift(redshift)
    cosmo = Cosmology.coerce(cosmology)
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    device = check_ics_device(device, "zeldovich")
    return lpt_snapshot("zeldovich", n_side, box_size=box_size, redshift=redshift, order=1,
                        cosmology=cosmo, seed=seed, dtype=dtype, chunks=chunks, slabs=slabs,
                        device=device)
