"""Two-point correlation functions of particles in a periodic box, by pair counts.

Estimator (the natural one with the analytic random pairs of a periodic box):
``xi = DD / RR - 1``, where ``DD`` counts the pairs in a bin and ``RR`` is the number
expected for an unclustered set, ``RR = P V_bin / V``: ``P = N (N - 1) / 2`` distinct
pairs for an auto count, ``N1 N2`` for a cross count, ``V_bin = 4 pi (r_hi^3 - r_lo^3) / 3``
the shell volume (times ``mu_hi - mu_lo`` in a ``(s, mu)`` bin, ``mu`` in ``[0, 1]``: the
two signs of ``mu`` fold together) and ``V = L^3``.

Pair convention: ``dd`` of an auto count is the number of *distinct* pairs in the bin
(each pair once); Corrfunc's ``theory.DD`` with ``autocorr=1`` reports ordered pairs,
``2 dd``. A cross count ``dd`` counts every (first set, second set) pair once. A pair is
in bin ``b`` when ``r_b <= r < r_{b+1}`` (squared float64 separations against squared
edges, the minimum image): the counts equal Corrfunc's on the same particles
(``tests/analysis/test_correlation.py``).

Multipoles (``mu_bins`` spanning ``[0, 1]``): ``xi_l(s) = (2 l + 1) sum_m xi(s, mu_m)
int_{mu_m}^{mu_m+1} L_l(mu) dmu`` with ``xi`` constant in each ``mu`` bin (the integral of
the Legendre polynomial is exact), ``mu = |r . los| / |r|`` (plane-parallel line of
sight).

Distribution (:mod:`cosmo_dask.spatial.layout`): the particles are cut into the domains
of a grid with a ghost shell ``r_max`` wide (``xi-split``/``xi-domain`` tasks); each
domain counts the pairs whose first member it owns (``xi-count``, kernel
:data:`cosmo_dask.analysis.dispatch.pair_count`: numba on NumPy chunks, CUDA on CuPy
chunks), and one ``xi-sum`` task adds the per-domain histograms. Every pair closer than
``r_max`` lies in the domain (plus ghosts) of each of its members, so the counts do not
depend on the number of domains. A cross count cuts the first set without ghosts and
the second with them, on the same grid.

Cost: about ``7.8 N n r_max^3`` squared separations for an auto count (``n`` the number
density; half of the 125 neighbour cells of side ``r_max / 2``, 3.7 times the distinct
pairs within ``r_max``), and one comparison per edge for each pair within ``r_max``. Memory:
a domain with its ghosts, about 70 bytes per particle in the kernel.
"""

from __future__ import annotations

import math
import os

import numpy as np
import xarray as xr
from dask.base import tokenize

from ..core.backend import array_module, particle_rows
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from ..density.parameters import check_box_size
from ..plot.correlation import plot_correlation_function  # noqa: F401  (public here)
from ..spatial import decompose, domain_grid
from ..store.zarr_read import open_dataset_store
from ..store.zarr_write import write_dataset_store
from ..units.products import product_units
from . import dispatch as kernels
from .pair_count_kernels import cell_geometry
from .parameters import check_los_poles, check_mu_bins, check_r_bins

__all__ = ["FORMAT", "correlation_function", "legendre_integrals", "open_correlation",
           "plot_correlation_function", "write_correlation"]

#: the ``format`` attribute of a correlation store (``cosmo-dask xi``)
FORMAT = "cosmo_dask.correlation"
FORMAT_VERSION = 1

#: particles per domain aimed at by the default domain count
DOMAIN_PARTICLES = 2**22
#: at most this many domains per axis by default
MAX_DOMAIN_CUBE = 8


def legendre_integrals(ell: int, mu_edges: np.ndarray) -> np.ndarray:
    """``int_{mu_m}^{mu_m+1} L_ell(mu) dmu`` for every ``mu`` bin (exact; ell = 0, 2, 4)."""
    x = np.asarray(mu_edges, dtype=np.float64)
    if ell == 0:
        prim = x
    elif ell == 2:
        prim = 0.5 * (x**3 - x)
    elif ell == 4:
        prim = (7 * x**5 - 10 * x**3 + 3 * x) / 8
    else:
        raise ParameterError(f"legendre_integrals: ell must be 0, 2 or 4, got {ell}")
    return np.diff(prim)


