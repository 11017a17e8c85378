"""``cosmo_dask.halos.fof``: friends-of-friends halos with their catalog and centres."""

from __future__ import annotations

import time

import numpy as np
import xarray as xr
from dask.base import tokenize

from ..core.backend import empty_meta
from ..core.task_graph import TaskGraph
from ..units.products import product_units
from . import catalog as cat
from .fof_graph import run_fof
from .parameters import (
    CENTERS_DEFAULT,
    LINKING_LENGTH_DEFAULT,
    MIN_FRIENDS_DEFAULT,
    MIN_MEMBERS_DEFAULT,
    POTENTIAL_SOFTENING_LINKS,
    check_fof,
)
from .result import HaloResult

#: the quantity of :func:`~cosmo_dask.units.products.product_units` each catalog
#: variable is in (its ``units`` attribute)
VARIABLE_QUANTITIES = {
    "n_members": "dimensionless", "mass": "mass", "center_of_mass": "length",
    "r_max": "length", "first_member_id": "dimensionless", "velocity": "velocity",
    "mcp_index": "dimensionless", "mcp_position": "length", "mcp_friends": "dimensionless",
    "mbp_index": "dimensionless", "mbp_position": "length", "mbp_potential": "potential",
}


def check_parameters(snap, linking_length: float = LINKING_LENGTH_DEFAULT, *,
                     absolute: bool = False, min_members: int = MIN_MEMBERS_DEFAULT,
                     min_friends: int = MIN_FRIENDS_DEFAULT, centers=CENTERS_DEFAULT,
                     potential_softening: float | None = None, n_domains=None) -> None:
    """Raise ParameterError for bad :func:`fof` parameters, reading no particle data
    (:func:`cosmo_dask.halos.parameters.check_fof`)."""
    check_fof(snap, linking_length, absolute=absolute, min_members=min_members,
              min_friends=min_friends, centers=centers,
              potential_softening=potential_softening, n_domains=n_domains)


