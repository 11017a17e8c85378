"""Spherical-overdensity masses, radii, profiles and NFW concentrations of haloes.

:func:`spherical_overdensity` measures, around given halo centres of a periodic
snapshot, the mass ``M_Delta`` inside the comoving radius ``R_Delta`` within which
the mean density is ``Delta`` times a reference density:

* ``"200c"``: 200 times the critical density at the snapshot's redshift;
* ``"200m"``: 200 times the mean matter density at that redshift;
* ``"vir"``: Bryan & Norman (1998), ``Delta_c = 18 pi^2 + 82 x - 39 x^2`` with
  ``x = Omega_m(z) - 1``, relative to the critical density.

Conventions
-----------
Positions are comoving; every radius returned (``R_Delta``, ``R_max``, the
profile's ``r``) is **comoving**, in the snapshot's length unit. The overdensity
condition uses the physical density, ``rho_phys = M / (4/3 pi r^3) / a^3``; the
density profile is the comoving mass density (mass per comoving volume,
multiply by ``a^-3`` for physical). Circular velocities use the physical radius,
``V_c = sqrt(G M(<r) / (a r))``.

Algorithm (distributed, no gather of all particles)
---------------------------------------------------
Every particle chunk (one ``so-chunk`` task) builds a periodic
``scipy.spatial.cKDTree`` of its particles and selects, for each halo, those
within the halo's search radius (minimum-image distances). It bins their masses
and counts on a fine per-halo logarithmic radius grid of :data:`N_FINE` bins from
``FINE_RANGE * search_radius`` to the search radius (``dln r = ln(1e4) / 4000 =
0.0023``, a 0.23 % step in radius), plus one bin for everything inside the
grid's inner edge. A chunk returns only the occupied (halo, bin) cells (sparse);
the cells of all chunks are summed in a tree reduction (``so-merge``). ``M(<r)`` at the grid
edges is then exact, and ``R_Delta`` is the outermost crossing of the mean
enclosed density with the threshold, interpolated linearly in ``ln rho`` vs
``ln r`` between two grid edges (error well below 0.1 % in radius).
``M_Delta = Delta rho_ref a^3 4/3 pi R_Delta^3``.

Default search radius: for a FOF catalog, per halo ``3 R_200c,FOF`` where
``R_200c,FOF`` is the radius enclosing the FOF mass at 200 times the critical
density (``R_200m`` and ``R_vir`` are at most ~1.7 ``R_200c`` for Omega_m >= 0.25),
but at least ``1.5 r_max`` (the FOF group's extent). With an array of centres a
``search_radius`` must be given. It must be below half the box.

Derived quantities
------------------
* ``density_profile``: ``n_bins`` logarithmic bins from ``r_min_factor * R_200c``
  (``r_min_factor`` times a third of the search radius when ``R_200c`` is not
  found) to the search radius; the coordinate ``r`` holds the per-halo geometric
  bin centres.
* ``V_max``, ``R_max``: maximum of ``V_c`` on the fine grid, over radii enclosing
  at least :data:`MIN_VMAX_PARTICLES` particles.
* ``c_nfw_fit``: weighted least-squares fit of the NFW mass in each profile bin
  inside ``R_200c`` (``4 pi rho_s r_s^3 [f(r2/r_s) - f(r1/r_s)]``, exact for the
  bin, no bin-centre approximation) to the measured mass, in logarithms, weights
  ``sqrt(N_bin)`` (Poisson); bins with fewer than 10 particles are left out;
  ``c = R_200c / r_s``.
* ``c_vmax``: the root of ``V_max / V_200c = sqrt(A c / f(c))``, ``f(c) = ln(1+c) -
  c/(1+c)``, ``A = f(x_m)/x_m = 0.21639`` at ``x_m = 2.16258`` (the "0.216" of the
  usual relation, to more digits), by bisection on ``c`` in (2.163, 1000); NaN
  when ``V_max <= V_200c`` (no NFW solution).

Densities: the critical density today ``RHO_CRIT_1E10`` (1e10 Msun/h per
(Mpc/h)^3) converted into the snapshot's units (a snapshot without ``units`` is
taken to be in Mpc/h, km/s, 1e10 Msun/h). ``G`` is the snapshot's, else the
value of its units.
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr
from dask.base import tokenize

from ..core.backend import host
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from ..models.cosmology import Cosmology
from ..models.zeldovich_ics import RHO_CRIT_1E10, ZELDOVICH_UNITS
from ..store.validation import wrap_into_box
from ..units import factor, gravitational_constant
from ..units.products import product_units
from .parameters import (
    DELTAS,
    SO_CENTERS,
    SO_N_BINS_DEFAULT,
    SO_R_MIN_FACTOR_DEFAULT,
    check_deltas,
    check_so_profile,
)

__all__ = ["spherical_overdensity", "check_deltas", "check_parameters", "bryan_norman_delta",
           "nfw_f", "c_from_vmax_ratio", "DELTAS", "N_FINE", "FINE_RANGE"]

#: fine radial grid: bins per halo and its inner edge as a fraction of the search radius
N_FINE = 4000
FINE_RANGE = 1e-4
#: V_max is searched over radii enclosing at least this many particles
MIN_VMAX_PARTICLES = 100
#: NFW: V_c peaks at x_m r_s; A = f(x_m) / x_m
NFW_XMAX = 2.162581587


def nfw_f(x):
    """``f(x) = ln(1 + x) - x / (1 + x)`` (NFW enclosed mass / (4 pi rho_s r_s^3))."""
    x = np.asarray(x, dtype=np.float64)
    return np.log1p(x) - x / (1.0 + x)


NFW_A = float(nfw_f(NFW_XMAX) / NFW_XMAX)


def bryan_norman_delta(omega_m_z: float) -> float:
    """Bryan & Norman (1998) virial overdensity relative to critical (flat universe)."""
    x = float(omega_m_z) - 1.0
    return 18.0 * math.pi**2 + 82.0 * x - 39.0 * x * x


def c_from_vmax_ratio(ratio: float, lo: float = NFW_XMAX + 1e-6, hi: float = 1000.0,
                      iterations: int = 200) -> float:
    """NFW concentration with ``V_max / V_200 = ratio``, by bisection; NaN if none in range."""
    def g(c):
        return math.sqrt(NFW_A * c / float(nfw_f(c)))

    if not (np.isfinite(ratio) and g(lo) < ratio < g(hi)):
        return float("nan")
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if g(mid) < ratio:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * hi:
            break
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------ per-chunk kernel
def _chunk_cells(pos, mass, centres, radii, box, particle_mass):
    """Sparse (key, mass, count) cells of one chunk; key = halo * (N_FINE + 1) + bin."""
    from scipy.spatial import cKDTree

    pos = np.asarray(host(pos), dtype=np.float64)  # CuPy chunks: the search runs on the host
    if mass is not None:
        mass = host(mass)
    empty = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
    if pos.shape[0] == 0:
        return empty
    p = wrap_into_box(pos, box)
    tree = cKDTree(p, boxsize=box)
    lists = tree.query_ball_point(centres, radii)
    lens = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    if lens.sum() == 0:
        return empty
    idx = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists if len(x)])
    halo = np.repeat(np.arange(len(lists), dtype=np.int64), lens)
    d = p[idx] - centres[halo]
    d -= box * np.round(d / box)
    r = np.sqrt(np.einsum("ij,ij->i", d, d))
    keep = r < radii[halo]
    halo, idx, r = halo[keep], idx[keep], r[keep]
    m = (np.full(idx.shape, particle_mass) if mass is None
         else np.asarray(mass, dtype=np.float64)[idx])
    r_lo = FINE_RANGE * radii[halo]
    with np.errstate(divide="ignore"):
        t = np.log(r / r_lo) / (-math.log(FINE_RANGE)) * N_FINE
    b = np.where(r < r_lo, 0, np.floor(np.nan_to_num(t, neginf=0.0)).astype(np.int64) + 1)
    b = np.clip(b, 0, N_FINE)
    return _merge_cells([(halo * (N_FINE + 1) + b, m, np.ones(m.shape, np.int64))])


def _merge_cells(parts):
    keys = np.concatenate([p[0] for p in parts])
    if keys.size == 0:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    uniq, inv = np.unique(keys, return_inverse=True)
    mass = np.bincount(inv, weights=np.concatenate([p[1] for p in parts]), minlength=uniq.size)
    cnt = np.bincount(inv, weights=np.concatenate([p[2] for p in parts]), minlength=uniq.size)
    return uniq, mass, np.rint(cnt).astype(np.int64)


def _merge(*parts):
    return _merge_cells(parts)


# ------------------------------------------------------------------ inputs
def _centres(catalog, center):
    if isinstance(catalog, xr.Dataset):
        name = SO_CENTERS.get(str(center))
        if name is None:
            raise ParameterError(f"spherical_overdensity: unknown center {center!r}; use one of "
                                 "'mbp', 'mcp', 'com'")
        if name not in catalog:
            raise ParameterError(f"spherical_overdensity: the catalog has no {name!r} for "
                                 f"center={center!r}; its variables: {list(catalog.data_vars)}")
        return np.asarray(catalog[name].values, dtype=np.float64)
    c = np.asarray(catalog, dtype=np.float64)
    if c.ndim == 1 and c.shape == (3,):
        c = c[None, :]
    if c.ndim != 2 or c.shape[1] != 3:
        raise ParameterError("spherical_overdensity: catalog must be a FOF catalog Dataset or "
                             f"an (M, 3) array of centres, got shape {c.shape}")
    return c


def _densities(snap):
    """(rho_crit0 in snapshot units, G, Cosmology, a, units dict)."""
    if snap.box_size is None:
        raise ParameterError("spherical_overdensity: needs a periodic snapshot (box_size); "
                             "this one is isolated")
    a = snap.scale_factor
    if a is None or not a > 0:
        raise ParameterError("spherical_overdensity: the snapshot has no scale_factor; the "
                             "reference densities depend on the redshift")
    if snap.cosmology is None:
        raise ParameterError("spherical_overdensity: the snapshot has no cosmology "
                             "(Omega_m, Omega_L, h) to give the reference densities")
    cosmo = Cosmology.coerce({k: v for k, v in snap.cosmology.items() if v is not None})
    units = dict(snap.units) if snap.units else dict(ZELDOVICH_UNITS)
    try:
        fm = factor(ZELDOVICH_UNITS["mass"], units["mass"], "mass", h=cosmo.h)
        fl = factor(ZELDOVICH_UNITS["length"], units["length"], "length", h=cosmo.h)
    except (ParameterError, KeyError) as err:
        raise ParameterError("spherical_overdensity: cannot express the critical density in "
                             f"the snapshot's units {units}: {err}") from None
    G = snap.G if snap.G is not None else gravitational_constant(units, h=cosmo.h)  # noqa: N806
    if G is None:
        raise ParameterError("spherical_overdensity: the snapshot gives no G and its units "
                             f"{units} do not fix one")
    return RHO_CRIT_1E10 * fm / fl**3, float(G), cosmo, float(a), snap.units


def _checked(snap, deltas) -> tuple[tuple[str, ...], tuple]:
    """(the deltas as a tuple, :func:`_densities` of ``snap``), or ParameterError."""
    deltas = check_deltas(deltas)
    densities = _densities(snap)
    if snap.mass is None and snap.particle_mass is None:
        raise ParameterError("spherical_overdensity: the snapshot has no masses")
    return deltas, densities


def check_parameters(snap, deltas=DELTAS) -> tuple[str, ...]:
    """Raise ParameterError for what :func:`spherical_overdensity` cannot do with ``snap``
    and ``deltas``, reading no particle data: an unknown, repeated or empty ``deltas``; a
    snapshot without a box (isolated), scale factor, cosmology or masses, or whose units
    do not fix the critical density. Returns the deltas as a tuple."""
    return _checked(snap, deltas)[0]


def _thresholds(deltas, cosmo, a, rho_c0):
    """Comoving mean-density thresholds of each (checked) delta."""
    rho_crit = rho_c0 * float(cosmo.E(a)) ** 2  # physical
    rho_mean = cosmo.Omega_m * rho_c0 / a**3     # physical
    phys = {"200c": 200.0 * rho_crit, "200m": 200.0 * rho_mean,
            "vir": bryan_norman_delta(float(cosmo.Omega_m_of_a(a))) * rho_crit}
    return deltas, {d: phys[d] * a**3 for d in deltas}


def _radius_crossing(edges, menc, threshold):
    """Outermost radius where the mean enclosed density falls to ``threshold``."""
    vol = 4.0 / 3.0 * math.pi * edges**3
    rho = menc / vol
    above = np.nonzero(rho >= threshold)[0]
    if above.size == 0 or above[-1] == edges.size - 1:
        return float("nan")
    i = above[-1]
    y0, y1 = math.log(rho[i]), math.log(rho[i + 1]) if rho[i + 1] > 0 else -np.inf
    if not np.isfinite(y1):
        return float(edges[i])
    lt = math.log(threshold)
    f = (y0 - lt) / (y0 - y1)
    return float(math.exp(math.log(edges[i]) + f * math.log(edges[i + 1] / edges[i])))


def _nfw_fit(edges, dm, dn, r200):
    from scipy.optimize import least_squares

    use = (dn >= 10) & (edges[1:] <= r200 * (1 + 1e-9)) & (dm > 0)
    if use.sum() < 3 or not np.isfinite(r200):
        return float("nan")
    r1, r2 = edges[:-1][use], edges[1:][use]
    lm, w = np.log(dm[use]), np.sqrt(dn[use])

    def resid(p):
        ln_norm, ln_rs = p
        rs = math.exp(ln_rs)
        shell = nfw_f(r2 / rs) - nfw_f(r1 / rs)
        return (lm - ln_norm - np.log(np.maximum(shell, 1e-300))) * w

    rs0 = r200 / 5.0
    shell0 = nfw_f(r2 / rs0) - nfw_f(r1 / rs0)
    p0 = [float(np.mean(lm - np.log(shell0))), math.log(rs0)]
    sol = least_squares(resid, p0, method="lm")
    if not sol.success:
        return float("nan")
    return float(r200 / math.exp(sol.x[1]))


# ------------------------------------------------------------------ main
def spherical_overdensity(snap, catalog, deltas=DELTAS, center="mbp", *,
                          n_bins=SO_N_BINS_DEFAULT, r_min_factor=SO_R_MIN_FACTOR_DEFAULT,
                          search_radius=None) -> xr.Dataset:
    """Spherical-overdensity masses and radii, profiles, V_max and NFW concentrations.

    Parameters
    ----------
    snap : Snapshot
        Periodic snapshot with ``scale_factor`` and ``cosmology``; masses from its
        ``mass`` array or ``particle_mass``.
    catalog : xarray.Dataset or array_like
        A FOF catalog (:func:`cosmo_dask.halos.fof`, dimension ``halo``) or an (M, 3)
        array of centres in the snapshot's length unit, inside ``[0, box_size]``.
    deltas : sequence of str
        Any of ``"200c"``, ``"200m"``, ``"vir"``.
    center : str
        Catalog centre: ``"mbp"`` (``mbp_position``), ``"mcp"`` (``mcp_position``) or
        ``"com"`` (``center_of_mass``); ignored for an array of centres.
    n_bins : int
        Bins of the density profile.
    r_min_factor : float
        Inner edge of the profile, in units of ``R_200c``.
    search_radius : float or array_like, optional
        Comoving radius (scalar or per halo) within which particles are collected;
        default from the catalog (module docstring); required for array centres.

    Returns
    -------
    xarray.Dataset
        Over ``halo``: ``M_<delta>``, ``R_<delta>`` (comoving), ``V_max``, ``R_max``,
        ``c_nfw_fit``, ``c_vmax``, ``search_radius``, and ``density_profile``
        (``halo``, ``r_bin``, comoving mass density) with coordinate ``r`` (``halo``,
        ``r_bin``); each with ``units``; attrs ``deltas``, ``center``, ``redshift``.
        Quantities that cannot be measured (threshold not crossed inside the search
        radius) are NaN.
    """
    # the deltas first, then the snapshot
    deltas, (rho_c0, G, cosmo, a, snap_units) = _checked(snap, deltas)  # noqa: N806
    deltas, thresholds = _thresholds(deltas, cosmo, a, rho_c0)
    box = float(snap.box_size)
    n_bins, r_min_factor = check_so_profile(n_bins, r_min_factor)
    centres = _centres(catalog, center)
    n_halo = centres.shape[0]
    if not np.all(np.isfinite(centres)) or np.any(centres < 0) or np.any(centres > box):
        raise ParameterError(f"spherical_overdensity: halo centres must lie inside the box "
                             f"[0, {box}]")
    centres = np.mod(centres, box)
    centres[centres >= box] = 0.0
    radii = _search_radii(search_radius, catalog, n_halo, rho_c0, a, cosmo, box)
    pu = product_units(snap_units or ZELDOVICH_UNITS)

    if n_halo:
        pm = snap.particle_mass
        token = tokenize(snap.pos, snap.mass, pm, centres, radii, box)
        g = TaskGraph([snap.pos] + ([snap.mass] if snap.mass is not None else []))
        parts = [g.add((f"so-chunk-{token}", i), _chunk_cells, g.chunk(snap.pos, i, 0),
                       None if snap.mass is None else g.chunk(snap.mass, i),
                       centres, radii, box, pm)
                 for i in range(snap.pos.numblocks[0])]
        level = 0
        while len(parts) > 1:  # a tree of sums, 8 at a time
            parts = [g.add((f"so-merge-{token}", level, i), _merge, *parts[i:i + 8])
                     for i in range(0, len(parts), 8)]
            level += 1
        (keys, cmass, ccount), = g.compute([parts[0].key], label="spherical overdensity")
    else:
        keys, cmass, ccount = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)

    out = {f"{k}_{d}": np.full(n_halo, np.nan) for d in deltas for k in ("M", "R")}
    for k in ("V_max", "R_max", "c_nfw_fit", "c_vmax"):
        out[k] = np.full(n_halo, np.nan)
    prof = np.full((n_halo, n_bins), np.nan)
    rcen = np.full((n_halo, n_bins), np.nan)
    nf1 = N_FINE + 1
    halo_of = keys // nf1
    bounds = np.searchsorted(halo_of, np.arange(n_halo + 1))
    thr_200c = rho_c0 * float(cosmo.E(a)) ** 2 * 200.0 * a**3
    for h in range(n_halo):
        sl = slice(bounds[h], bounds[h + 1])
        dm, dn = np.zeros(nf1), np.zeros(nf1, np.int64)
        dm[keys[sl] % nf1] = cmass[sl]
        dn[keys[sl] % nf1] = ccount[sl]
        edges = radii[h] * np.logspace(math.log10(FINE_RANGE), 0.0, nf1)
        menc, nenc = np.cumsum(dm), np.cumsum(dn)
        for d in deltas:
            r = _radius_crossing(edges, menc, thresholds[d])
            out[f"R_{d}"][h] = r
            out[f"M_{d}"][h] = thresholds[d] * 4.0 / 3.0 * math.pi * r**3
        r200 = _radius_crossing(edges, menc, thr_200c)
        m200 = thr_200c * 4.0 / 3.0 * math.pi * r200**3
        # V_max on the fine grid
        ok = nenc >= MIN_VMAX_PARTICLES
        if ok.any():
            vc = np.sqrt(G * menc[ok] / (a * edges[ok]))
            i = int(np.argmax(vc))
            out["V_max"][h], out["R_max"][h] = vc[i], edges[ok][i]
            if np.isfinite(r200):
                v200 = math.sqrt(G * m200 / (a * r200))
                out["c_vmax"][h] = c_from_vmax_ratio(vc[i] / v200)
        # profile bins
        r_in = r_min_factor * (r200 if np.isfinite(r200) else radii[h] / 3.0)
        pe = np.geomspace(r_in, radii[h], n_bins + 1)
        lfe = np.log(edges)
        mpe = np.interp(np.log(pe), lfe, menc)
        npe = np.interp(np.log(pe), lfe, nenc.astype(np.float64))
        pm_bin, pn_bin = np.diff(mpe), np.diff(npe)
        prof[h] = pm_bin / (4.0 / 3.0 * math.pi * np.diff(pe**3))
        rcen[h] = np.sqrt(pe[:-1] * pe[1:])
        out["c_nfw_fit"][h] = _nfw_fit(pe, pm_bin, pn_bin, r200)

    unit_of = {"M": pu["mass"], "R": pu["length"]}
    data = {}
    for d in deltas:
        for k in ("M", "R"):
            data[f"{k}_{d}"] = ("halo", out[f"{k}_{d}"], {"units": unit_of[k]})
    data["V_max"] = ("halo", out["V_max"], {"units": pu["velocity"]})
    data["R_max"] = ("halo", out["R_max"], {"units": pu["length"]})
    data["c_nfw_fit"] = ("halo", out["c_nfw_fit"], {"units": pu["dimensionless"]})
    data["c_vmax"] = ("halo", out["c_vmax"], {"units": pu["dimensionless"]})
    data["search_radius"] = ("halo", radii, {"units": pu["length"]})
    data["density_profile"] = (("halo", "r_bin"), prof,
                               {"units": pu["density"], "comoving": 1})
    coords = {"r": (("halo", "r_bin"), rcen, {"units": pu["length"], "comoving": 1})}
    if isinstance(catalog, xr.Dataset) and "halo" in catalog.coords:
        coords["halo"] = catalog["halo"].values
    attrs = {"deltas": list(deltas), "center": str(center) if isinstance(catalog, xr.Dataset)
             else "given", "redshift": 1.0 / a - 1.0, "scale_factor": a,
             "radii": "comoving", "fine_bins": N_FINE, "fine_range": FINE_RANGE}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _search_radii(search_radius, catalog, n_halo, rho_c0, a, cosmo, box):
    if search_radius is None:
        if not isinstance(catalog, xr.Dataset) or "mass" not in catalog:
            raise ParameterError("spherical_overdensity: give search_radius with an array of "
                                 "centres (or a catalog with 'mass')")
        rho200 = 200.0 * rho_c0 * float(cosmo.E(a)) ** 2 * a**3
        mass = np.asarray(catalog["mass"].values, dtype=np.float64)
        r = 3.0 * np.cbrt(3.0 * mass / (4.0 * math.pi * rho200))
        if "r_max" in catalog:
            r = np.maximum(r, 1.5 * np.asarray(catalog["r_max"].values, dtype=np.float64))
        r = np.minimum(r, 0.499 * box)
    else:
        r = np.broadcast_to(np.asarray(search_radius, dtype=np.float64), (n_halo,)).copy()
    if not np.all(np.isfinite(r)) or np.any(r <= 0) or np.any(r >= 0.5 * box):
        raise ParameterError("spherical_overdensity: search_radius must be > 0 and below half "
                             f"the box ({0.5 * box})")
    return r