def _default_domains(n: int, box: float, r_max: float) -> int:
    """A cube number of domains: one below :data:`DOMAIN_PARTICLES` particles, else about
    ``n / DOMAIN_PARTICLES`` (at most ``MAX_DOMAIN_CUBE^3``), with sides above r_max."""
    if n <= DOMAIN_PARTICLES:
        return 1
    cube = min(MAX_DOMAIN_CUBE, math.ceil((n / DOMAIN_PARTICLES) ** (1 / 3) - 1e-9))
    while cube > 1 and r_max >= box / cube:
        cube -= 1
    return cube**3


def _domain_geometry(grid, domain: int, r_max: float, n: int) -> np.ndarray:
    nx, ny, nz = grid.shape
    idx = np.array([domain // (ny * nz), (domain // nz) % ny, domain % nz])
    lo = np.asarray(grid.origin) + idx * grid.width
    return cell_geometry(grid.box_size, r_max, lo, grid.width, grid.shape, n)


def _count(part, part2, grid, r_edges, mu_edges, los, box):
    """``xi-count``: one domain's pair counts (host int64 (nr, nmu))."""
    m = part.pos.shape[0] + (0 if part2 is None else part2.pos.shape[0])
    geo = _domain_geometry(grid, part.domain, float(r_edges[-1]), m)
    if part2 is None:
        return kernels.pair_count(part.pos, part.n_owned, geo, r_edges, mu_edges, los, box)
    pos2 = part2.pos
    if array_module(pos2) is not array_module(part.pos):
        pos2 = array_module(part.pos).asarray(pos2)
    return kernels.pair_count(part.pos, part.n_owned, geo, r_edges, mu_edges, los, box,
                              pos2=pos2)


def _sum(*hists) -> np.ndarray:
    """``xi-sum``: the domains' histograms added."""
    return np.sum(np.stack(hists), axis=0)


def _positions(data, box_size, what):
    """(dask positions, box or None, n, length unit or None) of a Snapshot-like object or
    an (N, 3) array."""
    from ..store.snapshot import particles_of

    pos, _, box, snap = particles_of(data, None, box_size, what=what)
    unit = (snap.units or {}).get("length") if snap is not None else None
    pos, _, n = particle_rows(pos, None, what)
    return pos, box, n, unit


def check_correlation(data, r_bins, *, data2=None, box_size=None, mu_bins=None, los=None,
                      poles=(0,), n_domains=None, length_unit=None) -> dict:
    """Every check of :func:`correlation_function` (same parameters), before any work:
    the inputs' shapes and box, the bins, the line of sight and multipoles, the domains.
    Returns what the computation needs (positions, box, edges, grid, ...); raises a
    one-line ParameterError otherwise. ``cosmo-dask xi`` runs it before a cluster starts.
    """
    from ..store.snapshot import Snapshot

    what = "correlation_function"
    pos, box, n, unit = _positions(data, box_size, what)
    if box is None:
        raise ParameterError(f"{what}: the positions need a periodic box: pass box_size= "
                             "(the side of [0, box_size)^3)")
    box = check_box_size(box, what)
    if data2 is not None:
        pos2, box2, n2, _ = _positions(data2, box if not isinstance(data2, Snapshot)
                                       or data2.box_size is None else None, what)
        if box2 is None or not math.isclose(float(box2), box, rel_tol=1e-12):
            raise ParameterError(f"{what}: data2's box_size {box2!r} differs from data's "
                                 f"{box:g}")
    r_edges = check_r_bins(r_bins, box, what)
    r_max = float(r_edges[-1])
    if mu_bins is None:
        if los is not None:
            raise ParameterError(f"{what}: los= needs mu_bins= (the mu bins of xi(s, mu))")
        if tuple(np.atleast_1d(poles)) != (0,):
            raise ParameterError(f"{what}: multipoles need mu_bins= and los=")
        mu_edges, los_v, poles = None, None, (0,)
    else:
        mu_edges = check_mu_bins(mu_bins, what)
        if los is None:
            raise ParameterError(f"{what}: mu_bins= needs a line of sight: pass los= (an "
                                 "axis 0/1/2 or 'x'/'y'/'z', or a vector)")
        los_v, poles = check_los_poles(los, poles, what)
        if (mu_edges[0] != 0.0 or mu_edges[-1] != 1.0) and poles != (0,):
            raise ParameterError(f"{what}: multipoles need mu bins spanning [0, 1], got "
                                 f"[{mu_edges[0]:g}, {mu_edges[-1]:g}]")
    if length_unit is None:
        length_unit = unit
    pu = product_units({"length": length_unit} if length_unit else None)
    if n_domains is None:
        n_all = n + (n2 if data2 is not None else 0)
        n_domains = _default_domains(n_all, box, r_max)
    grid = domain_grid(n_domains, box_size=box)
    grid.check_ghost_width(r_max, what=f"{what}: r_max")
    return {"pos": pos, "n": n, "box": box, "pos2": pos2 if data2 is not None else None,
            "n2": n2 if data2 is not None else None, "r_edges": r_edges,
            "mu_edges": mu_edges, "los": los_v, "poles": poles, "units": pu, "grid": grid}


def correlation_function(data, r_bins, *, data2=None, box_size=None, mu_bins=None,
                         los=None, poles=(0,), n_domains=None,
                         length_unit=None) -> xr.Dataset:
    """Pair counts and the two-point correlation function of a periodic particle set.

    Parameters
    ----------
    data : Snapshot, Snapshot-like or array (N, 3)
        Positions in a periodic box ``[0, L)^3`` (a snapshot, a galaxy catalog from
        :func:`cosmo_dask.halos.populate_hod`, or NumPy/CuPy/dask positions; CuPy
        chunks count on the GPU).
    r_bins : array of edges
        Separation (``s`` with ``mu_bins``) bin edges in the positions' length unit,
        increasing, ``>= 0``, the last (``r_max``) at most ``L / 2``.
    data2 : like ``data``, optional
        A second set: cross pair counts ``data x data2`` (same box).
    box_size : float, optional
        The box side ``L`` (default: the snapshot's; required for raw positions).
    mu_bins : int or array of edges, optional
        ``mu`` bins on ``[0, 1]`` (a number of equal bins or edges): counts and ``xi`` in
        ``(s, mu)`` bins along the line of sight ``los``; multipoles need them to span
        ``[0, 1]``.
    los : int, str or 3-vector, optional
        Line of sight: an axis (0/1/2, "x"/"y"/"z") or a vector (required with
        ``mu_bins``).
    poles : tuple of int
        Legendre multipoles among 0, 2, 4 computed from ``xi(s, mu)`` (with ``mu_bins``
        spanning ``[0, 1]``).
    n_domains : int or (int, int, int), optional
        Domains of the layout (one ``xi-count`` task each; sides above ``r_max``).
        Default: one up to 2^22 particles, else about one per 2^22 particles (a cube
        number, at most 512). The counts do not depend on it.
    length_unit : str, optional
        Unit of positions and box (default: the snapshot's ``units["length"]``, else
        ``"input length"``).

    Returns
    -------
    xarray.Dataset
        Dimension ``r`` (and ``mu``): coordinates ``r`` (bin centre), ``r_min``,
        ``r_max`` (and ``mu``, ``mu_min``, ``mu_max``); ``dd`` (int64 pair counts, the
        convention of the module docstring), ``rr`` (analytic random pairs), ``xi``
        (``dd / rr - 1``), and with ``mu_bins`` spanning ``[0, 1]`` ``multipoles``
        ``(ell, r)`` and the coordinate ``ell``. Attributes: ``box_size``,
        ``length_unit``, ``n_particles`` (and ``n_particles2``), ``r_edges``,
        ``mu_edges``, ``los``, ``auto``, ``n_domains``, ``pair_convention``,
        ``estimator``. Every variable has ``units``.

    Raises
    ------
    ParameterError
        No periodic box, ``r_max`` above ``L / 2``, non-increasing or negative edges,
        ``mu`` bins outside ``[0, 1]``, multipoles without ``mu`` bins spanning
        ``[0, 1]``, a bad line of sight, or domains narrower than ``r_max``: before any
        work.
    """
    c = check_correlation(data, r_bins, data2=data2, box_size=box_size, mu_bins=mu_bins,
                          los=los, poles=poles, n_domains=n_domains, length_unit=length_unit)
    pos, n, box, pos2, n2 = c["pos"], c["n"], c["box"], c["pos2"], c["n2"]
    r_edges, mu_edges, los_v, poles = c["r_edges"], c["mu_edges"], c["los"], c["poles"]
    pu, grid = c["units"], c["grid"]
    r_max = float(r_edges[-1])
    auto = data2 is None
    g_inputs = []
    if auto:
        parts = decompose(pos, grid, ghost_width=r_max, name="xi").exchange()
        parts2 = [None] * len(parts)
        g_inputs = parts
    else:
        parts = decompose(pos, grid, ghost_width=0.0, name="xi").exchange()
        parts2 = decompose(pos2, grid, ghost_width=r_max, name="xi2").exchange()
        g_inputs = parts + parts2
    token = tokenize([p.key for p in g_inputs], r_edges, mu_edges, los_v, box, grid)
    g = TaskGraph(g_inputs)
    counts = [g.add((f"xi-count-{token}", d), _count, g.ref(p),
                    None if p2 is None else g.ref(p2), grid, r_edges, mu_edges, los_v, box)
              for d, (p, p2) in enumerate(zip(parts, parts2, strict=True))]
    total = g.add(f"xi-sum-{token}", _sum, *counts)
    (hist,) = g.compute([total.key], label="pair counts")
    hist = np.asarray(hist, dtype=np.int64)
    if auto:  # ordered pairs with an owned first member, summed: each pair twice
        dd = hist // 2
        pairs = 0.5 * n * (n - 1.0)
    else:
        dd = hist
        pairs = float(n) * float(n2)
    shell = 4.0 * np.pi / 3.0 * np.diff(r_edges**3)
    volume = box**3
    length = pu["length"]
    r_attrs = {"units": length}
    coords = {"r": ("r", 0.5 * (r_edges[1:] + r_edges[:-1]),
                    {"units": length, "long_name": "bin centre (separation s with mu)"}),
              "r_min": ("r", r_edges[:-1], r_attrs), "r_max": ("r", r_edges[1:], r_attrs)}
    with np.errstate(divide="ignore", invalid="ignore"):
        if mu_edges is None:
            rr = pairs * shell / volume
            dims = ("r",)
            dd_out = dd[:, 0]
        else:
            rr = pairs * shell[:, None] * np.diff(mu_edges)[None, :] / volume
            dims = ("r", "mu")
            dd_out = dd
            coords.update({"mu": ("mu", 0.5 * (mu_edges[1:] + mu_edges[:-1]), {"units": "1"}),
                           "mu_min": ("mu", mu_edges[:-1], {"units": "1"}),
                           "mu_max": ("mu", mu_edges[1:], {"units": "1"})})
        xi = np.where(rr > 0, dd_out / rr - 1.0, np.nan)
    data_vars = {
        "dd": (dims, dd_out, {"units": "1", "long_name": (
            "distinct pairs in the bin" if auto else "cross pairs in the bin")}),
        "rr": (dims, rr, {"units": "1", "long_name": "random pairs of a periodic box "
                          "(analytic)"}),
        "xi": (dims, xi, {"units": "1", "long_name": "DD / RR - 1"}),
    }
    if mu_edges is not None and mu_edges[0] == 0.0 and mu_edges[-1] == 1.0:
        mult = np.stack([(2 * ell + 1) * (xi * legendre_integrals(ell, mu_edges)).sum(axis=1)
                         for ell in poles])
        data_vars["multipoles"] = (("ell", "r"), mult, {"units": "1",
                                                        "long_name": "xi_ell(s)"})
        coords["ell"] = ("ell", np.asarray(poles, dtype=np.int64), {"units": "1"})
    attrs = {
        "box_size": box, "length_unit": length, "n_particles": int(n),
        "r_edges": [float(e) for e in r_edges],
        "mu_edges": [] if mu_edges is None else [float(e) for e in mu_edges],
        "los": [] if los_v is None else [float(v) for v in los_v],
        "auto": int(auto), "n_domains": list(grid.shape),
        "pair_convention": ("distinct pairs, each once (Corrfunc theory.DD autocorr=1 "
                            "npairs = 2 dd)" if auto else "every (data, data2) pair once"),
        "estimator": "natural: DD / RR - 1, RR analytic (periodic box)",
    }
    if not auto:
        attrs["n_particles2"] = int(n2)
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def write_correlation(ds: xr.Dataset, path: str | os.PathLike, *, overwrite: bool = False,
                      inputs=()) -> str:
    """Write a :func:`correlation_function` Dataset to a Zarr v3 store, atomically (group
    ``xi``, every chunk checksummed in the chunk manifest); returns the path."""
    return write_dataset_store(ds, path, group="xi", fmt=FORMAT, version=FORMAT_VERSION,
                               what="correlation store", overwrite=overwrite, inputs=inputs)


def open_correlation(path: str | os.PathLike) -> xr.Dataset:
    """The Dataset of a correlation store written by :func:`write_correlation` (loaded;
    chunks checked against their checksums)."""
    return open_dataset_store(path, group="xi", fmt=FORMAT, version=FORMAT_VERSION,
                              what="correlation store")
