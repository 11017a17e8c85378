"""``cosmo-dask halos``: friends-of-friends halos, centres, spherical overdensities; and
``cosmo-dask hod``: an HOD galaxy mock of a halo store."""

from __future__ import annotations

import os
import time

from ..core.errors import CosmoDaskError
from . import common
from .common import _check_out, _theory_cosmology
from .messages import _say


# --------------------------------------------------------------------------- halos
#: spherical-overdensity variables renamed in the halo catalog (``R_max`` would clash
#: with the FOF extent ``r_max`` on a case-insensitive file system)
def _so_deltas(text: str | None) -> tuple[str, ...]:
    """``--so 200c,200m,vir`` as a tuple of deltas; CosmoDaskError for a bad list."""
    from ..halos.parameters import DELTAS, check_deltas

    if text is None:
        return ()
    names = [d.strip() for d in text.split(",")]
    if not any(names) or not all(names):
        raise CosmoDaskError(f"--so {text!r}: give a comma list of {', '.join(DELTAS)}")
    unknown = [d for d in names if d not in DELTAS]
    if unknown:
        raise CosmoDaskError(f"--so: unknown overdensity {unknown[0]!r}; use a comma list of "
                             f"{', '.join(DELTAS)}")
    try:
        return check_deltas(names)
    except CosmoDaskError as err:  # repeated
        raise CosmoDaskError(f"--so {text!r}: {str(err).split(': ', 1)[-1]}") from None


SO_RENAMES = {"R_max": "R_Vmax", "search_radius": "so_search_radius", "r": "r_profile"}


