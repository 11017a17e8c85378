"""Lagrangian perturbation theory (1LPT = Zel'dovich, 2LPT) initial conditions.

Conventions (Scoccimarro 1998; Crocce, Pueblas & Scoccimarro 2006), all fields
on the ``n_side^3`` Lagrangian mesh of the periodic box:

* first order: ``lap phi1 = delta_L`` (the linear overdensity at ``D = 1``),
  ``psi1 = -grad phi1`` (so ``delta_L = -div psi1``, as in :func:`zeldovich`);
* second order: ``lap phi2 = sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2)``,
  ``psi2 = +grad phi2``;
* ``x = q + D1 psi1 + D2 psi2`` with ``D2 < 0`` (``D2 ~= -3/7 D1^2``), and the
  peculiar velocity ``v = a H(a) (f1 D1 psi1 + f2 D2 psi2)``.

Derivatives and Poisson solves are spectral (``i k``, ``-1/k^2``), in float64,
with the ``k = 0`` mode and the Nyquist planes of ``phi1`` and ``phi2`` set to zero.
The quadratic source is formed on the mesh without de-aliasing (as 2LPTic does):
it has power up to twice the mesh's largest linear wavenumber, which folds back
onto the mesh; the effect is second order in the small-scale amplitude.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.fft
from dask.base import tokenize

from ..backend import resolve_precision
from ..checks import check_positive, check_positive_int, check_seed
from ..errors import ParameterError
from ..validation import wrap_into_box
from ._blocks import from_mesh
from .cosmology import Cosmology
from .lattice import lattice_sites
from .zeldovich import (
    G_COSMO,
    RHO_CRIT_1E10,
    ZELDOVICH_UNITS,
    _zeldovich_chunk,
    check_redshift,
    displacement_mesh,
    linear_density_k,
    mesh_wavenumbers,
)

#: relative slack on a table's k range (the mesh's |k| and the range formula differ by ulps)
K_RANGE_RTOL = 1e-9


# --------------------------------------------------------------------------- power spectra
class TabulatedPower:
    """``P(k)`` interpolated in log-log from a table of ``(k, P)`` pairs.

    ``k`` in h/Mpc, strictly increasing and > 0; ``P`` in (Mpc/h)^3, > 0 (the
    interpolation is linear in ``(ln k, ln P)``). Calling it with any ``k``
    outside ``[k[0], k[-1]]`` (relative slack 1e-9) raises :class:`ParameterError`:
    it never extrapolates.
    """

    def __init__(self, k, power, *, source: str = "table"):
        k = np.asarray(k, dtype=np.float64)
        p = np.asarray(power, dtype=np.float64)
        what = f"power_spectrum ({source})"
        if k.ndim != 1 or p.shape != k.shape or k.size < 2:
            raise ParameterError(f"{what}: need at least 2 (k, P) rows, got k shape {k.shape}, "
                                 f"P shape {p.shape}")
        if not (np.all(np.isfinite(k)) and np.all(np.isfinite(p))):
            raise ParameterError(f"{what}: k and P must be finite")
        if np.any(k <= 0) or np.any(p <= 0):
            raise ParameterError(f"{what}: k and P must be > 0 (interpolated in log-log)")
        if np.any(np.diff(k) <= 0):
            raise ParameterError(f"{what}: k must be strictly increasing")
        self.k, self.power, self.source = k, p, source
        self._lnk, self._lnp = np.log(k), np.log(p)

    @property
    def k_min(self) -> float:
        return float(self.k[0])

    @property
    def k_max(self) -> float:
        return float(self.k[-1])

    @classmethod
    def from_file(cls, path) -> TabulatedPower:
        """Read a two-column text table ``k [h/Mpc]  P [(Mpc/h)^3]`` (``#`` comments)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ParameterError(
                f"power_spectrum: no such file {path!r} (a string is a path to a two-column "
                "k, P table, or 'camb' / 'class')")
        try:
            table = np.loadtxt(path, comments="#", ndmin=2, dtype=np.float64)
        except (ValueError, OSError) as err:
            raise ParameterError(
                f"power_spectrum: cannot read {path!r} as a numeric two-column table: {err}"
            ) from None
        if table.ndim != 2 or table.shape[1] != 2:
            raise ParameterError(
                f"power_spectrum: {path!r} must have exactly two columns (k in h/Mpc, "
                f"P in (Mpc/h)^3), got shape {table.shape}")
        return cls(table[:, 0], table[:, 1], source=path)

    def check_covers(self, k_lo: float, k_hi: float) -> None:
        """:class:`ParameterError` unless the table covers ``[k_lo, k_hi]``."""
        if k_lo < self.k_min * (1 - K_RANGE_RTOL) or k_hi > self.k_max * (1 + K_RANGE_RTOL):
            raise ParameterError(
                f"power_spectrum ({self.source}): the table covers k = [{self.k_min:.6g}, "
                f"{self.k_max:.6g}] h/Mpc but the mesh needs [{k_lo:.6g}, {k_hi:.6g}] h/Mpc "
                "(no extrapolation)")

    def __call__(self, k):
        k = np.asarray(k, dtype=np.float64)
        if k.size:
            self.check_covers(float(np.min(k)), float(np.max(k)))
        lnk = np.clip(np.log(k), self._lnk[0], self._lnk[-1])
        return np.exp(np.interp(lnk, self._lnk, self._lnp))

    def __dask_tokenize__(self):
        return ("TabulatedPower", self.k, self.power)

    def __repr__(self) -> str:
        return (f"TabulatedPower({self.source!r}, {self.k.size} rows, "
                f"k = [{self.k_min:.4g}, {self.k_max:.4g}] h/Mpc)")


