"""Self-consistent field (SCF) expansion: Hernquist & Ostriker (1992) basis on dask.

:class:`SCF` fits the coefficients of the Hernquist-Ostriker bi-orthogonal
basis (Gegenbauer radial functions times real spherical harmonics) to
particles and evaluates potential, accelerations and density from them.

Method (as in ETICS, Meiron et al. 2014, and gala): the coefficients are sums
over particles, so every chunk of particles computes its partial sums (and the
sums of squares for the coefficient variances) independently -- numba on CPU
chunks, a CUDA kernel on CuPy chunks -- and a dask tree reduction
(``split_every`` tunable) adds them: that reduction is the only global step.
Evaluation maps over chunks of the evaluation points with the coefficients
broadcast (``2 (nmax+1) (lmax+1)^2`` float64: 8.6 kB for nmax=10, lmax=6;
1.1 MB at the limits nmax=64, lmax=32).

Normalisation and sign conventions are gala's (``gala.potential.scf``):
coefficients are dimensionless, computed with masses divided by the total mass
``M``, so ``gala.potential.SCFPotential(m=M, r_s=scale_radius, Snlm=S,
Tnlm=T)`` reproduces this expansion (for ``G = 1`` in gala's unit-less mode).
See :mod:`cosmo_dask.expansion.scf_kernels` for the formulas and the stable
recurrences (no NaN on the z axis or at r = 0).

The expansions' distributed centre finder lives here too, since it is built on SCF
(``SCF(center="potential_min")`` and ``MEX(center="potential_min")`` use it):
:func:`potential_min_center` finds the minimum of a smooth, low-order SCF
potential of the particles without gathering them: fit (a map over chunks and
one tree reduction of a few hundred numbers), evaluate the potential at every
particle (a map), take each chunk's smallest value and its position (a map
returning 4 numbers per chunk) and the smallest of those on the client; then
recentre and repeat. The minimum of a finite expansion is biased toward the
expansion centre (every radial basis function has its cusp there), so the
argmin passes only locate the potential well -- robustly against satellites
and distant particles that pull the centre of mass away -- and a
shrinking-sphere refinement (Power et al. 2003: centre of mass of the
particles within ``R``, ``R`` reduced by 20 % per pass, each pass one masked
reduction) converges on the density peak at the bottom of the well.
"""

from __future__ import annotations

import functools
import math
import os

import dask.array as da
import numpy as np

from ..core.backend import array_module, as_dask_rows, host, resolve_precision
from ..core.errors import ParameterError
from ..core.progress import compute
from ..units.products import input_units
from .dispatch import scf_coefficient_sums, scf_evaluate
from .parameters import (
    CENTER_DEFAULT,
    LMAX_DEFAULT,
    LMAX_LIMIT,
    NMAX_DEFAULT,
    NMAX_LIMIT,
    PRECISION_DEFAULT,
    SCALE_RADIUS_DEFAULT,
    check_center_name,
    check_order,
)
from .particles import _shift, expansion_input
from .scf_kernels import unpack_sums

__all__ = ["SCF", "fit_series", "potential_min_center", "NMAX_LIMIT", "LMAX_LIMIT"]

FORMAT = "cosmo_dask.scf"
#: coefficient attrs ``{name}_units`` and the product_units quantity each is in
UNIT_ATTRS = {"scale_radius": "length", "center": "length", "mass": "mass",
              "G": "gravitational_constant", "potential": "potential",
              "acceleration": "acceleration", "density": "density"}


#: why the orders are bounded (the end of the message of a bad nmax or lmax)
_ORDER_LIMITS = ("; the limits keep the coefficients (2 (nmax+1) (lmax+1)^2 float64, 1.1 MB "
                 "at nmax=64, lmax=32) and the per-particle cost (nmax+1)(lmax+1)(lmax+2)/2 "
                 "terms bounded")


def _float32_ok(nmax: int, lmax: int) -> bool:
    """Largest Gegenbauer value C_nmax^(2 lmax + 3/2)(1) must stay far below float32's max."""
    from scipy.special import gammaln

    a2 = 2 * (2 * lmax + 1.5)
    log_c = gammaln(nmax + a2) - gammaln(nmax + 1) - gammaln(a2)
    return log_c < math.log(1e30)


