"""Halo finding's parameters, declared once: the FOF linking length, group sizes and
centres, the spherical-overdensity definitions, with their defaults, bounds and checks.

:func:`cosmo_dask.halos.fof`, :func:`~cosmo_dask.halos.fof_labels` and
:func:`~cosmo_dask.halos.spherical_overdensity` check their parameters here, once, before
any graph is built; the graph code (``halos.fof_graph.run_fof``) and the kernels assume valid
values. ``cosmo-dask halos`` takes its defaults and choices from here.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..core.checks import (
    check_finite,
    check_integer,
    check_positive,
    check_seed,
    check_subset,
)
from ..core.errors import ParameterError

__all__ = ["LINKING_LENGTH_DEFAULT", "MIN_MEMBERS_DEFAULT", "MIN_MEMBERS_MIN",
           "MIN_FRIENDS_DEFAULT", "MIN_FRIENDS_MIN", "CENTERS", "CENTERS_DEFAULT",
           "CLI_CENTERS_DEFAULT", "POTENTIAL_SOFTENING_LINKS", "DELTAS", "SO_CENTERS",
           "SO_N_BINS_DEFAULT", "SO_N_BINS_MIN", "SO_R_MIN_FACTOR_DEFAULT", "check_deltas",
           "check_so_profile", "check_n_domains",
           "box_linking_length", "check_linking_length", "check_centers",
           "check_potential_softening", "check_fof", "MASS_FUNCTION_MODELS"]

#: the universal mass-function fits (multiplicity functions); the first is the default of
#: ``theory_mass_function``, all are drawn by ``plot_mass_function``
MASS_FUNCTION_MODELS = ("warren2006", "watson2013_fof")
#: the FOF linking length b, in mean interparticle spacings box_size / N^(1/3)
LINKING_LENGTH_DEFAULT = 0.2
#: smallest group kept: default and lower bound (a pair is the smallest group)
MIN_MEMBERS_DEFAULT = 20
MIN_MEMBERS_MIN = 2
#: friends a particle needs to carry links (1: classic FOF; k > 1: DBSCAN-like)
MIN_FRIENDS_DEFAULT = 1
MIN_FRIENDS_MIN = 1
#: the halo centres ``fof`` computes: most-bound particle (exact; the grid-Poisson
#: approximation above ``grid_threshold`` members), the grid approximation for every halo,
#: most-connected particle
CENTERS = ("mbp", "mbp_grid", "mcp")
#: the centres ``fof`` computes by default
CENTERS_DEFAULT = ("mbp",)
#: the centres ``cosmo-dask halos`` computes by default (``--centers``)
CLI_CENTERS_DEFAULT = ("mbp", "mcp")
#: default Plummer softening of the MBP potentials, in linking lengths
POTENTIAL_SOFTENING_LINKS = 0.1
#: the overdensity definitions ``spherical_overdensity`` knows (``cosmo-dask halos --so``)
DELTAS = ("200c", "200m", "vir")
#: spherical_overdensity's catalog centres: name -> catalog variable
SO_CENTERS = {"mbp": "mbp_position", "mcp": "mcp_position", "com": "center_of_mass",
              "center_of_mass": "center_of_mass", "mbp_position": "mbp_position",
              "mcp_position": "mcp_position"}
#: spherical_overdensity's profile: bins, and inner edge in units of R_200c (in (0, 1))
SO_N_BINS_DEFAULT = 20
SO_N_BINS_MIN = 2
SO_R_MIN_FACTOR_DEFAULT = 0.01


def box_linking_length(snap, linking_length: float, absolute: bool) -> float:
    """The (checked) linking length in box units: ``linking_length`` itself when
    ``absolute``, else times the mean interparticle spacing ``box_size / N^(1/3)``."""
    if absolute:
        return float(linking_length)
    return float(linking_length) * snap.box_size / max(snap.n_particles, 1) ** (1 / 3)


def check_linking_length(snap, linking_length: Any, absolute: bool) -> float:
    """The linking length in box units, or a ParameterError: it must be a finite number
    > 0, in mean interparticle spacings only for a periodic snapshot, and in a periodic
    box below half its side."""
    linking_length = check_positive(linking_length, "linking_length")
    if not absolute and snap.box_size is None:
        raise ParameterError(
            "linking_length is in units of the mean interparticle spacing box_size/N^(1/3), "
            "which an isolated snapshot does not have: pass absolute=True with a length"
        )
    ll = box_linking_length(snap, linking_length, absolute)
    if snap.box_size is not None and not ll < 0.5 * snap.box_size:
        raise ParameterError(f"linking_length = {linking_length:g} is {ll:.6g} in box units, "
                             f"not below half the box ({0.5 * snap.box_size:g}): periodic "
                             "FOF links the nearest image of each pair only")
    return ll


def check_centers(centers: Any) -> tuple[str, ...]:
    """The centres as a tuple out of :data:`CENTERS` ('mbp' and 'mbp_grid' exclude each
    other), else a ParameterError."""
    centers = check_subset(centers, CENTERS, "centers")
    if "mbp" in centers and "mbp_grid" in centers:
        raise ParameterError("ask for 'mbp' (exact, grid above grid_threshold) or 'mbp_grid' "
                             "(grid approximation for every halo), not both")
    return centers


def check_potential_softening(value: Any) -> float | None:
    """None (the default, :data:`POTENTIAL_SOFTENING_LINKS` linking lengths) or a number
    >= 0, else a ParameterError."""
    if value is not None and not value >= 0:
        raise ParameterError(f"potential_softening must be >= 0, got {value!r}")
    return None if value is None else float(value)


def check_n_domains(n_domains: Any, n_particles: int) -> Any:
    """``n_domains`` (a count or three per-axis counts) unchanged when the domains number
    at most the particles (and :data:`~cosmo_dask.core.checks.MAX_CHUNKS`), else a
    ParameterError: a domain is a task in every stage, and an empty one is only cost."""
    from ..core.checks import MAX_CHUNKS

    counts = n_domains if isinstance(n_domains, (tuple, list)) else (n_domains,)
    if not all(isinstance(c, numbers.Integral) and not isinstance(c, bool) and c >= 1
               for c in counts):
        raise ParameterError(f"n_domains must be a positive integer or 3 positive integers, "
                             f"got {n_domains!r}")
    total = math.prod(int(c) for c in counts)
    limit = max(1, min(int(n_particles), MAX_CHUNKS))
    if total > limit:
        bound = (f"the {n_particles} particles" if limit < MAX_CHUNKS
                 else f"{MAX_CHUNKS}, the most allowed")
        raise ParameterError(f"n_domains = {total} is more than {bound} (a domain is a task "
                             f"in every stage): use at most {limit}")
    return n_domains


def check_fof(snap, linking_length: Any = LINKING_LENGTH_DEFAULT, *, absolute: bool = False,
              min_members: Any = MIN_MEMBERS_DEFAULT, min_friends: Any = MIN_FRIENDS_DEFAULT,
              centers: Any = CENTERS_DEFAULT, potential_softening: Any = None,
              n_domains: Any = None) -> tuple[float, tuple[str, ...]]:
    """Check every FOF parameter, reading no particle data; returns (the linking length in
    box units, the centres as a tuple). A ParameterError names the parameter at fault."""
    from ..spatial import domain_grid

    centers = check_centers(centers)
    ll = check_linking_length(snap, linking_length, absolute)
    check_integer(min_members, "min_members", MIN_MEMBERS_MIN)
    # an empty snapshot gives an empty catalog; a non-empty one cannot hold a halo larger
    # than itself
    if snap.n_particles and min_members > max(snap.n_particles, MIN_MEMBERS_MIN):
        raise ParameterError(f"min_members must be at most the {snap.n_particles} particles "
                             f"(a halo holds at most all of them), got {min_members}")
    check_integer(min_friends, "min_friends", MIN_FRIENDS_MIN)
    check_potential_softening(potential_softening)
    if n_domains is not None:
        check_n_domains(n_domains, snap.n_particles)
    if n_domains is not None and snap.box_size is not None:
        ghost = ll if min_friends == 1 else 2 * ll
        domain_grid(n_domains, box_size=snap.box_size).check_ghost_width(
            ghost, what="linking length" if min_friends == 1 else "ghost width")
    return ll, centers


def check_deltas(deltas) -> tuple[str, ...]:
    """The overdensity definitions as a tuple of names, or ParameterError.

    ``deltas`` is one name or a sequence of names out of :data:`DELTAS`
    (surrounding blanks ignored); it must be non-empty and hold no name twice.
    """
    if isinstance(deltas, str):
        deltas = (deltas,)
    try:
        deltas = tuple(str(d).strip() for d in deltas)
    except TypeError:
        raise ParameterError("spherical_overdensity: deltas must be a name or a sequence of "
                             f"names out of {list(DELTAS)}, got {deltas!r}") from None
    if not deltas:
        raise ParameterError(f"spherical_overdensity: deltas is empty; use any of {list(DELTAS)}")
    for d in deltas:
        if d not in DELTAS:
            raise ParameterError(f"spherical_overdensity: unknown delta {d!r}; use any of "
                                 f"{list(DELTAS)}")
    if len(set(deltas)) != len(deltas):
        raise ParameterError(f"spherical_overdensity: repeated delta in {list(deltas)}")
    return deltas


def check_so_profile(n_bins: Any, r_min_factor: Any) -> tuple[int, float]:
    """spherical_overdensity's profile bins (>= :data:`SO_N_BINS_MIN`) and inner edge (in
    (0, 1) R_200c), else a ParameterError."""
    n_bins = int(n_bins)
    if n_bins < SO_N_BINS_MIN:
        raise ParameterError(f"spherical_overdensity: n_bins must be >= {SO_N_BINS_MIN}, "
                             f"got {n_bins}")
    if not (0 < float(r_min_factor) < 1):
        raise ParameterError("spherical_overdensity: r_min_factor must be in (0, 1), got "
                             f"{r_min_factor}")
    return n_bins, float(r_min_factor)


# ----------------------------------------------------------------------------- HOD
#: the halo occupation models ``populate_hod`` knows
HOD_MODELS = ("zheng07",)
#: each model's parameters and defaults: Zheng et al. (2007) Table 1, the M_r < -20 SDSS
#: sample (the defaults of halotools' ``Zheng07`` at threshold -20); masses as log10 of
#: M in Msun/h
HOD_DEFAULTS = {"zheng07": {"logMmin": 12.02, "sigma_logM": 0.26, "logM0": 11.38,
                            "logM1": 13.31, "alpha": 1.06}}
#: where ``populate_hod`` puts satellites: on member particles, or on an NFW profile
HOD_SATELLITES = ("particles", "nfw")
#: the catalog masses ``populate_hod`` can use, in its order of preference when none is
#: named: the spherical-overdensity masses (``cosmo-dask halos --so``), then the FOF mass
HOD_MASSES = ("M_vir", "M_200m", "M_200c", "mass")
#: the range allowed for the log10 masses (Msun/h) of the HOD parameters
HOD_LOG_MASS_RANGE = (0.0, 20.0)


def check_hod(model: Any = "zheng07", params: Any = None, satellites: Any = "particles",
              seed: Any = 0, mass: Any = None) -> tuple[str, dict[str, float], str, int]:
    """(model, its full parameter dict, satellites, seed) for ``populate_hod``, or a
    one-line ParameterError naming the value at fault: an unknown model, parameter key or
    satellite placement; a parameter not a finite number; ``sigma_logM <= 0``; ``alpha <
    0``; a log10 mass outside :data:`HOD_LOG_MASS_RANGE` (``M1 = 10**logM1`` is then > 0);
    a negative seed; a mass variable not in :data:`HOD_MASSES`. ``params`` may give only
    some parameters; the others take the model's defaults."""
    if model not in HOD_MODELS:
        raise ParameterError(f"populate_hod: unknown model {model!r}; use one of "
                             f"{list(HOD_MODELS)}")
    defaults = HOD_DEFAULTS[model]
    if params is None:
        params = {}
    if not hasattr(params, "items"):
        raise ParameterError(f"populate_hod: params must be a mapping of {list(defaults)} "
                             f"to numbers, got {params!r}")
    unknown = [k for k in params if k not in defaults]
    if unknown:
        raise ParameterError(f"populate_hod: unknown {model} parameter {unknown[0]!r}; its "
                             f"parameters are {list(defaults)}")
    out = dict(defaults)
    lo, hi = HOD_LOG_MASS_RANGE
    for key, value in params.items():
        value = check_finite(value, f"populate_hod: {key}")
        if key.startswith("logM") and not lo <= value <= hi:
            raise ParameterError(f"populate_hod: {key} = {value:g} is outside [{lo:g}, "
                                 f"{hi:g}] (log10 of a mass in Msun/h)")
        out[key] = value
    if not out["sigma_logM"] > 0:
        raise ParameterError(f"populate_hod: sigma_logM must be > 0, got {out['sigma_logM']:g}")
    if not out["alpha"] >= 0:
        raise ParameterError(f"populate_hod: alpha must be >= 0, got {out['alpha']:g}")
    if satellites not in HOD_SATELLITES:
        raise ParameterError(f"populate_hod: satellites must be one of "
                             f"{list(HOD_SATELLITES)}, got {satellites!r}")
    if mass is not None and mass not in HOD_MASSES:
        raise ParameterError(f"populate_hod: mass must be one of {list(HOD_MASSES)} (or None: "
                             f"the first the catalog has), got {mass!r}")
    return model, out, satellites, check_seed(seed)


