"""Halo occupation distribution (HOD) galaxy mocks on a halo catalog.

:func:`populate_hod` puts galaxies into the halos of a catalog (:func:`cosmo_dask.halos.fof`,
with spherical-overdensity masses when ``cosmo-dask halos --so`` added them) following
the occupation of Zheng et al. (2007, ApJ 667, 760), with halo masses ``M`` in Msun/h:

* centrals: ``<Ncen> = 0.5 [1 + erf((log10 M - logMmin) / sigma_logM)]``, a Bernoulli draw;
* satellites: ``<Nsat> = <Ncen> ((M - M0) / M1)^alpha`` for ``M > M0`` (else 0), with
  ``M0 = 10^logM0``, ``M1 = 10^logM1``, a Poisson draw (independent of the central's).

Mass definition: ``mass=None`` takes the first of ``M_vir``, ``M_200m``, ``M_200c`` (the
spherical-overdensity masses) the catalog holds, else the FOF ``mass``; it is converted
from the catalog's mass unit to Msun/h. A halo whose mass is NaN (an SO radius not
found) gets no galaxy.

Placement. A central sits at the halo centre (``mbp_position``, else ``mcp_position``,
else ``center_of_mass``) with the halo's bulk ``velocity``. Satellites

* ``satellites="particles"``: on member particles drawn uniformly (with replacement) out
  of the halo's members, with their positions and velocities. The members are the
  snapshot's particles whose FOF label is the halo, so this needs a
  :class:`~cosmo_dask.halos.HaloResult` (its ``labels``) and its snapshot;
* ``satellites="nfw"``: on an NFW profile truncated at the halo radius ``R``: ``R_<delta>``
  of the SO mass used, or for the FOF mass the comoving ``R_200m`` that mass implies
  (``M = 200 Omega_m rho_crit,0 4/3 pi R^3``). Concentration: ``c_nfw_fit`` of the catalog
  (measured against ``R_200c``, rescaled to ``R`` as ``c R / R_200c``) where finite,
  else the Duffy et al. (2008, MNRAS 390, L64) relation of Table 1's full sample
  (0 < z < 2) for that definition: ``c = A (M / 2e12 Msun/h)^B (1 + z)^C`` with (A, B, C)
  = (5.71, -0.084, -0.47) for 200c, (7.85, -0.081, -0.71) for vir and (10.14, -0.081,
  -1.01) for 200m (the FOF mass too). Radii are drawn from the inverse of the enclosed
  mass ``f(x) = ln(1 + x) - x / (1 + x)``, ``x = -1 / W0(-exp(-1 - u f(c))) - 1``
  (Lambert's W; u uniform), directions isotropic. Velocities: the halo's bulk velocity
  plus an isotropic Gaussian of 1D dispersion ``sigma = V_Delta / sqrt(2)``, ``V_Delta =
  sqrt(G M / (a R))`` (a singular isothermal sphere's, the circular velocity at ``R``,
  physical radius ``a R``).

Reproducibility and distribution. Halos are cut into fixed blocks of :data:`HOD_BLOCK`
rows; block ``b`` draws every random number of its halos (centrals, satellite counts,
member ranks or NFW radii, directions and velocities) from
``block_rng(seed, b, HOD_STREAM_TAG)`` (the models' generation blocks,
:mod:`cosmo_dask.models.blocks`), one dask task per block. With ``satellites="particles"`` one task
per particle chunk counts each halo's members there, and one per chunk picks the chosen
members (the k-th member of a halo in particle order), so the mock depends on the seed
only, not on the chunking of the snapshot.

The work is O(halos + galaxies) random draws and, for particles, one pass over the
labels: it stays on the CPU (CuPy chunks of the snapshot are copied to the host in the
member tasks); the galaxies are a NumPy-backed Snapshot (``to_device("gpu")`` moves them).
"""

from __future__ import annotations

import math
import os

import numpy as np
import xarray as xr
from dask.base import tokenize

from ..core.backend import host
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from ..models.blocks import block_rng, isotropic_directions
from ..units import factor, gravitational_constant
from .parameters import HOD_MASSES, check_hod