class SCF:
    """Self-consistent field expansion of an isolated particle system.

    Parameters
    ----------
    nmax, lmax : int
        Radial and angular orders, ``0 <= nmax <= 64``, ``0 <= lmax <= 32``.
        ``(nmax+1)(lmax+1)(lmax+2)/2`` terms (308 for 10, 6); coefficient arrays
        are ``(nmax+1, lmax+1, lmax+1)`` (gala's layout; ``m > l`` entries are 0).
    scale_radius : float
        Hernquist scale radius ``r_s`` of the basis (> 0), in position units.
    center : "com", "potential_min" or (x, y, z)
        Expansion centre: centre of mass, the potential minimum found by
        :func:`potential_min_center` (distributed,
        a few low-order SCF passes) or a fixed point.
    precision : "float64" or "float32"
        Working precision of positions and kernels (inputs are cast). CPU
        kernels compute in float64 internally either way (float32 only rounds
        inputs and outputs); GPU kernels compute in the working precision.
        Measured float32 vs float64 acceleration error (Hernquist, N = 1e5,
        nmax=10, lmax=6, at the particles, ``python -m benchmarks
        expansion --precision-check``): CPU median 3.9e-8, 90th percentile 7.3e-8, 99th
        1.1e-7, max 1.7e-7 relative (rounding of the float32 positions and
        results only); see :mod:`~cosmo_dask.expansion.scf_kernels_gpu` for the
        GPU figures (float32 arithmetic). float32 is refused where the
        Gegenbauer polynomials could overflow (large nmax with large lmax).
    split_every : int, optional
        Fan-in of the coefficient tree reduction (dask default when None).
    noise_cut : float, optional
        If given, :meth:`fit` applies :meth:`truncate` with this ``k``.

    Attributes
    ----------
    coefficients : xarray.DataArray
        Dims ``(n, l, m, part)`` with ``part = ["cos", "sin"]`` (gala's ``Snlm``,
        ``Tnlm``); attrs ``scale_radius``, ``center`` (box frame), ``G``,
        ``mass`` (total), ``n_particles``, ``nmax``, ``lmax``, ``precision``.
        The coefficients are dimensionless (``units="1"``): the potential is
        ``G mass / scale_radius`` times their sum over the basis. The units of
        the rest are attrs too (:func:`~cosmo_dask.units.products.product_units`
        of the fitted snapshot's units): ``scale_radius_units``,
        ``center_units``, ``mass_units``, ``G_units``, and those of what
        :meth:`potential` (``potential_units``, velocity^2),
        :meth:`accelerations` (``acceleration_units``, velocity^2 / length)
        and :meth:`density` (``density_units``) return; mass / length and
        mass / length^2 marked "(G = 1)" when neither ``fit(G=)`` nor the
        snapshot gave G.
    variance : xarray.DataArray
        Same layout: ``sum_k a_k^2 - A^2 / N`` for ``A = sum_k a_k`` over
        particles (the sampling variance of each coefficient; ``units="1"``).

    Notes
    -----
    Cost: fit ``O(N (nmax+1)(lmax+1)(lmax+2)/2)`` plus one reduction of
    ``4 (nmax+1)(lmax+1)^2`` floats per chunk; evaluation about three times the
    fit's per-particle work for accelerations. With a given centre the input is
    read once (the input checks ride along with the sums); with ``"com"`` twice
    (checks and COM, then the sums); ``"potential_min"`` adds 2-3 low-order fit
    + evaluation passes.
    """

    def __init__(self, nmax: int = NMAX_DEFAULT, lmax: int = LMAX_DEFAULT, *,
                 scale_radius: float = SCALE_RADIUS_DEFAULT, center=CENTER_DEFAULT,
                 precision=PRECISION_DEFAULT, split_every: int | None = None,
                 noise_cut: float | None = None):
        self.nmax = check_order(nmax, "nmax", NMAX_LIMIT, "SCF", _ORDER_LIMITS)
        self.lmax = check_order(lmax, "lmax", LMAX_LIMIT, "SCF", _ORDER_LIMITS)
        try:
            rs = float(scale_radius)
        except (TypeError, ValueError):
            rs = float("nan")
        if not (math.isfinite(rs) and rs > 0):
            raise ParameterError(f"SCF: scale_radius must be a positive finite number, got "
                                 f"{scale_radius!r}")
        self.scale_radius = rs
        self.dtype = resolve_precision(precision)
        if self.dtype == np.float32 and not _float32_ok(self.nmax, self.lmax):
            raise ParameterError(f"SCF: precision='float32' with nmax={self.nmax}, "
                                 f"lmax={self.lmax} could overflow float32 in the Gegenbauer "
                                 "polynomials; use precision='float64' or lower orders")
        if isinstance(center, str):
            check_center_name(center, "SCF", "(x, y, z)")
        else:
            c = np.asarray(center, dtype=np.float64) if not callable(center) else None
            if c is not None and (c.shape != (3,) or not np.all(np.isfinite(c))):
                raise ParameterError(f"SCF: center must be 3 finite numbers, got {center!r}")
        self.center = center
        if split_every is not None and (not isinstance(split_every, (int, np.integer))
                                        or split_every < 2):
            raise ParameterError(f"SCF: split_every must be an integer >= 2, got {split_every!r}")
        self.split_every = split_every
        if noise_cut is not None and not (float(noise_cut) >= 0):
            raise ParameterError(f"SCF: noise_cut must be >= 0, got {noise_cut!r}")
        self.noise_cut = noise_cut
        self.coefficients = None
        self.variance = None

    # ------------------------------------------------------------------ fitting
    def fit(self, snap_or_pos, mass=None, *, G=None) -> SCF:
        """Fit the coefficients to particles (one pass plus one tree reduction; with
        ``"com"`` or ``"potential_min"`` centres, the centre's passes first).

        Parameters
        ----------
        snap_or_pos : Snapshot or array (N, 3)
            NumPy, CuPy or dask positions (box frame), or a snapshot.
        mass : array (N,) or float, optional
            Required with raw positions.
        G : float, optional
            Default: the snapshot's ``G``, else 1.

        Returns
        -------
        self
        """
        center = self.center
        if isinstance(center, str) and center == "potential_min":
            def center(pos, m):
                return potential_min_center(pos, m, 1.0, scale_radius=self.scale_radius)
        inp = expansion_input(snap_or_pos, mass, center=center, G=G,
                              precision=self.dtype.name, what="SCF", defer_checks=True)
        pos = inp.pos.rechunk({1: 3})
        nmax, lmax, rs = self.nmax, self.lmax, self.scale_radius
        k = 4 * (nmax + 1) * (lmax + 1) ** 2 + 2
        xp = array_module(pos)
        parts = da.blockwise(
            _fit_block, "ik", pos, "ij", inp.mass, "i", new_axes={"k": k},
            adjust_chunks={"i": 1}, concatenate=True, dtype=np.float64,
            meta=xp.empty((0, 0), dtype=np.float64), nmax=nmax, lmax=lmax, r_s=rs)
        # one chunk: its sums are the total (no reduction to build and run)
        one = parts.numblocks[0] == 1
        total = parts if one else parts.sum(axis=0, split_every=self.split_every)
        vec, *checks = compute(total, *inp.checks, label="SCF coefficients")  # one pass
        if checks:
            inp.verify(checks)
        vec = np.asarray(host(vec), dtype=np.float64).reshape(k)
        if one:
            vec = vec + 0.0  # -0.0 to +0.0, as the sum over one row gives
        sums, msum, count = unpack_sums(vec, nmax, lmax)
        coef = np.stack([sums[0], sums[1]], axis=-1) / msum
        sq = np.stack([sums[2], sums[3]], axis=-1) / msum**2
        var = np.maximum(sq - coef**2 / count, 0.0)
        pu = input_units(snap_or_pos, G)
        attrs = {
            "scale_radius": rs, "center": [float(v) for v in inp.center], "G": inp.G,
            "mass": msum, "n_particles": int(count), "nmax": nmax, "lmax": lmax,
            "precision": self.dtype.name, "convention": "gala SCFPotential(m=mass, r_s, "
            "Snlm=part cos, Tnlm=part sin); Hernquist & Ostriker (1992) basis",
            **{f"{name}_units": pu[q] for name, q in UNIT_ATTRS.items()},
        }
        if inp.source:
            attrs["source"] = str(inp.source)
        self._set(coef, var, attrs)
        if self.noise_cut is not None:
            self._zero_noise(float(self.noise_cut))
        return self

    def _set(self, coef, var, attrs):
        attrs = dict({k: v for k, v in attrs.items() if k != "units"}, units="1")
        # copies of one empty DataArray per orders: its coordinates and their indexes are
        # built once (building them is most of the cost of a DataArray), attrs are own
        coefficients = _coefficient_template(self.nmax, self.lmax).copy(data=coef, deep=False)
        coefficients.attrs, coefficients.name = attrs, "coefficients"
        variance = coefficients.copy(data=var, deep=False)
        variance.attrs, variance.name = dict(attrs), "variance"
        self.coefficients, self.variance = coefficients, variance

    def _zero_noise(self, k: float):
        keep = np.abs(self.coefficients.values) >= k * np.sqrt(self.variance.values)
        self.coefficients = self.coefficients.where(keep, 0.0)
        self.coefficients.attrs["noise_cut"] = k

    def truncate(self, k: float) -> SCF:
        """A copy with every coefficient whose ``|A| < k sigma_A`` set to zero.

        ``sigma_A`` is the square root of :attr:`variance`. Cost O(coefficients).
        """
        self._require_fit()
        if not (float(k) >= 0):
            raise ParameterError(f"SCF.truncate: k must be >= 0, got {k!r}")
        new = self._copy()
        new._zero_noise(float(k))
        return new

    def _copy(self) -> SCF:
        new = object.__new__(SCF)
        new.__dict__.update(self.__dict__)
        new.coefficients = self.coefficients.copy(deep=True)
        new.variance = self.variance.copy(deep=True)
        return new

    def _require_fit(self):
        if self.coefficients is None:
            raise ParameterError("SCF: not fitted yet; call .fit(...) or SCF.from_zarr(path)")

    # ------------------------------------------------------------------ properties
    @property
    def center_(self) -> np.ndarray:
        """The fitted centre (box frame), float64 (3,)."""
        self._require_fit()
        return np.asarray(self.coefficients.attrs["center"], dtype=np.float64)

    @property
    def S(self) -> np.ndarray:
        """gala's ``Snlm`` (cos coefficients), float64 (nmax+1, lmax+1, lmax+1)."""
        self._require_fit()
        return np.ascontiguousarray(self.coefficients.values[..., 0])

    @property
    def T(self) -> np.ndarray:
        """gala's ``Tnlm`` (sin coefficients)."""
        self._require_fit()
        return np.ascontiguousarray(self.coefficients.values[..., 1])

    # ------------------------------------------------------------------ evaluation
    def _eval(self, pos, what: str) -> da.Array:
        from ..store.snapshot import Snapshot

        self._require_fit()
        if isinstance(pos, Snapshot):
            pos = pos.pos
        pos = as_dask_rows(pos)
        if pos.ndim != 2 or pos.shape[1] != 3:
            raise ParameterError(f"SCF.{what}: positions must have shape (N, 3), got {pos.shape}")
        pos = pos.rechunk({1: 3})
        a = self.coefficients.attrs
        pos64 = pos.astype(np.float64)
        rel = pos64.map_blocks(_shift, self.center_, dtype=np.float64, meta=pos64._meta)
        rel = rel.astype(self.dtype)
        gm = a["G"] * a["mass"] if what != "density" else a["mass"]
        vector = what == "acceleration"
        xp = array_module(rel)
        kwargs = dict(S=self.S, T=self.T, r_s=self.scale_radius, GM=gm, what=what,
                      dtype=self.dtype, meta=xp.empty((0, 3) if vector else (0,),
                                                      dtype=self.dtype))
        if vector:
            return rel.map_blocks(_eval_block, **kwargs)
        return rel.map_blocks(_eval_block, drop_axis=1, **kwargs)

    def accelerations(self, pos) -> da.Array:
        """Accelerations ``-grad Phi`` at ``pos`` (N, 3), box frame (as the fit input).

        Accepts NumPy, CuPy or dask arrays or a Snapshot; returns a dask array
        (N, 3) chunked like the input rows, in the working precision. Maps over
        chunks with the coefficients (``2 (nmax+1)(lmax+1)^2`` float64, 8.6 kB
        for 10, 6) in every task. Cost ``O(N (nmax+1)(lmax+1)^2)``. Unit:
        ``coefficients.attrs["acceleration_units"]``.
        """
        return self._eval(pos, "acceleration")

    def potential(self, pos) -> da.Array:
        """Potential at ``pos`` (N,), same conventions as :meth:`accelerations`; unit
        ``coefficients.attrs["potential_units"]``."""
        return self._eval(pos, "potential")

    def density(self, pos) -> da.Array:
        """Density at ``pos`` (N,) (mass / length^3: ``coefficients.attrs["density_units"]``);
        ``+-inf`` exactly at the centre when the ``l = 0`` sum is non-zero (the basis
        has the Hernquist ``1/r`` cusp)."""
        return self._eval(pos, "density")

    # ------------------------------------------------------------------ storage
    def to_zarr(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write coefficients, variances and parameters to a Zarr v3 store, atomically.

        Layout: an xarray dataset (``coefficients``, ``variance`` over
        ``n, l, m, part``, each with ``units="1"``) whose attrs hold
        ``format="cosmo_dask.scf"``, ``format_version=1`` and the fit parameters
        with their units (``scale_radius_units``, ...).
        """
        import xarray as xr

        from ..store.atomic import atomic_directory
        from ..store.zarr_write import plain_attrs, store_dataset

        self._require_fit()
        ds = xr.Dataset({"coefficients": self.coefficients, "variance": self.variance})
        ds = ds.drop_vars("part")  # parts are ["cos", "sin"] (no string arrays in the store)
        ds.attrs = {**plain_attrs({k: v for k, v in self.coefficients.attrs.items()
                                   if k != "units"}),
                    "format": FORMAT, "format_version": 1, "split_every": self.split_every}
        for name in ds.data_vars:
            ds[name].attrs = {"units": "1"}
        with atomic_directory(path, overwrite=overwrite, what="SCF store", fmt=FORMAT) as tmp:
            store_dataset(ds, tmp, label=f"writing {path}")
        return str(path)

    @classmethod
    def from_zarr(cls, path: str | os.PathLike) -> SCF:
        """Read a store written by :meth:`to_zarr`."""
        import xarray as xr

        from ..core.errors import SnapshotError
        from ..store.zarr_read import open_product_group, product_store

        open_product_group(path, fmt=FORMAT, what="SCF store")  # format, every chunk there
        try:  # every chunk read is checked against its recorded CRC-32 (product_store)
            ds = xr.open_zarr(product_store(path), consolidated=False, zarr_format=3).load()
        except (FileNotFoundError, OSError, ValueError, KeyError) as exc:
            raise SnapshotError(f"{path}: cannot read an SCF store ({exc})") from exc
        a = dict(ds.attrs)
        if a.get("format") != FORMAT:
            raise SnapshotError(f"{path}: not an SCF store (format={a.get('format')!r})")
        new = cls(int(a["nmax"]), int(a["lmax"]), scale_radius=a["scale_radius"],
                  center=a["center"], precision=a["precision"],
                  split_every=a.get("split_every"))
        attrs = {k: v for k, v in a.items() if k not in ("format", "format_version",
                                                           "split_every")}
        new._set(ds["coefficients"].transpose("n", "l", "m", "part").values,
                 ds["variance"].transpose("n", "l", "m", "part").values, attrs)
        return new

    def __repr__(self) -> str:
        state = "fitted" if self.coefficients is not None else "not fitted"
        return (f"SCF(nmax={self.nmax}, lmax={self.lmax}, scale_radius={self.scale_radius:g}, "
                f"center={self.center!r}, precision={self.dtype.name!r}; {state})")


@functools.lru_cache(maxsize=32)
def _coefficient_template(nmax: int, lmax: int):
    """A zero DataArray with the coefficients' dims and coordinates (never modified: copied
    with the data by :meth:`SCF._set`)."""
    import xarray as xr

    dims = ("n", "l", "m", "part")
    coords = {"n": np.arange(nmax + 1), "l": np.arange(lmax + 1), "m": np.arange(lmax + 1),
              "part": ["cos", "sin"]}
    return xr.DataArray(np.zeros((nmax + 1, lmax + 1, lmax + 1, 2)), dims=dims, coords=coords)


# ---------------------------------------------------------------------- chunk functions
def _fit_block(pos, mass, *, nmax, lmax, r_s):
    return scf_coefficient_sums(pos, mass, nmax, lmax, r_s)[None, :]


def _eval_block(pos, *, S, T, r_s, GM, what):
    return scf_evaluate(pos, S, T, r_s, GM, what)


# ---------------------------------------------------------------------- series
def fit_series(paths, nmax: int = NMAX_DEFAULT, lmax: int = LMAX_DEFAULT, *,
               scale_radius: float = SCALE_RADIUS_DEFAULT,
               center="com", precision="float64", split_every: int | None = None,
               device: str = "cpu", chunks: int | None = None):
    """Fit one SCF per snapshot store; coefficients stacked along ``time``.

    Parameters
    ----------
    paths : sequence of str or path
        Snapshot stores (opened with :func:`cosmo_dask.open_snapshot`).
    nmax, lmax, scale_radius, center, precision, split_every
        As for :class:`SCF` (the same for every snapshot).
    device, chunks
        Passed to :func:`~cosmo_dask.open_snapshot`.

    Returns
    -------
    xarray.DataArray
        Dims ``(time, n, l, m, part)``. ``time`` is the store's ``time``
        attribute when every store has one, else its scale factor when every
        store has one, else the index 0, 1, ... (``attrs["time_from"]`` says
        which); coordinates ``source`` (path), ``center_x``, ``center_y``,
        ``center_z`` (over time) and ``variance`` (same dims as the coefficients).
        Dimensionless (``units="1"``); the ``*_units`` attrs are the first
        snapshot's (as in :attr:`SCF.coefficients`).

    Notes
    -----
    Cost: one SCF fit per store, sequentially (each fit is itself parallel).
    """
    import xarray as xr
    import zarr

    from ..store.snapshot import open_snapshot

    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ParameterError("fit_series: no snapshot paths given")
    fits, times, factors = [], [], []
    for p in paths:
        snap = open_snapshot(p, device=device, chunks=chunks)
        scf = SCF(nmax, lmax, scale_radius=scale_radius, center=center, precision=precision,
                  split_every=split_every).fit(snap)
        fits.append(scf)
        try:
            t = zarr.open_group(p, mode="r").attrs.get("time")
        except Exception:  # noqa: BLE001 - a store without readable attrs has no time
            t = None
        times.append(t)
        factors.append(snap.scale_factor)
    if all(t is not None for t in times):
        time, kind = np.asarray(times, dtype=np.float64), "time attribute"
    elif all(a is not None for a in factors):
        time, kind = np.asarray(factors, dtype=np.float64), "scale_factor"
    else:
        time, kind = np.arange(len(paths)), "index"
    coef = xr.concat([f.coefficients for f in fits], dim="time", combine_attrs="drop")
    var = xr.concat([f.variance for f in fits], dim="time", combine_attrs="drop")
    cen = np.stack([f.center_ for f in fits])
    coef = coef.assign_coords(
        time=time, source=("time", paths),
        variance=var, **{f"center_{ax}": ("time", cen[:, i]) for i, ax in enumerate("xyz")})
    a = fits[0].coefficients.attrs
    coef.attrs = {"scale_radius": a["scale_radius"], "nmax": nmax, "lmax": lmax,
                  "precision": a["precision"], "time_from": kind,
                  "G": [f.coefficients.attrs["G"] for f in fits],
                  "mass": [f.coefficients.attrs["mass"] for f in fits],
                  "convention": a["convention"], "units": "1",
                  **{k: v for k, v in a.items() if k.endswith("_units")}}
    coef.name = "coefficients"
    return coef


# ---------------------------------------------------------------------- centre finder
def _chunk_min(pot, pos):
    xp = array_module(pot)
    out = xp.full((1, 4), np.inf, dtype=np.float64)
    if pot.shape[0]:
        i = int(xp.argmin(pot))
        out[0, 0] = float(pot[i])
        out[0, 1:] = pos[i].astype(np.float64)
    return out


def _argmin_position(pot: da.Array, pos: da.Array) -> np.ndarray:
    """Position of the smallest ``pot`` value: 4 numbers per chunk, then a host argmin."""
    best = da.blockwise(_chunk_min, "ik", pot, "i", pos, "ij", new_axes={"k": 4},
                        adjust_chunks={"i": 1}, concatenate=True, dtype=np.float64,
                        meta=array_module(pos).empty((0, 0), dtype=np.float64))
    (rows,) = compute(best, label=None)
    rows = host(rows)
    return rows[int(np.argmin(rows[:, 0])), 1:].copy()


def potential_min_center(pos, mass, G: float = 1.0, *, iterations: int = 3, nmax: int = 6,
                         lmax: int = 4, scale_radius: float | None = None,
                         start=None, min_count: int = 200) -> np.ndarray:
    """Position of the potential minimum of a particle system (box frame), float64 (3,).

    Parameters
    ----------
    pos : dask array (N, 3)
        Positions in the box frame (NumPy or CuPy chunks).
    mass : dask array (N,)
        Masses, chunked like ``pos`` rows.
    G : float
        Gravitational constant (only scales the potential; the minimum's
        location does not depend on it).
    iterations : int
        Fit / evaluate / recentre passes (>= 1; 3 by default).
    nmax, lmax : int
        Orders of the smoothing SCF (low orders: a smooth potential whose
        minimum tracks the density peak, not individual particles).
    scale_radius : float, optional
        Basis scale radius; default: the median over chunks of the chunks'
        median particle distance from the current centre, divided by
        ``1 + sqrt(2)`` (the Hernquist relation between half-mass and scale
        radius), re-estimated each pass.
    start : (3,), optional
        Starting centre; default the centre of mass.
    min_count : int
        The shrinking-sphere refinement stops before the sphere holds fewer
        than this many particles (200).

    Returns
    -------
    numpy.ndarray (3,)
        The centre of mass of the innermost ``~min_count`` particles around the
        bottom of the potential well (accuracy: the particle spacing there).

    Notes
    -----
    Method: start at the centre of mass, which is pulled off the density peak
    by distant particles or satellites; each pass fits an SCF about the current
    centre, evaluates its potential at every particle and moves the centre to
    the particle with the lowest value; then shrinking spheres from radius
    ``2 r_s``. Cost per argmin pass: one SCF fit and one potential evaluation
    (each ``O(N nmax lmax^2)``), a tree reduction of ``4 (nmax+1)(lmax+1)^2``
    floats and 4 floats per chunk to the client; per shrinking pass one
    ``O(N)`` masked sum (about ``log(N / min_count) / log(1/0.8^3)`` passes,
    ~15 for 1e6 particles); no particle data is gathered.
    """
    if not isinstance(iterations, (int, np.integer)) or iterations < 1:
        raise ParameterError(f"potential_min_center: iterations must be >= 1, got {iterations!r}")
    pos = pos.astype(np.float64)
    mass = mass.astype(np.float64)
    if start is None:
        msum, mx = compute(mass.sum(), (pos * mass[:, None]).sum(axis=0), label=None)
        c = np.asarray(host(mx), dtype=np.float64) / float(host(msum))
    else:
        c = np.asarray(start, dtype=np.float64)
    for _ in range(int(iterations)):
        rs = scale_radius
        if rs is None:
            r = da.sqrt((pos.map_blocks(_shift, c, dtype=np.float64) ** 2).sum(axis=1))
            (meds,) = compute(r.map_blocks(_block_median, chunks=(1,), dtype=np.float64),
                              label=None)
            rs = float(np.nanmedian(np.asarray(host(meds)))) / (1.0 + math.sqrt(2.0))
            if not (rs > 0 and math.isfinite(rs)):
                rs = 1.0
        scf = SCF(nmax, lmax, scale_radius=rs, center=c).fit(pos, mass, G=G)
        c = _argmin_position(scf.potential(pos), pos)
    return _shrinking_sphere(pos, mass, c, 2.0 * rs, min_count)


def _shrinking_sphere(pos, mass, c, radius, min_count, shrink=0.8, max_passes=60):
    """Centre of mass within a sphere shrunk by ``shrink`` per pass until < min_count remain."""
    n = int(pos.shape[0])
    for _ in range(max_passes):
        d2 = (pos.map_blocks(_shift, c, dtype=np.float64) ** 2).sum(axis=1)
        inside = (d2 < radius * radius).astype(np.float64)
        w = mass * inside
        cnt, msum, mx = compute(inside.sum(), w.sum(), (pos * w[:, None]).sum(axis=0),
                                label=None)
        cnt = float(host(cnt))
        if cnt < min(min_count, n):
            break
        c = np.asarray(host(mx), dtype=np.float64) / float(host(msum))
        radius *= shrink
    return c


def _block_median(r):
    xp = array_module(r)
    return xp.median(r).reshape(1).astype(np.float64) if r.shape[0] else xp.full(1, np.nan)