# --------------------------------------------------------------------------- merger trees
#: member count above which a halo's member potentials (for the binding-energy ranking
#: stored at simulation outputs) come from the grid-Poisson approximation
#: (``center_kernels.grid_potential``, trilinear at the members) instead of the exact
#: pair sum of ``center_kernels.segment_potentials`` (n^2 work)
MEMBERS_EXACT_MAX = 20_000
#: nodes per axis of that grid
MEMBERS_GRID_NODES = 64
#: most-bound members of each progenitor followed to the next output (merger_tree)
N_TRACERS_DEFAULT = 20
#: the id shuffle's buckets: about this many tracer + member rows per bucket task
TREE_BUCKET_ROWS = 1 << 21
#: which progenitor continues a main branch: the most massive one, or the one that gave
#: the descendant the most tracers
MAIN_PROGENITOR = ("mass", "shared")


def check_n_tracers(value: Any) -> int:
    """``n_tracers`` of :func:`cosmo_dask.halos.merger_tree`: an integer >= 1."""
    return check_integer(value, "n_tracers", 1)


def check_n_buckets(value: Any) -> int | None:
    """``n_buckets`` of the id shuffle: None (automatic) or an integer >= 1."""
    return None if value is None else check_integer(value, "n_buckets", 1)


def check_main_progenitor(value: Any) -> str:
    """``by`` of :meth:`MergerTree.main_branch`: one of :data:`MAIN_PROGENITOR`."""
    if value not in MAIN_PROGENITOR:
        raise ParameterError(f"by must be one of {', '.join(MAIN_PROGENITOR)}, got {value!r}")
    return value