__all__ = ["populate_hod", "hod_masses", "nfw_halo_parameters", "mean_occupation",
           "plot_occupation",
           "zheng07_mean_occupation", "duffy08_concentration", "nfw_radius_quantile",
           "HOD_BLOCK"]

#: halos per generation block (fixed: changing it changes every mock)
HOD_BLOCK = 2**14
#: the stream tag of HOD mocks in ``SeedSequence([seed, block, tag])`` (the models'
#: generators use 1, 2, ...; this one stays clear of them)
HOD_STREAM_TAG = 0x484F44
#: Duffy et al. (2008) Table 1, full sample 0 < z < 2, NFW: (A, B, C) per definition
DUFFY08 = {"200c": (5.71, -0.084, -0.47), "vir": (7.85, -0.081, -0.71),
           "200m": (10.14, -0.081, -1.01)}
DUFFY08_PIVOT = 2e12  # Msun/h
#: rho_crit,0 in (Msun/h) / (Mpc/h)^3: 3 (100 km/s/Mpc)^2 / (8 pi G)
_COSMO_UNITS = {"length": "Mpc/h", "velocity": "km/s", "mass": "Msun/h"}
_G_MPC = gravitational_constant(_COSMO_UNITS)
RHO_CRIT0 = 3 * 100.0**2 / (8 * math.pi * _G_MPC)
#: the centres a central takes, in order of preference
CENTRES = ("mbp_position", "mcp_position", "center_of_mass")


# ----------------------------------------------------------------------------- formulas
def zheng07_mean_occupation(log_mass, params) -> tuple[np.ndarray, np.ndarray]:
    """(<Ncen>, <Nsat>) of Zheng et al. (2007) at ``log_mass`` = log10(M / (Msun/h));
    NaN masses give 0."""
    from scipy.special import erf

    lm = np.asarray(log_mass, dtype=np.float64)
    ok = np.isfinite(lm)
    lm = np.where(ok, lm, 0.0)
    ncen = np.where(ok, 0.5 * (1.0 + erf((lm - params["logMmin"]) / params["sigma_logM"])),
                    0.0)
    excess = (10.0**lm - 10.0 ** params["logM0"]) / 10.0 ** params["logM1"]
    with np.errstate(invalid="ignore"):
        nsat = np.where(ok & (excess > 0), ncen * np.maximum(excess, 0.0) ** params["alpha"],
                        0.0)
    return ncen, nsat


def duffy08_concentration(mass, redshift: float, delta: str) -> np.ndarray:
    """NFW concentration of Duffy et al. (2008), Table 1 full sample, for ``mass`` in Msun/h
    and ``delta`` in {"200c", "vir", "200m"}."""
    a, b, c = DUFFY08[delta]
    return a * (np.asarray(mass, dtype=np.float64) / DUFFY08_PIVOT) ** b * (1 + redshift) ** c


def nfw_radius_quantile(u, c) -> np.ndarray:
    """Radius in units of the scale radius enclosing the fraction ``u`` of an NFW halo of
    concentration ``c`` truncated at ``c`` scale radii (the inverse of ``f(x) / f(c)``)."""
    from scipy.special import lambertw

    from .overdensity import nfw_f

    p = np.asarray(u, dtype=np.float64) * nfw_f(c)
    return -1.0 / np.real(lambertw(-np.exp(-p - 1.0), 0)) - 1.0


# ----------------------------------------------------------------------------- inputs
def _catalog_of(catalog):
    """(catalog Dataset, labels or None, parameters dict)."""
    from .result import HaloResult

    if isinstance(catalog, HaloResult):
        return catalog.catalog, catalog.labels, dict(catalog.parameters)
    if isinstance(catalog, xr.Dataset):
        return catalog, None, {}
    raise ParameterError("populate_hod: catalog must be a HaloResult (cosmo_dask.halos.fof, "
                         f"open_catalog) or its catalog Dataset, got {type(catalog).__name__}")