def fof(snap, linking_length: float = LINKING_LENGTH_DEFAULT, *, absolute: bool = False,
        min_members: int = MIN_MEMBERS_DEFAULT, min_friends: int = MIN_FRIENDS_DEFAULT,
        centers=CENTERS_DEFAULT, potential_softening: float | None = None,
        grid_threshold: int | None = cat.GRID_THRESHOLD, n_domains=None) -> HaloResult:
    """Friends-of-friends halos of a snapshot, with a halo catalog.

    Parameters
    ----------
    snap : Snapshot
    linking_length : float
        In units of the mean interparticle spacing (default 0.2), or in box
        units with ``absolute=True`` (required for isolated snapshots).
    min_members : int
        Smallest group kept (>= 2, default 20).
    min_friends : int
        k > 1: particles with fewer than k friends join no halo (DBSCAN-like).
    centers : tuple of {"mbp", "mbp_grid", "mcp"}
        Centres to compute: most-bound particle (exact, as a double sum over
        the members would give; with a ``grid_threshold``, halos above it use
        the grid-Poisson approximation), the grid approximation for every
        halo, most-connected particle. ``()`` computes none.
    potential_softening : float, optional
        Plummer softening of the MBP potentials, box units (default 0.1 x the
        linking length).
    grid_threshold : int, optional
        Member count above which "mbp" uses the grid approximation (default
        None: none, every MBP exact).
    n_domains : int or (int, int, int), optional
        Domains of the decomposition (default: about 2^21 particles each).

    Returns
    -------
    HaloResult
        Every catalog variable carries a ``units`` attribute derived from the
        snapshot's units (:func:`~cosmo_dask.units.products.product_units`):
        masses in its mass unit, positions and ``r_max`` in its length unit,
        ``velocity`` in its velocity unit, ``mbp_potential`` in velocity^2 (mass
        / length marked "(G = 1)" when the snapshot has no ``G``), counts,
        indices and ids ``"1"``.
    """
    _, centers = check_fof(snap, linking_length, absolute=absolute, min_members=min_members,
                           min_friends=min_friends, centers=centers,
                           potential_softening=potential_softening, n_domains=n_domains)
    t0 = time.perf_counter()
    graph = run_fof(snap, linking_length, absolute=absolute, min_members=min_members,
                    min_friends=min_friends, n_domains=n_domains, with_members=True,
                    count_friends="mcp" in centers)  # friend counts only for the MCP
    res = graph.result
    box = graph.box_size
    n_halos = res.n_halos
    G = snap.G if snap.G is not None else 1.0
    soft = (POTENTIAL_SOFTENING_LINKS * res.linking_length if potential_softening is None
            else float(potential_softening))
    members = graph.members
    token = tokenize(res.parameters, [m.key for m in members], centers, soft, box, G,
                     grid_threshold, snap.device)

    g = TaskGraph(members)
    refs = [g.ref(m) for m in members]
    want_mbp = "mbp" in centers or "mbp_grid" in centers
    if members:  # one graph round: properties, r_max (after the centres of mass), MBPs
        partials = [g.add((f"halo-props-{token}", d), cat.partial_props, r, box)
                    for d, r in enumerate(refs)]
        props_ref = g.add(f"halo-props-reduce-{token}", cat.reduce_props, n_halos, box,
                          *partials)
        rparts = [g.add((f"halo-rmax-{token}", d), cat.partial_rmax, r, props_ref, box)
                  for d, r in enumerate(refs)]
        keys = [props_ref.key, g.add(f"halo-rmax-reduce-{token}", cat.reduce_rmax, n_halos,
                                     *rparts).key]
        if want_mbp:
            mode = "grid" if "mbp_grid" in centers else "auto"
            like = empty_meta(snap.pos, 1, np.float64)  # the exact MBPs go where the chunks are
            n_members = res.n_members
            n_batches = max(1, len(members))
            local = [g.add((f"halo-mbp-local-{token}", d), cat.mbp_local, r, n_members, box,
                           soft, G, grid_threshold, mode, like) for d, r in enumerate(refs)]
            exports = [g.add_split((f"halo-mbp-export-{token}", d), cat.mbp_export, r,
                                   n_members, n_batches, n=n_batches)
                       for d, r in enumerate(refs)]
            batches = [g.add((f"halo-mbp-batch-{token}", b), cat.mbp_batch, box, soft, G,
                             grid_threshold, mode, like, *[e[b] for e in exports])
                       for b in range(n_batches)]
            keys.append(g.add(f"halo-mbp-reduce-{token}", cat.reduce_mbp, n_halos, *local,
                              *batches).key)
        props, rmax, *mbp = g.compute(keys, label="halo catalog")
        mbp = mbp[0] if mbp else None
    else:
        props = cat.reduce_props(n_halos, box)
        rmax = np.zeros(n_halos)
        mbp = cat.reduce_mbp(n_halos) if want_mbp else None  # the columns, with no rows

    data = {
        "n_members": ("halo", res.n_members),
        "mass": ("halo", props["mass"]),
        "center_of_mass": (("halo", "axis"), props["center_of_mass"]),
        "r_max": ("halo", rmax),
        "first_member_id": ("halo", res.first_member_id),
    }
    if "velocity" in props:
        data["velocity"] = (("halo", "axis"), props["velocity"])
    if "mcp" in centers:
        data["mcp_index"] = ("halo", props["mcp_index"])
        data["mcp_position"] = (("halo", "axis"), props["mcp_position"])
        data["mcp_friends"] = ("halo", props["mcp_friends"])
    if mbp is not None:
        for key in ("mbp_index", "mbp_potential"):
            data[key] = ("halo", mbp[key])
        data["mbp_position"] = (("halo", "axis"), mbp["mbp_position"])

    units = snap.units or {}
    mass_unit = units.get("mass", "particle masses" if snap.particle_mass is None else None)
    pu = product_units({**units, **({"mass": mass_unit} if mass_unit else {})},
                       g_one=snap.G is None)
    data = {k: (*v, {"units": pu[VARIABLE_QUANTITIES[k]]}) for k, v in data.items()}
    catalog = xr.Dataset(data, coords={"halo": np.arange(n_halos), "axis": ["x", "y", "z"]})
    catalog.attrs = {"linking_length": res.linking_length, "box_size": box,
                     "length_unit": units.get("length"), "mass_unit": mass_unit,
                     "potential_softening": soft, "G": G, "centers": list(centers)}
    catalog.attrs = {k: v for k, v in catalog.attrs.items() if v is not None}
    params = dict(res.parameters, centers=list(centers), potential_softening=soft,
                  grid_threshold=None if grid_threshold is None else int(grid_threshold),
                  snapshot=snap.source,
                  seconds=round(time.perf_counter() - t0, 3))
    return HaloResult(res.labels, catalog, params)