def mesh_k_range(n_side: int, box_size: float) -> tuple[float, float] | None:
    """Smallest and largest ``|k|`` (h/Mpc) of the modes the mesh keeps (``k != 0``, off
    the Nyquist planes), or None where it keeps none (``n_side <= 2``)."""
    m_max = n_side // 2 - 1 if n_side % 2 == 0 else (n_side - 1) // 2
    if m_max < 1:
        return None
    kf = 2.0 * math.pi / box_size
    return kf, math.sqrt(3.0) * m_max * kf


def _boltzmann_table(code: str, cosmo: Cosmology, k_lo: float, k_hi: float) -> TabulatedPower:
    """Linear matter ``P(k, z=0)`` from CAMB or CLASS on ``[k_lo, k_hi]`` h/Mpc, rescaled to
    the cosmology's ``sigma8`` (the code's own sigma8 at z = 0)."""
    h = cosmo.h
    ombh2, omch2 = cosmo.Omega_b * h * h, (cosmo.Omega_m - cosmo.Omega_b) * h * h
    decades = math.log10(k_hi / k_lo)
    k = np.geomspace(k_lo, k_hi, max(int(200 * decades), 200))
    if code == "camb":
        try:
            import camb
        except ImportError:
            raise ParameterError(
                "power_spectrum='camb' needs the camb package: pip install camb") from None
        pars = camb.CAMBparams()
        pars.set_cosmology(H0=100.0 * h, ombh2=ombh2, omch2=omch2, mnu=0.0, omk=0.0,
                           TCMB=cosmo.T_cmb)
        pars.InitPower.set_params(ns=cosmo.n_s, As=2.1e-9)
        pars.set_matter_power(redshifts=[0.0], kmax=1.1 * k_hi * h)
        pars.NonLinear = camb.model.NonLinear_none
        results = camb.get_results(pars)
        kh, _, pk = results.get_matter_power_spectrum(minkh=k_lo, maxkh=k_hi, npoints=k.size)
        k, p = np.asarray(kh, dtype=np.float64), np.asarray(pk, dtype=np.float64)[0]
        sigma8 = float(results.get_sigma8_0())
    elif code == "class":
        try:
            from classy import Class
        except ImportError:
            raise ParameterError(
                "power_spectrum='class' needs the classy package (CLASS): pip install classy"
            ) from None
        engine = Class()
        engine.set({"output": "mPk", "P_k_max_h/Mpc": 1.1 * k_hi, "z_pk": 0.0, "h": h,
                    "omega_b": ombh2, "omega_cdm": omch2, "n_s": cosmo.n_s, "A_s": 2.1e-9,
                    "T_cmb": cosmo.T_cmb})
        try:
            engine.compute()
            p = np.array([engine.pk_lin(kk * h, 0.0) for kk in k]) * h**3
            sigma8 = float(engine.sigma8())
        finally:
            engine.struct_cleanup()
            engine.empty()
    else:  # pragma: no cover (checked by the caller)
        raise ParameterError(f"power_spectrum: unknown Boltzmann code {code!r}")
    return TabulatedPower(k, p * (cosmo.sigma8 / sigma8) ** 2, source=code)