def _so_center(centers: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(centre spherical_overdensity uses, the centres fof computes): the most-bound
    particle when --centers has mbp or mbp_grid, else the most-connected particle when it
    has mcp, else mbp is added to the centres computed."""
    if "mbp" in centers or "mbp_grid" in centers:
        return "mbp", centers
    if "mcp" in centers:
        return "mcp", centers
    return "mbp", centers + ("mbp",)


def _add_so(result, so) -> None:
    """Merge the spherical_overdensity Dataset ``so`` into ``result.catalog`` (renaming
    :data:`SO_RENAMES`, its attrs as ``so_*`` catalog attrs) and record it in the
    parameters."""
    so = so.rename({k: v for k, v in SO_RENAMES.items() if k in so.variables})
    if "halo" in so.coords:
        so = so.drop_vars("halo")
    cat = result.catalog.assign(**{k: so[k] for k in so.data_vars})
    cat = cat.assign_coords(**{k: so.coords[k] for k in so.coords})
    for key, value in so.attrs.items():
        cat.attrs[f"so_{key}"] = value
    result.catalog = cat
    result.parameters["so"] = list(so.attrs["deltas"])
    result.parameters["so_center"] = so.attrs["center"]


def _so_summary(cat, deltas) -> str:
    import numpy as np

    n = int(cat.sizes.get("halo", 0))
    parts = []
    for d in deltas:
        m = np.asarray(cat[f"M_{d}"].values, dtype=float)
        ok = np.isfinite(m)
        text = f"{int(ok.sum())}/{n} with M_{d}"
        if ok.any():
            text += f" (median {np.median(m[ok]):.4g} {cat[f'M_{d}'].attrs.get('units', '')})"
        parts.append(text)
    for key, label in (("c_nfw_fit", "c (NFW fit)"), ("c_vmax", "c (V_max/V_200c)")):
        c = np.asarray(cat[key].values, dtype=float)
        c = c[np.isfinite(c)]
        parts.append(f"median {label} {np.median(c):.3g}" if c.size else f"no {label}")
    return "spherical overdensity: " + "; ".join(parts)


def cmd_halos(args) -> int:
    from ..halos import fof
    from ..halos.api import check_parameters
    from ..store.snapshot import open_snapshot

    centers = tuple(c for c in args.centers.split(",") if c) if args.centers else ()
    deltas = _so_deltas(args.so)  # before opening anything
    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    so_center = None
    if deltas:
        from ..halos.overdensity import check_parameters as check_so

        so_center, centers = _so_center(centers)
        try:
            check_so(snap, deltas)
        except CosmoDaskError as err:
            raise CosmoDaskError(f"--so: {str(err).split(': ', 1)[-1]}") from None
    check_parameters(snap, args.linking_length, absolute=args.absolute,
                     min_members=args.min_members, min_friends=args.min_friends,
                     centers=centers, n_domains=args.domains)  # before starting a cluster
    if args.plot:  # a mass function needs a box; its theory curve a valid cosmology
        if snap.box_size is None:
            raise CosmoDaskError("--plot: a mass function needs a periodic snapshot (box size)")
        _theory_cosmology(args, snap, say=False)
    _check_out(args)  # before a cluster starts
    with common._cluster(args):
        t0 = time.perf_counter()
        result = fof(snap, args.linking_length, absolute=args.absolute,
                     min_members=args.min_members, min_friends=args.min_friends,
                     centers=centers, n_domains=args.domains)
        if deltas:
            from ..halos.overdensity import spherical_overdensity

            _add_so(result, spherical_overdensity(snap, result.catalog, deltas,
                                                  center=so_center))
        path = result.to_zarr(args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
    n = result.n_halos
    largest = int(result.catalog["n_members"][0]) if n else 0
    in_halos = int(result.catalog["n_members"].sum()) if n else 0
    _say(f"{n} halo{'s' * (n != 1)} (largest {largest} members; {in_halos} of "
         f"{snap.n_particles} particles "
         f"in halos), linking length {result.parameters['linking_length']:.4g}, "
         f"{dt:.2f} s -> {path}")
    if deltas:
        _say(_so_summary(result.catalog, deltas) + f" (centre {so_center})")
    if args.plot:
        from ..halos.mass_functions import mass_function, plot_mass_function

        if n == 0:
            raise CosmoDaskError("--plot: no halos to plot")
        ds = mass_function(result.catalog, min(20, max(1, n // 5)), snap.box_size)
        cosmo = _theory_cosmology(args, snap)
        plot_mass_function(ds, cosmology=cosmo, redshift=snap.redshift or 0.0,
                           path=args.plot, **({} if cosmo else {"fits": ()}))
        _say(f"mass function plot -> {args.plot}")
    return 0


# --------------------------------------------------------------------------- hod
def cmd_hod(args) -> int:
    """``cosmo-dask hod``: every check (parameters, the catalog, the members' snapshot, the
    output) before a cluster starts, then the mock, its store and the --plot."""
    from ..halos.hod import hod_masses, plot_occupation, populate_hod
    from ..halos.parameters import check_hod
    from ..halos.result import open_catalog

    names = ("logMmin", "sigma_logM", "logM0", "logM1", "alpha")
    params = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    check_hod(args.model, params, args.satellites, args.seed, args.mass)  # before any read
    result = open_catalog(args.input)
    snap = None
    path = args.snapshot or result.parameters.get("snapshot")
    if args.snapshot or (path and os.path.exists(str(path))):
        from ..store.snapshot import open_snapshot

        snap = open_snapshot(path, device="gpu" if args.gpu else "cpu")
    if args.satellites == "particles":
        if snap is None:
            where = (f"records the snapshot {path}, which does not exist here" if path
                     else "records no snapshot")
            raise CosmoDaskError(f"--satellites particles needs the halos' member particles: "
                                 f"{args.input} {where}; pass --snapshot SNAP or use "
                                 "--satellites nfw")
        if snap.n_particles != int(result.labels.shape[0]):
            raise CosmoDaskError(f"--snapshot {path}: has {snap.n_particles} particles but "
                                 f"the catalog's labels cover {result.labels.shape[0]}")
    hod_masses(result, args.mass, snap)  # the mass and its unit, before the cluster
    _check_out(args)
    with common._cluster(args):
        t0 = time.perf_counter()
        galaxies = populate_hod(result, args.model, params, seed=args.seed,
                                satellites=args.satellites, snapshot=snap, mass=args.mass)
        out = galaxies.to_zarr(args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
    n = galaxies.n_particles
    prov = galaxies.provenance
    n_cen = int(galaxies.field("is_central").sum().compute()) if n else 0
    _say(f"{n} galaxies ({n_cen} centrals, {n - n_cen} satellites on "
         f"{args.satellites}) in {result.n_halos} halos, mass {prov['mass_definition']}, "
         f"seed {args.seed}, {dt:.2f} s -> {out}")
    if args.plot:
        mass = hod_masses(result, args.mass, snap)[0]
        plot_occupation(galaxies, mass, path=args.plot)
        _say(f"occupation plot -> {args.plot}")
    return 0