# ----------------------------------------------------------------------------- subhalos
#: the subhalo finders ``subhalos`` knows: a phase-space (6-D) friends-of-friends inside
#: each host, hierarchical as in ROCKSTAR, with iterative unbinding
SUBHALO_METHODS = ("6dfof",)
#: smallest bound subhalo kept (bound particles), default and lower bound
SUBHALO_MIN_MEMBERS_DEFAULT = 20
SUBHALO_MIN_MEMBERS_MIN = 5
#: the fraction of a group's particles that its 6-D linking length links to at least one
#: other (the adaptive linking length of ROCKSTAR, Behroozi et al. 2013: 0.7)
SUBHALO_LINK_FRACTION_DEFAULT = 0.7
#: candidates with more members than this get their unbinding potentials from the octree
#: (``gravity.dispatch.tree_forces``), smaller ones the exact pairwise sum
#: (``halos.dispatch.segment_potentials``)
SUBHALO_TREE_THRESHOLD_DEFAULT = 20000
#: the opening angle of that octree
SUBHALO_THETA_DEFAULT = 0.5


def check_subhalos(snap, halos, *, method: Any = "6dfof", min_members: Any =
                   SUBHALO_MIN_MEMBERS_DEFAULT, link_fraction: Any =
                   SUBHALO_LINK_FRACTION_DEFAULT, softening: Any = None,
                   tree_threshold: Any = SUBHALO_TREE_THRESHOLD_DEFAULT,
                   n_batches: Any = None) -> float:
    """Check ``subhalos``' parameters and that ``halos`` (a HaloResult) is of ``snap``,
    reading no particle data; returns the potential softening (length units). A one-line
    ParameterError names the parameter or input at fault."""
    if method not in SUBHALO_METHODS:
        raise ParameterError(f"subhalos: unknown method {method!r}; use one of "
                             f"{list(SUBHALO_METHODS)}")
    check_integer(min_members, "subhalos: min_members", SUBHALO_MIN_MEMBERS_MIN)
    f = check_finite(link_fraction, "subhalos: link_fraction")
    if not 0 < f < 1:
        raise ParameterError(f"subhalos: link_fraction must be in (0, 1), got {f:g}")
    check_integer(tree_threshold, "subhalos: tree_threshold", 2)
    if n_batches is not None:
        check_integer(n_batches, "subhalos: n_batches", 1)
    where = halos.parameters.get("snapshot") or "the halo catalog"
    if snap.vel is None:
        raise ParameterError(f"subhalos: the snapshot ({snap.source or 'in memory'}) has no "
                             "velocities; unbinding needs them")
    n_labels = int(halos.labels.shape[0])
    if n_labels != snap.n_particles:
        raise ParameterError(f"subhalos: {where} labels {n_labels} particles but the snapshot "
                             f"has {snap.n_particles}: give the halos of this snapshot")
    box = halos.catalog.attrs.get("box_size")
    same = (box is None and snap.box_size is None) or (
        box is not None and snap.box_size is not None
        and math.isclose(float(box), float(snap.box_size), rel_tol=1e-9))
    if not same:
        raise ParameterError(f"subhalos: {where} has box_size {box} but the snapshot has "
                             f"{snap.box_size}: give the halos of this snapshot")
    if halos.n_halos == 0:
        raise ParameterError(f"subhalos: {where} has no halos; there is nothing to split")
    if softening is None:
        ll = halos.catalog.attrs.get("linking_length")
        soft = halos.catalog.attrs.get("potential_softening")
        if soft is None and ll is None:
            raise ParameterError("subhalos: the halo catalog records neither its potential "
                                 "softening nor its linking length; give softening=")
        return float(soft if soft is not None else POTENTIAL_SOFTENING_LINKS * float(ll))
    return check_positive(softening, "subhalos: softening", allow_zero=True)