def resolve_power_spectrum(power_spectrum, cosmology: Cosmology | Mapping[str, Any] | None = None,
                           k_range: tuple[float, float] | None = None) -> Callable | None:
    """The linear ``P(k, z=0)`` (k in h/Mpc, (Mpc/h)^3) that :func:`lpt_ics` realises.

    ``None`` -> None (the cosmology's EH98 no-wiggle spectrum, normalised to
    ``sigma8``); a callable -> itself, after a probe on ``k_range`` (it must return
    finite values >= 0 of its input's shape); ``"camb"`` / ``"class"`` -> a
    :class:`TabulatedPower` computed by that code from the cosmology's parameters
    (massless neutrinos, rescaled to ``sigma8``) on ``[min(1e-4, k_lo/2), max(5, 1.2
    k_hi)]`` h/Mpc; any other string or a path -> a :class:`TabulatedPower` read from
    a two-column text file, which must cover ``k_range`` (the mesh's smallest and
    largest kept ``|k|``, :func:`mesh_k_range`).
    """
    cosmo = Cosmology.coerce(cosmology)
    if power_spectrum is None:
        return None
    if isinstance(power_spectrum, str) and power_spectrum.strip().lower() in ("camb", "class"):
        lo, hi = k_range if k_range is not None else (1e-3, 1.0)
        return _boltzmann_table(power_spectrum.strip().lower(), cosmo, min(1e-4, 0.5 * lo),
                                max(5.0, 1.2 * hi))
    if isinstance(power_spectrum, (str, os.PathLike)):
        table = TabulatedPower.from_file(power_spectrum)
        if k_range is not None:
            table.check_covers(*k_range)
        return table
    if isinstance(power_spectrum, TabulatedPower):
        if k_range is not None:
            power_spectrum.check_covers(*k_range)
        return power_spectrum
    if callable(power_spectrum):
        lo, hi = k_range if k_range is not None else (1e-3, 1.0)
        probe = np.geomspace(lo, hi, 16)
        try:
            value = np.asarray(power_spectrum(probe), dtype=np.float64)
        except ParameterError:
            raise
        except Exception as err:
            raise ParameterError(
                f"power_spectrum: the callable failed on k = {lo:.4g}..{hi:.4g} h/Mpc: "
                f"{type(err).__name__}: {err}") from err
        if value.shape != probe.shape or not np.all(np.isfinite(value)) or np.any(value < 0):
            raise ParameterError(
                "power_spectrum: the callable must map a 1-d array of k (h/Mpc) to finite "
                f"P(k) >= 0 ((Mpc/h)^3) of the same shape; on {probe.size} probe k it gave "
                f"shape {value.shape}")
        return power_spectrum
    raise ParameterError(
        "power_spectrum must be None (EH98 no-wiggle), a callable P(k), a path to a "
        f"two-column (k, P) table, 'camb' or 'class'; got {type(power_spectrum).__name__}")