def _snapshot_of(snapshot, parameters):
    """The snapshot given, else the one the halo store names when it exists here."""
    if snapshot is not None:
        return snapshot
    path = parameters.get("snapshot")
    if path and os.path.exists(str(path)):
        from ..store.snapshot import open_snapshot

        return open_snapshot(path)
    return None


def _mass_name(ds, mass) -> str:
    if mass is not None:
        if mass not in ds:
            raise ParameterError(f"populate_hod: the catalog has no {mass!r}; its masses: "
                                 f"{[m for m in HOD_MASSES if m in ds]}")
        return mass
    for name in HOD_MASSES:
        if name in ds:
            return name
    raise ParameterError(f"populate_hod: the catalog has none of the masses {list(HOD_MASSES)}")


def _h(snapshot) -> float | None:
    cosmo = snapshot.cosmology if snapshot is not None else None
    return None if not cosmo else cosmo.get("h")


def hod_masses(catalog, mass: str | None = None, snapshot=None) -> tuple[np.ndarray, str]:
    """(halo masses in Msun/h, the catalog variable they come from) as
    :func:`populate_hod` uses them (``mass=None``: the first of ``M_vir``, ``M_200m``,
    ``M_200c``, ``mass`` the catalog has)."""
    ds, _, parameters = _catalog_of(catalog)
    name = _mass_name(ds, mass)
    unit = ds[name].attrs.get("units") or ds.attrs.get("mass_unit")
    snap = _snapshot_of(snapshot, parameters)  # its h, for units without /h
    if not unit:
        raise ParameterError(f"populate_hod: the catalog's {name!r} has no unit; HOD masses "
                             "are in Msun/h")
    try:
        f = factor(unit, "Msun/h", "mass", h=_h(snap))
    except ParameterError as err:
        raise ParameterError(f"populate_hod: the catalog's {name!r} in {unit!r} does not "
                             f"convert to Msun/h ({err})") from None
    return np.asarray(ds[name].values, dtype=np.float64) * f, name


def nfw_halo_parameters(catalog, mass: str | None = None, snapshot=None) -> dict:
    """What ``populate_hod(..., satellites="nfw")`` places satellites with, per halo:
    ``mass`` (Msun/h), ``radius`` (comoving, the catalog's length unit), ``concentration``,
    ``sigma`` (1D velocity dispersion, the catalog's velocity unit; None without
    velocities), and ``definition`` (the mass variable) and ``concentration_source``."""
    ds, _, parameters = _catalog_of(catalog)
    snap = _snapshot_of(snapshot, parameters)
    m_sun, name = hod_masses(ds, mass, snap)
    centre = next((c for c in CENTRES if c in ds), None)
    length_unit = ds.attrs.get("length_unit") or (ds[centre].attrs.get("units") if centre
                                                  else None)
    has_vel = "velocity" in ds
    vel_unit = ds["velocity"].attrs.get("units") if has_vel else None
    source, sigma, radius, conc = _nfw_inputs(ds, snap, m_sun, name, length_unit, vel_unit,
                                              has_vel)
    return {"mass": m_sun, "radius": radius, "concentration": conc, "sigma": sigma,
            "definition": name, "concentration_source": source}


# ----------------------------------------------------------------------------- tasks
def _occupy(seed, block, log_mass, params, n_members, nfw):
    """Every random number of one block of halos: (central flags, satellite counts,
    satellite member ranks or None, NFW unit draws or None)."""
    rng = block_rng(seed, block, HOD_STREAM_TAG)
    ncen_mean, nsat_mean = zheng07_mean_occupation(log_mass, params)
    central = rng.random(log_mass.size) < ncen_mean
    nsat = rng.poisson(nsat_mean).astype(np.int64)
    hosts = np.repeat(np.arange(log_mass.size), nsat)
    ranks = draws = None
    if n_members is not None:
        ranks = rng.integers(0, np.maximum(n_members[hosts], 1))
    if nfw:
        directions = isotropic_directions(rng, hosts.size)
        draws = (rng.random(hosts.size), directions, rng.standard_normal((hosts.size, 3)))
    return central, nsat, ranks, draws


