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

import numpy as np

from ..core.backend import resolve_precision
from ..core.checks import (
    check_bounded_int,
    check_chunk_count,
    check_cube_side,
    check_positive_int,
    check_seed,
)
from ..core.errors import ParameterError
from .cosmology import Cosmology
from .lpt_fields import check_ics_mesh, second_order_displacement
from .parameters import LPT_ORDER_DEFAULT, LPT_ORDERS, SEED_DEFAULT
from .zeldovich_ics import check_ics_device, check_redshift, lpt_snapshot

__all__ = ["TabulatedPower", "lpt_ics", "mesh_k_range", "resolve_power_spectrum",
           "second_order_displacement"]

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


# --------------------------------------------------------------------------- generator
def lpt_ics(n_side: int, *, box_size: float, redshift: float, order: int = LPT_ORDER_DEFAULT,
            power_spectrum=None, cosmology: Cosmology | Mapping[str, Any] | None = None,
            seed: int = SEED_DEFAULT, precision=None, chunks: int | None = None,
            fixed_amplitude: bool = False, paired: bool = False, slabs: int | None = None,
            device: str = "cpu"):
    """Lagrangian-perturbation-theory initial conditions (Zel'dovich or 2LPT) in a
    periodic flat LambdaCDM box.

    A Gaussian random field with the linear power spectrum ``power_spectrum`` is
    realised on the ``n_side^3`` Lagrangian mesh from the same white noise as
    :func:`~cosmo_dask.models.zeldovich_ics.zeldovich` (same seed, same field). Each
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

    Memory and work: the fields are made slab by slab through the distributed FFT
    (:mod:`cosmo_dask.models.lpt_fields`): white noise drawn per lattice plane, then
    4 (``order=1``) or 14 (``order=2``) mesh FFTs in float64 and one particle task per
    slab. No task holds the whole mesh: with ``S`` slabs a task holds at most about
    13/S of the float64 mesh (``8 n_side^3`` bytes; the FFT tasks 2/S). The particles
    do not depend on ``chunks``, on the scheduler or on its workers (bit for bit);
    on the CPU not on ``slabs`` either (pocketfft, tested).

    Parameters
    ----------
    n_side : int
        Particles per side, 1 to 4096, with no prime factor above 7 (N = n_side^3).
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
        Dtype of pos/vel (default: dask config ``cosmo_dask.precision``); the
        Fourier work is float64.
    chunks : int, optional
        Particles per dask chunk of the result (default: ``default_chunk_size()``),
        rechunked from the slabs' ``c n_side^2`` rows.
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
    slabs : int, optional
        Number of mesh slabs (at most ``n_side``); default
        :func:`~cosmo_dask.models.lpt_fields.ics_slab_count` (CPU: one per 64 MiB of
        the complex mesh and at least one per worker thread; GPU: one per 256 MiB).
    device : {"cpu", "gpu"}
        NumPy or CuPy chunks: the FFTs, k-space steps and particles run on the
        worker's GPU; the white noise is drawn on the host, the same on both
        devices, so CPU and GPU particles agree to FFT round-off.

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
        Bad ``n_side`` (above 4096 or with a prime factor above 7), ``box_size``,
        ``redshift``, ``order``, ``seed``, ``chunks``, ``slabs``, ``device``,
        cosmology, or ``power_spectrum`` (wrong type, unreadable or too short table,
        a missing camb/classy package, a callable giving bad values).
    DeviceError
        ``device="gpu"`` without CuPy or a GPU.
    """
    n_side = check_ics_mesh(n_side)
    box_size = check_cube_side(box_size, "box_size")
    redshift = check_redshift(redshift)
    if isinstance(order, bool) or order not in LPT_ORDERS:
        raise ParameterError(f"order must be 1 (Zel'dovich) or 2 (2LPT), got {order!r}")
    order = int(order)
    cosmo = Cosmology.coerce(cosmology)
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    if chunks is not None:
        check_chunk_count(n_side**3, check_positive_int(chunks, "chunks"))
    if slabs is not None:
        check_bounded_int(slabs, "slabs", n_side, "a slab holds at least one plane of the "
                          "n_side^3 mesh")
    device = check_ics_device(device, "lpt_ics")
    power = resolve_power_spectrum(power_spectrum, cosmo, mesh_k_range(n_side, box_size))
    return lpt_snapshot("lpt", n_side, box_size=box_size, redshift=redshift, order=order,
                        cosmology=cosmo, seed=seed, dtype=dtype, chunks=chunks, power=power,
                        fixed=bool(fixed_amplitude), paired=bool(paired), slabs=slabs,
                        device=device)