# --------------------------------------------------------------------------- 2LPT fields
def _second_order_potential_k(u_k: np.ndarray, n: int, box_size: float) -> np.ndarray:
    """``phi2_k`` (rfft layout) from ``u_k = delta_k / k^2 = -phi1_k``.

    ``phi1_ij = irfft(k_i k_j u_k)``; the source ``S = sum_{i<j} (phi1_ii phi1_jj -
    phi1_ij^2)`` is accumulated with at most three real meshes alive, then
    ``phi2_k = -S_k / k^2`` with ``k = 0`` and the Nyquist planes zeroed.
    """
    kx, ky, kz = mesh_wavenumbers(n, box_size)
    shape = (n, n, n)

    def deriv2(ki, kj):
        return scipy.fft.irfftn(u_k * (ki * kj), s=shape)

    xx = deriv2(kx, kx)
    yy = deriv2(ky, ky)
    src = xx * yy
    xx += yy
    del yy
    zz = deriv2(kz, kz)
    zz *= xx
    src += zz
    del xx, zz
    for ki, kj in ((kx, ky), (kx, kz), (ky, kz)):
        off = deriv2(ki, kj)
        off *= off
        src -= off
        del off
    phi2_k = scipy.fft.rfftn(src)
    del src
    k2 = kx * kx + ky * ky + kz * kz
    k2[0, 0, 0] = 1.0
    phi2_k /= -k2
    del k2
    phi2_k[0, 0, 0] = 0.0
    if n % 2 == 0:
        phi2_k[n // 2, :, :] = 0.0
        phi2_k[:, n // 2, :] = 0.0
        phi2_k[:, :, n // 2] = 0.0
    return phi2_k


def second_order_displacement(delta_k: np.ndarray, box_size: float) -> np.ndarray:
    """2LPT displacement ``psi2 = grad phi2`` of a linear field, (n^3, 3) float64 in id order.

    Parameters
    ----------
    delta_k : complex array (n, n, n//2+1)
        The linear overdensity ``delta_L`` in rfft layout (numpy's unnormalised
        forward transform of the real-space field), e.g. from
        :func:`~cosmo_dask.models.zeldovich.linear_density_k` at growth 1; its
        ``k = 0`` mode is ignored.
    box_size : float
        Side of the box in Mpc/h.

    Returns
    -------
    ndarray (n^3, 3)
        ``psi2`` in Mpc/h for ``D1 = 1`` (row ``(i*n + j)*n + k`` is mesh site
        ``(i, j, k)``); the second-order displacement at growth ``D1`` is
        ``D2 psi2`` with ``D2 ~= -3/7 D1^2``. ``lap phi2 = sum_{i<j} (phi1_ii
        phi1_jj - phi1_ij^2)``, ``lap phi1 = delta_L``.
    """
    n = delta_k.shape[0]
    if delta_k.shape != (n, n, n // 2 + 1):
        raise ParameterError(f"delta_k must have rfft shape (n, n, n//2+1), got {delta_k.shape}")
    kx, ky, kz = mesh_wavenumbers(n, box_size)
    k2 = kx * kx + ky * ky + kz * kz
    k2[0, 0, 0] = 1.0
    u_k = delta_k / k2
    u_k[0, 0, 0] = 0.0
    del k2
    phi2_k = _second_order_potential_k(u_k, n, box_size)
    out = np.empty((n**3, 3), dtype=np.float64)
    _gradient_into(out, 0, phi2_k, 1.0, kx, ky, kz)
    return out


def _gradient_into(out: np.ndarray, col: int, field_k: np.ndarray, factor: float, kx, ky,
                   kz) -> None:
    """``out[:, col:col+3] = factor * grad(field)`` from its rfft ``field_k``, one axis at a
    time (float64 FFT, cast to ``out.dtype`` on the way in)."""
    n = field_k.shape[0]
    for axis, k_axis in enumerate((kx, ky, kz)):
        comp = scipy.fft.irfftn(field_k * (1j * k_axis), s=(n, n, n)).reshape(-1)
        np.multiply(comp, factor, out=out[:, col + axis], casting="unsafe")
        del comp


def lpt2_mesh(n_side: int, box_size: float, cosmology: Cosmology, growth1: float,
              growth2: float, seed: int, dtype: np.dtype, power=None, *, fixed: bool = False,
              paired: bool = False) -> np.ndarray:
    """``[D1 psi1, D2 psi2]``: (n_side^3, 6) array in id order, Mpc/h, of ``dtype``.

    Same white noise and ``delta_k`` as :func:`~cosmo_dask.models.zeldovich.
    displacement_mesh` (``power``: None or a callable ``P(k)`` at z = 0). All the
    Fourier work is float64; the result is ``6 n_side^3 itemsize`` bytes. Peak
    memory of the call (tracemalloc, n_side = 64 and 128): about ``81 n_side^3``
    bytes in float64, ``57 n_side^3`` in float32 (scipy's FFT work buffers are not
    counted by tracemalloc; they add up to one more complex mesh, ``8 n_side^3``).
    ``fixed``, ``paired``: see :func:`~cosmo_dask.models.zeldovich.linear_density_k`
    (pairing flips ``psi1``; ``psi2``, quadratic in the field, is the same).
    """
    n = n_side
    delta_k, k2 = linear_density_k(n, box_size, cosmology, 1.0, seed, power, fixed=fixed,
                                   paired=paired)
    delta_k /= k2  # u_k = delta_k / k^2 = -phi1_k (k = 0 and Nyquist already zero)
    del k2
    phi2_k = _second_order_potential_k(delta_k, n, box_size)
    kx, ky, kz = mesh_wavenumbers(n, box_size)
    out = np.empty((n**3, 6), dtype=dtype)
    _gradient_into(out, 0, delta_k, growth1, kx, ky, kz)
    del delta_k
    _gradient_into(out, 3, phi2_k, growth2, kx, ky, kz)
    return out


def _lpt2_chunk(mesh: np.ndarray, start: int, stop: int, *, n_side: int, box_size: float,
                vel_factor1: float, vel_factor2: float,
                dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    s = mesh[start:stop].astype(np.float64)
    s1, s2 = s[:, :3], s[:, 3:]
    q = lattice_sites(start, stop - start, n_side, box_size / n_side)
    pos = wrap_into_box(q + s1 + s2, box_size, dtype)
    vel = (vel_factor1 * s1 + vel_factor2 * s2).astype(dtype)
    return pos, vel


# --------------------------------------------------------------------------- generator
def lpt_ics(n_side: int, *, box_size: float, redshift: float, order: int = 2,
            power_spectrum=None, cosmology: Cosmology | Mapping[str, Any] | None = None,
            seed: int = 0, precision=None, chunks: int | None = None,
            fixed_amplitude: bool = False, paired: bool = False):
    """Lagrangian-perturbation-theory initial conditions (Zel'dovich or 2LPT) in a
    periodic flat LambdaCDM box.

    A Gaussian random field with the linear power spectrum ``power_spectrum`` is
    realised on the ``n_side^3`` Lagrangian mesh from the same white noise as
    :func:`~cosmo_dask.models.zeldovich.zeldovich` (same seed, same field). Each
    particle moves from its lattice site ``q = ((i, j, k) + 0.5) * box_size / n_side``
    to

    * ``order=1``: ``x = q + D1 psi1``, ``v = a H f1 D1 psi1`` -- exactly (bitwise)
      :func:`zeldovich` for the same arguments;
    * ``order=2``: ``x = q + D1 psi1 + D2 psi2``,
      ``v = a H(a) (f1 D1 psi1 + f2 D2 psi2)``,

    wrapped into ``[0, box_size)``. Here ``psi1 = -grad phi1`` with ``lap phi1 =
    delta_L`` (``delta_L = -div psi1``), ``psi2 = +grad phi2`` with ``lap phi2 =
    sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2)``; ``D1 = D(a)`` and ``f1 = dln D/dln a``
    are the exact linear growth factor and rate (:meth:`Cosmology.growth_factor`,
    ``D(1) = 1``), and the second-order ones use the Bouchet et al. (1995) fits
    ``D2 ~= -3/7 D1^2 Omega_m(a)^(-1/143)`` (negative: the 2LPT displacement points
    along ``-grad phi2``) and ``f2 ~= 2 Omega_m(a)^(6/11)``
    (:meth:`Cosmology.growth_factor_2lpt`, :meth:`Cosmology.growth_rate_2lpt`).
    ``H(a) = 100 E(a)`` h km/s/Mpc, so ``v`` is the peculiar velocity in km/s
    (``a dx/dt`` in physical units; Gadget's file convention stores ``v / sqrt(a)``).
    The ``k = 0`` mode and the Nyquist planes of ``phi1`` and ``phi2`` are zero; the
    quadratic source is not de-aliased (see the module docstring).

    Memory: the mesh is built whole inside one dask task (``lpt-mesh-<token>``).
    ``order=2`` holds ``[D1 psi1, D2 psi2]``, ``6 n_side^3 itemsize`` bytes (48
    n_side^3 in float64, 24 n_side^3 in float32: 6.4 / 3.2 GB for n_side = 512); its
    construction peaks at about ``81 n_side^3`` bytes in float64 and ``57 n_side^3``
    in float32 (tracemalloc, plus scipy's FFT buffers of about ``8 n_side^3``):
    10.9 / 7.7 GB for n_side = 512 on that one worker. ``order=1`` is the Zel'dovich
    mesh (``3 n_side^3 itemsize`` bytes, peak about ``50 n_side^3``). Particle chunks
    slice the mesh (id order) and are otherwise built chunk by chunk.

    Parameters
    ----------
    n_side : int
        Particles per side, >= 1 (N = n_side^3).
    box_size : float
        Side of the periodic box in Mpc/h, > 0.
    redshift : float
        Redshift of the output, > -1 (``scale_factor = 1 / (1 + z)``).
    order : {1, 2}
        Order of Lagrangian perturbation theory (1: Zel'dovich, 2: 2LPT).
    power_spectrum : None, callable, path or {"camb", "class"}
        Linear matter ``P(k)`` at z = 0, k in h/Mpc, ``P`` in (Mpc/h)^3 (scaled by
        ``D1^2`` to the output redshift):

        * None: the cosmology's Eisenstein & Hu (1998) no-wiggle spectrum,
          normalised to ``sigma8`` (:meth:`Cosmology.power_spectrum`);
        * a callable ``P(k)`` taking a 1-d float64 array and returning finite
          values >= 0 of the same shape (called only on the kept modes);
        * a path (str or ``os.PathLike``) to a two-column text table ``k P``
          (``#`` comments), interpolated linearly in ``(ln k, ln P)``; it must cover
          the mesh's ``[k_f, sqrt(3) k_max]`` (:func:`mesh_k_range`), no extrapolation;
        * ``"camb"`` / ``"class"``: computed now by CAMB (``import camb``) or CLASS
          (``from classy import Class``) from the cosmology's ``Omega_m, Omega_b, h,
          n_s, T_cmb`` (massless neutrinos), rescaled to its ``sigma8``.
    cosmology : Cosmology or dict, optional
        Flat LambdaCDM parameters, as for :func:`zeldovich`.
    seed : int
        Non-negative seed of the white noise (the Zel'dovich stream).
    precision : {"float32", "float64"}, optional
        Dtype of pos/vel and of the stored mesh (default: dask config
        ``cosmo_dask.precision``); the Fourier work is float64.
    chunks : int, optional
        Particles per dask chunk (default: ``default_chunk_size()``).
    fixed_amplitude : bool
        Fix every mode's amplitude to ``sqrt(P(k))`` (random phases kept): the
        realised linear power equals ``P`` mode by mode, which removes most of the
        box's sample variance from P(k) and the halo mass function ("fixed" ICs,
        Angulo & Pontzen 2016; Villaescusa-Navarro et al. 2018). The field is then not
        Gaussian (no amplitude scatter); statistics beyond P(k) can be biased.
    paired : bool
        Flip the sign of the linear field (phases shifted by pi). A run from
        ``paired=False`` and one from ``paired=True`` (same seed, usually both
        ``fixed_amplitude=True``) average away the leading mode-coupling term of
        the nonlinear P(k) ("paired-and-fixed", as EuclidEmulator2's simulations).

    Returns
    -------
    Snapshot
        As :func:`zeldovich`: ``pos`` in Mpc/h, ``vel`` peculiar km/s, ids on the
        Lagrangian grid (int64), ``lagrangian_shape``, ``box_size``,
        ``scale_factor``, ``cosmology``, ``particle_mass = Omega_m * 27.7536627 *
        (box_size/n_side)^3`` (1e10 Msun/h), ``units``, ``G = 43.00917``. (The
        snapshot has no attribute for the LPT order: :class:`Snapshot` keeps a
        fixed set of attributes.)

    Raises
    ------
    ParameterError
        Bad ``n_side``, ``box_size``, ``redshift``, ``order``, ``seed``, ``chunks``,
        cosmology, or ``power_spectrum`` (wrong type, unreadable or too short
        table, a missing camb/classy package, a callable giving bad values).
    """
    from ..snapshot import Snapshot

    n_side = check_positive_int(n_side, "n_side")
    box_size = check_positive(box_size, "box_size")
    redshift = check_redshift(redshift)
    if isinstance(order, bool) or order not in (1, 2):
        raise ParameterError(f"order must be 1 (Zel'dovich) or 2 (2LPT), got {order!r}")
    order = int(order)
    cosmo = Cosmology.coerce(cosmology)
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    if chunks is not None:
        check_positive_int(chunks, "chunks")
    power = resolve_power_spectrum(power_spectrum, cosmo, mesh_k_range(n_side, box_size))

    a = 1.0 / (1.0 + redshift)
    growth1 = float(cosmo.growth_factor(a))
    hubble = a * 100.0 * float(cosmo.E(a))  # a H(a) in km/s per Mpc/h
    vel_factor1 = hubble * float(cosmo.growth_rate(a))
    if power is None:
        cosmo.power_spectrum(1.0)  # fix the sigma8 normalisation here, once, not in the task
    n = n_side**3
    fixed_amplitude, paired = bool(fixed_amplitude), bool(paired)
    field = {"fixed": fixed_amplitude, "paired": paired}
    token = tokenize("lpt", order, n_side, box_size, redshift, cosmo.as_dict(), cosmo.T_cmb,
                     seed, dtype.name, chunks, power, field)
    outputs = [("pos", (3,), dtype), ("vel", (3,), dtype)]
    if order == 1:
        mesh = dask.delayed(displacement_mesh, pure=True)(
            n_side, box_size, cosmo, growth1, seed, dtype, power, **field,
            dask_key_name=f"lpt-mesh-{token}")
        arrays = from_mesh("lpt", token, mesh, _zeldovich_chunk, n=n, chunks=chunks,
                           outputs=outputs, n_side=n_side, box_size=box_size,
                           vel_factor=vel_factor1, dtype=dtype)
    else:
        growth2 = float(cosmo.growth_factor_2lpt(a))
        vel_factor2 = hubble * float(cosmo.growth_rate_2lpt(a))
        mesh = dask.delayed(lpt2_mesh, pure=True)(
            n_side, box_size, cosmo, growth1, growth2, seed, dtype, power, **field,
            dask_key_name=f"lpt-mesh-{token}")
        arrays = from_mesh("lpt", token, mesh, _lpt2_chunk, n=n, chunks=chunks,
                           outputs=outputs, n_side=n_side, box_size=box_size,
                           vel_factor1=vel_factor1, vel_factor2=vel_factor2, dtype=dtype)
    ids = da.arange(n, chunks=arrays["pos"].chunks[0], dtype=np.int64)
    return Snapshot.from_arrays(
        arrays["pos"], arrays["vel"], ids, None, box_size=box_size,
        particle_mass=cosmo.Omega_m * RHO_CRIT_1E10 * (box_size / n_side) ** 3,
        lagrangian_shape=(n_side, n_side, n_side), scale_factor=a,
        cosmology=cosmo.as_dict(), units=dict(ZELDOVICH_UNITS), G=G_COSMO,
    )