def _member_counts(labels):
    """(halos, their member counts) in one chunk of labels (sparse: the halos present)."""
    lab = np.asarray(host(labels))
    halos, counts = np.unique(lab[lab >= 0], return_counts=True)
    return halos.astype(np.int64), counts.astype(np.int64)


def _pick_members(labels, pos, vel, hosts, local_ranks, rows):
    """Positions and velocities of the ``local_ranks``-th members (in particle order) of
    halos ``hosts`` within this chunk, for galaxy rows ``rows``."""
    lab = np.asarray(host(labels))
    idx = np.flatnonzero(lab >= 0)
    order = idx[np.argsort(lab[idx], kind="stable")]
    starts = np.searchsorted(lab[order], hosts)
    chosen = order[starts + local_ranks]
    p = np.asarray(host(pos))[chosen].astype(np.float64)
    v = None if vel is None else np.asarray(host(vel))[chosen].astype(np.float64)
    return rows, p, v


# ----------------------------------------------------------------------------- main
def populate_hod(catalog, model: str = "zheng07", params=None, *, seed: int = 0,
                 satellites: str = "particles", snapshot=None, mass: str | None = None):
    """A galaxy mock: the halos of ``catalog`` populated with an HOD (module docstring).

    Parameters
    ----------
    catalog : HaloResult or xarray.Dataset
        Halos from :func:`cosmo_dask.halos.fof` or :func:`~cosmo_dask.halos.open_catalog`
        (masses, centres, bulk velocities, radii and concentrations from the ``--so``
        variables when present). ``satellites="particles"`` needs a HaloResult.
    model : {"zheng07"}
        The occupation model.
    params : dict, optional
        ``logMmin``, ``sigma_logM``, ``logM0``, ``logM1``, ``alpha`` (masses as log10 of
        Msun/h); missing ones take the defaults of
        :data:`cosmo_dask.halos.parameters.HOD_DEFAULTS` (Zheng et al. 2007, M_r < -20).
    seed : int
        Non-negative seed; the mock depends on it only (not on any chunking).
    satellites : {"particles", "nfw"}
        Satellites on random member particles, or on an NFW profile.
    snapshot : Snapshot, optional
        The halos' snapshot: the members' particles (``"particles"``) and the box, units,
        scale factor and cosmology of the galaxies. Default: the snapshot the halo store
        names, when it exists.
    mass : {"M_vir", "M_200m", "M_200c", "mass"}, optional
        The halo mass of the occupation (default: the first of these in the catalog).

    Returns
    -------
    Snapshot
        ``pos`` (the catalog's length unit, wrapped into the box), ``vel`` (its velocity
        unit; absent when the catalog has no ``velocity``), ``ids`` (0..N-1, grouped by
        halo, a central before its satellites), fields ``host_id`` (catalog row),
        ``is_central`` and ``host_mass`` (Msun/h); box, units, scale factor and cosmology
        of the snapshot (else the catalog's box and units); ``provenance`` records the
        model, parameters, seed, satellites and mass definition.
    """
    model, p, satellites, seed = check_hod(model, params, satellites, seed, mass)
    ds, labels, parameters = _catalog_of(catalog)
    nfw = satellites == "nfw"
    snap = _snapshot_of(snapshot, parameters)
    if not nfw:
        if labels is None or snap is None:
            what = ("a catalog Dataset has no member labels" if labels is None else
                    "the halo store names no snapshot that exists here"
                    if snapshot is None else "")
            raise ParameterError(f"populate_hod: satellites='particles' needs the halos' member "
                                 f"particles ({what}): pass snapshot= with a HaloResult, or "
                                 "use satellites='nfw'")
        if int(labels.shape[0]) != snap.n_particles:
            raise ParameterError(f"populate_hod: the catalog's labels cover {labels.shape[0]} "
                                 f"particles but the snapshot has {snap.n_particles}")
        if labels.chunks[0] != snap.pos.chunks[0]:
            labels = labels.rechunk((snap.pos.chunks[0],))
    box = ds.attrs.get("box_size", snap.box_size if snap is not None else None)
    if box is None:
        raise ParameterError("populate_hod: needs a periodic box (the catalog and snapshot "
                             "give no box_size)")
    box = float(box)
    m_sun, mass_name = hod_masses(ds, mass, snap)
    n_halos = int(ds.sizes.get("halo", 0))
    centre_name = next((c for c in CENTRES if c in ds), None)
    if centre_name is None:
        raise ParameterError(f"populate_hod: the catalog has no centre (any of {list(CENTRES)})")
    centres = np.asarray(ds[centre_name].values, dtype=np.float64).reshape(n_halos, 3)
    has_vel = "velocity" in ds and (nfw or snap.vel is not None)
    bulk = (np.asarray(ds["velocity"].values, dtype=np.float64).reshape(n_halos, 3)
            if has_vel else None)
    length_unit = ds.attrs.get("length_unit") or ds[centre_name].attrs.get("units")
    vel_unit = ds["velocity"].attrs.get("units") if has_vel else None
    conc_source, sigma, radius, conc = (
        _nfw_inputs(ds, snap, m_sun, mass_name, length_unit, vel_unit, has_vel) if nfw
        else (None,) * 4)

    log_mass = np.full(n_halos, np.nan)
    pos_mass = m_sun > 0
    log_mass[pos_mass] = np.log10(m_sun[pos_mass])
    n_members = np.asarray(ds["n_members"].values, np.int64) if not nfw else None
    n_blocks = -(-n_halos // HOD_BLOCK)
    token = tokenize(seed, p, satellites, log_mass, n_members,
                     None if nfw else (labels.name, snap.pos.name))
    inputs = [] if nfw else [labels]
    g = TaskGraph(inputs)
    occ = [g.add((f"hod-occupy-{token}", b), _occupy, seed, b,
                 log_mass[b * HOD_BLOCK:(b + 1) * HOD_BLOCK], p,
                 None if n_members is None else n_members[b * HOD_BLOCK:(b + 1) * HOD_BLOCK],
                 nfw) for b in range(n_blocks)]
    keys = [o.key for o in occ]
    if not nfw:
        keys += [g.add((f"hod-members-{token}", i), _member_counts, g.chunk(labels, i)).key
                 for i in range(labels.numblocks[0])]
    values = g.compute(keys, label="HOD occupation") if keys else []
    blocks, counts = values[:n_blocks], values[n_blocks:]
    central = np.concatenate([b[0] for b in blocks]) if blocks else np.zeros(0, bool)
    nsat = np.concatenate([b[1] for b in blocks]) if blocks else np.zeros(0, np.int64)
    sat_host = np.repeat(np.arange(n_halos), nsat)
    cen_host = np.flatnonzero(central)
    # galaxy order: by halo, its central first
    host_id = np.concatenate([cen_host, sat_host])
    is_central = np.r_[np.ones(cen_host.size, bool), np.zeros(sat_host.size, bool)]
    order = np.argsort(2 * host_id + ~is_central, kind="stable")
    n_gal = host_id.size
    row_of = np.empty(n_gal, np.int64)
    row_of[order] = np.arange(n_gal)
    pos = np.empty((n_gal, 3))
    vel = np.empty((n_gal, 3)) if has_vel else None
    cen_rows, sat_rows = row_of[:cen_host.size], row_of[cen_host.size:]
    pos[cen_rows] = centres[cen_host]
    if has_vel:
        vel[cen_rows] = bulk[cen_host]
    if nfw:
        u = np.concatenate([b[3][0] for b in blocks]) if blocks else np.zeros(0)
        dirs = np.concatenate([b[3][1] for b in blocks]) if blocks else np.zeros((0, 3))
        gauss = np.concatenate([b[3][2] for b in blocks]) if blocks else np.zeros((0, 3))
        c = conc[sat_host]
        r = nfw_radius_quantile(u, c) * radius[sat_host] / c
        pos[sat_rows] = centres[sat_host] + r[:, None] * dirs
        if has_vel:
            vel[sat_rows] = bulk[sat_host] + sigma[sat_host, None] * gauss
    elif sat_host.size:
        ranks = np.concatenate([b[2] for b in blocks])
        _members_into(labels, snap, counts, n_members, sat_host, ranks, sat_rows, pos, vel,
                      token)
    pos = np.mod(pos, box)
    pos[pos >= box] = 0.0
    return _galaxies(pos, vel, host_id[order], is_central[order], m_sun, snap, ds, box,
                     length_unit, vel_unit, dict(model=model, params=p, seed=seed,
                     satellites=satellites, mass_definition=mass_name, centre=centre_name,
                     halo_snapshot=parameters.get("snapshot"), n_halos=n_halos,
                     concentration=conc_source))


def _members_into(labels, snap, counts, n_members, sat_host, ranks, sat_rows, pos, vel,
                  token):
    """Fill the satellites' rows of ``pos``/``vel`` with the chosen members' (one task per
    particle chunk, each given only its own picks). ``counts``: per chunk, (halos, member
    counts) of the halos present; a pick is the ``rank``-th member of its halo in particle
    order, i.e. global member position ``sum(n_members[:h]) + rank`` of the (halo, chunk)
    entries sorted by halo then chunk."""
    halo = np.concatenate([h for h, _ in counts]) if counts else np.zeros(0, np.int64)
    count = np.concatenate([c for _, c in counts]) if counts else np.zeros(0, np.int64)
    chunk_of = np.concatenate([np.full(len(h), i, np.int64) for i, (h, _) in enumerate(counts)]
                              ) if counts else np.zeros(0, np.int64)
    total = np.bincount(halo, weights=count, minlength=n_members.size).astype(np.int64)
    if np.any(total != n_members):
        bad = int(np.flatnonzero(total != n_members)[0])
        raise ParameterError(f"populate_hod: halo {bad} has {n_members[bad]} members in the "
                             f"catalog but {total[bad]} labelled particles in the snapshot: "
                             "the catalog is not of this snapshot")
    order = np.lexsort((chunk_of, halo))
    count, chunk_of = count[order], chunk_of[order]
    end = np.cumsum(count)  # global member position after each (halo, chunk) entry
    first = np.concatenate([[0], np.cumsum(n_members)[:-1]])
    where = first[sat_host] + ranks
    entry = np.searchsorted(end, where, side="right")
    chunk = chunk_of[entry]
    local = where - (end[entry] - count[entry])
    g2 = TaskGraph([labels, snap.pos] + ([snap.vel] if snap.vel is not None else []))
    keys = []
    by_chunk = np.argsort(chunk, kind="stable")
    bounds = np.searchsorted(chunk[by_chunk], np.arange(labels.numblocks[0] + 1))
    for i in range(labels.numblocks[0]):
        sel = by_chunk[bounds[i]:bounds[i + 1]]
        if sel.size:
            keys.append(g2.add((f"hod-pick-{token}", i), _pick_members, g2.chunk(labels, i),
                               g2.chunk(snap.pos, i, 0),
                               None if snap.vel is None else g2.chunk(snap.vel, i, 0),
                               sat_host[sel], local[sel], sat_rows[sel]).key)
    for rows, p, v in g2.compute(keys, label="HOD satellites"):
        pos[rows] = p
        if vel is not None:
            vel[rows] = v


def _nfw_inputs(ds, snap, m_sun, mass_name, length_unit, vel_unit, has_vel):
    """(concentration source, 1D velocity dispersion, radius, concentration) per halo."""
    a = snap.scale_factor if snap is not None else ds.attrs.get("so_scale_factor")
    if a is None or not a > 0:
        raise ParameterError("populate_hod: satellites='nfw' needs the scale factor (pass the "
                             "halos' snapshot=)")
    h = _h(snap)
    delta = {"M_vir": "vir", "M_200m": "200m", "M_200c": "200c", "mass": "200m"}[mass_name]
    try:
        to_mpc = factor(length_unit, "Mpc/h", "length", h=h)
    except ParameterError as err:
        raise ParameterError(f"populate_hod: the catalog's lengths in {length_unit!r} do not "
                             f"convert to Mpc/h ({err})") from None
    if mass_name == "mass":
        cosmo = snap.cosmology if snap is not None else None
        if not cosmo or cosmo.get("Omega_m") is None:
            raise ParameterError("populate_hod: satellites='nfw' with the FOF mass needs "
                                 "Omega_m for R_200m (pass the halos' snapshot= with a "
                                 "cosmology, or use an SO mass: cosmo-dask halos --so)")
        rho_m = 200.0 * cosmo["Omega_m"] * RHO_CRIT0
        r_mpc = np.cbrt(3.0 * m_sun / (4.0 * math.pi * rho_m))
    else:
        r_mpc = np.asarray(ds[f"R_{delta}"].values, dtype=np.float64) * to_mpc
    conc = duffy08_concentration(m_sun, 1.0 / a - 1.0, delta)
    source = f"Duffy et al. 2008 ({delta})"
    if "c_nfw_fit" in ds and "R_200c" in ds:
        fit = (np.asarray(ds["c_nfw_fit"].values, np.float64) * r_mpc
               / (np.asarray(ds["R_200c"].values, np.float64) * to_mpc))
        ok = np.isfinite(fit) & (fit > 0)
        conc = np.where(ok, fit, conc)
        source = f"c_nfw_fit ({int(ok.sum())} halos), else " + source
    sigma = None
    if has_vel:
        try:
            to_vel = factor("km/s", vel_unit, "velocity", h=h)
        except ParameterError as err:
            raise ParameterError(f"populate_hod: the catalog's velocities in {vel_unit!r} do "
                                 f"not convert from km/s ({err})") from None
        with np.errstate(invalid="ignore", divide="ignore"):
            sigma = np.sqrt(_G_MPC * m_sun / (a * r_mpc) / 2.0) * to_vel
    ok = np.isfinite(r_mpc) & np.isfinite(conc) & (r_mpc > 0)
    r = np.where(ok, r_mpc / to_mpc, 0.0)
    conc = np.where(ok, conc, 1.0)
    if sigma is not None:
        sigma = np.where(ok, sigma, 0.0)
    return source, sigma, r, conc


def _galaxies(pos, vel, host_id, is_central, m_sun, snap, ds, box, length_unit, vel_unit,
              provenance):
    from ..store.snapshot import Snapshot

    if snap is not None and snap.units:
        units = dict(snap.units)
    else:
        units = {k: v for k, v in (("length", length_unit), ("velocity", vel_unit),
                                   ("mass", ds.attrs.get("mass_unit"))) if v}
    dtype = snap.pos.dtype if snap is not None else np.float64
    pos = pos.astype(dtype)
    pos[pos >= box] = 0.0  # float32 rounding up to the box side
    gal = Snapshot.from_arrays(
        pos, None if vel is None else vel.astype(dtype),
        np.arange(pos.shape[0], dtype=np.int64), box_size=box,
        scale_factor=None if snap is None else snap.scale_factor,
        cosmology=None if snap is None else snap.cosmology, units=units or None,
        G=None if snap is None else snap.G,
        fields={"host_id": host_id.astype(np.int64), "is_central": is_central,
                "host_mass": m_sun[host_id]})
    attrs = gal.attrs
    attrs["provenance"] = {k: v for k, v in provenance.items() if v is not None}
    attrs["provenance"]["format"] = "cosmo_dask.hod"
    if provenance.get("halo_snapshot"):
        attrs["provenance"]["files"] = [str(provenance["halo_snapshot"])]
    return Snapshot(gal.arrays, attrs, fields=gal.fields)


def mean_occupation(galaxies, halo_mass, bins) -> xr.Dataset:
    """Measured mean central and satellite counts per halo-mass bin.

    Parameters
    ----------
    galaxies : Snapshot
        From :func:`populate_hod` (fields ``host_id``, ``is_central``).
    halo_mass : array_like
        (halos,) the masses the occupation used, Msun/h (:func:`hod_masses`).
    bins : array_like
        Mass bin edges, Msun/h.

    Returns
    -------
    xarray.Dataset
        Over ``mass_bin``: ``n_halos``, ``mean_ncen``, ``mean_nsat`` and their errors
        (binomial ``sqrt(p (1 - p) / n_halos)`` for the centrals, Poisson ``sqrt(N) /
        n_halos`` for the satellites), coordinate ``mass`` (geometric bin centre), all
        masses in Msun/h.
    """
    mass = np.asarray(halo_mass, dtype=np.float64)
    edges = np.asarray(bins, dtype=np.float64)
    host_id = np.asarray(galaxies.field("host_id").compute())
    cen = np.asarray(galaxies.field("is_central").compute())
    ncen = np.bincount(host_id[cen], minlength=mass.size)
    nsat = np.bincount(host_id[~cen], minlength=mass.size)
    which = np.digitize(mass, edges) - 1
    inside = (which >= 0) & (which < edges.size - 1) & np.isfinite(mass)
    nb = edges.size - 1
    nh = np.bincount(which[inside], minlength=nb)
    sc = np.bincount(which[inside], weights=ncen[inside], minlength=nb)
    ss = np.bincount(which[inside], weights=nsat[inside], minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"n_halos": ("mass_bin", nh), "mean_ncen": ("mass_bin", sc / nh),
               "mean_ncen_error": ("mass_bin", np.sqrt(sc / nh * (1 - sc / nh) / nh)),
               "mean_nsat": ("mass_bin", ss / nh),
               "mean_nsat_error": ("mass_bin", np.sqrt(ss) / nh)}
    units = {"n_halos": "1", "mean_ncen": "1", "mean_ncen_error": "1", "mean_nsat": "1",
             "mean_nsat_error": "1"}
    ds = xr.Dataset({k: (*v, {"units": units[k]}) for k, v in out.items()},
                    coords={"mass": ("mass_bin", np.sqrt(edges[:-1] * edges[1:]),
                                     {"units": "Msun/h"}),
                            "mass_lo": ("mass_bin", edges[:-1], {"units": "Msun/h"}),
                            "mass_hi": ("mass_bin", edges[1:], {"units": "Msun/h"})})
    return ds


def plot_occupation(galaxies, halo_mass, *, n_bins: int = 20, ax=None, path=None):
    """The measured <Ncen(M)> and <Nsat(M)> of a mock (:func:`mean_occupation` over
    ``n_bins`` logarithmic bins spanning the halo masses) against the model's curves
    (the parameters recorded in the mock's ``provenance``).

    Parameters
    ----------
    galaxies : Snapshot
        From :func:`populate_hod`.
    halo_mass : array_like
        (halos,) the masses the occupation used, Msun/h (:func:`hod_masses`).
    n_bins : int
    ax : matplotlib.axes.Axes, optional
    path : str or path-like, optional
        Save the figure there.

    Returns
    -------
    (matplotlib.axes.Axes, xarray.Dataset)
        The axes and the measured occupations.
    """
    from ..plot.figure import new_axes
    from ..plot.hod import draw_occupation

    prov = galaxies.provenance or {}
    if prov.get("model") != "zheng07":
        raise ParameterError("plot_occupation: the galaxies are no populate_hod mock (their "
                             "provenance names no model)")
    mass = np.asarray(halo_mass, dtype=np.float64)
    good = mass[np.isfinite(mass) & (mass > 0)]
    if good.size == 0:
        raise ParameterError("plot_occupation: no halo has a finite mass > 0")
    lo, hi = np.log10(good.min()), np.log10(good.max())
    edges = np.logspace(lo, hi + 1e-9 + (hi == lo), int(n_bins) + 1)
    ds = mean_occupation(galaxies, mass, edges)
    grid = np.logspace(lo, hi, 200)
    ncen, nsat = zheng07_mean_occupation(np.log10(grid), prov["params"])
    curves = [(grid, ncen, "Zheng07 <Ncen>"), (grid, np.where(nsat > 0, nsat, np.nan),
                                                "Zheng07 <Nsat>")]
    ax = new_axes(ax, path)
    draw_occupation(ax, ds, curves, mass_label=prov.get("mass_definition", "M"),
                    title=f"HOD mock: {galaxies.n_particles} galaxies, "
                    f"satellites on {prov.get('satellites', '?')}", path=path)
    return ax, ds
