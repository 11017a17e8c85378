"""The observer's past light cone, recorded on the fly by :func:`cosmo_dask.simulation.run`.

Geometry (comoving, the run's length units, Mpc/h):

* ``chi(a) = (c / H0) int_a^1 da' / (a'^2 E(a'))``, the comoving distance light travels
  to the observer between ``a`` and today, from the one ``E(a)``
  (:func:`cosmo_dask.units.hubble.hubble_e`), tabulated once per run
  (:class:`Distances`, a cubic spline in ``ln a``) with its inverse.
* In the KDK step ``a0 -> a1`` each particle moves on the straight line
  ``x(a) = x0 + u(a) (x1 - x0)``, ``x1 = x0 + Dr(a0 -> a1) p_half`` unwrapped, with the
  drift fraction ``u(a) = Dr(a0 -> a) / Dr(a0 -> a1)`` of the run's own drift factors:
  this is exactly where the leapfrog's drift puts the particle at ``a`` (the momentum is
  constant during the drift), so the crossing is found on the integrator's trajectory,
  not on a path linear in ``a``.
* A particle (or one of its periodic images ``x + n L``) crosses the light cone when
  ``f(u) = |x(u) + n L - o| - chi(a(u))`` changes sign: ``f(0) < 0 <= f(1)`` (each crossing
  is counted in exactly one step: ``f(1)`` is computed from the drift's own wrapped, cast
  end positions, exactly as the next step computes its ``f(0)``; in the step where
  ``chi`` passes ``chi(z_max)`` the bracket starts there instead of at ``u = 0``, so no
  crossing beyond it is computed).
  ``chi(a(u))`` is tabulated per step on :data:`STEP_POINTS` points uniform in ``a``; the
  root is found by regula falsi from the linear interpolation between the bracket's ends
  (:data:`ROOT_ITERATIONS` more steps; ``f`` is nearly linear in ``u``: one step already
  brings the residual down to the table's own interpolation error, below 1e-3 Mpc/h for
  a step from z = 0.16 to 0).
* Images: per step the replicas ``n`` whose cube ``[n L, (n + 1) L)^3`` widened by one
  box side (the drift's allowance; a chunk drifting farther makes its own list) can meet
  the shell ``[chi(a1), min(chi(a0), chi_max)]`` (:func:`replica_shifts`); per chunk
  those that the chunk's bounding box (start and end of its drift) meets; per particle
  the sign change above.
* Recorded per crossing: the position relative to the observer (comoving, Mpc/h), the
  peculiar velocity ``p_half / a_cross`` (km/s), the id and the redshift of crossing;
  only crossings with ``chi(a_cross) <= chi(z_max)``.

Array code is written once over the chunk's array module (NumPy or CuPy): a GPU run
records its crossings on the GPU, and only their counts come to the client per step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import dask.array as da
import numpy as np
from scipy import integrate, interpolate

from ..core.backend import array_module, empty_meta, host
from ..core.errors import ParameterError, SnapshotError
from ..units import factor
from .dispatch import drift_block

#: speed of light in km/s
SPEED_OF_LIGHT_KMS = 299792.458
#: keys of ``run(..., lightcone={...})``
LIGHTCONE_KEYS = ("z_max", "observer")
#: points per step of the (u, a, chi) table
STEP_POINTS = 129
#: regula falsi steps after the first linear interpolation
ROOT_ITERATIONS = 2
#: store format of one step's piece under ``sim/lightcone/``
PIECE_FORMAT = "cosmo_dask.lightcone_piece"
PIECE_VERSION = 1
#: the arrays of a lightcone and their units keys
ARRAYS = ("pos", "vel", "ids", "redshift")


# ----------------------------------------------------------------------------- parameters
def check_lightcone(lightcone, *, box_size: float, z_ics: float, z_final: float) -> dict | None:
    """The resolved ``{"z_max": float, "observer": [x, y, z]}`` of ``run(lightcone=...)``.

    ``observer`` defaults to the box centre (the replicas then surround it evenly: the
    fewest images for a given ``z_max``).

    Raises
    ------
    ParameterError
        One line: not a mapping, unknown keys, non-numbers, ``z_max`` beyond the ICs'
        redshift or not above ``z_final``, an observer outside ``[0, box_size)^3``.
    """
    if lightcone is None:
        return None
    if not isinstance(lightcone, Mapping):
        raise ParameterError(f"lightcone must be a dict {{'z_max': Z, 'observer': (x, y, z)}}, "
                             f"got {type(lightcone).__name__}")
    unknown = sorted(str(k) for k in lightcone if k not in LIGHTCONE_KEYS)
    if unknown:
        raise ParameterError(f"lightcone: unknown key(s) {', '.join(unknown)}; valid keys: "
                             f"{', '.join(LIGHTCONE_KEYS)}")
    if "z_max" not in lightcone:
        raise ParameterError("lightcone: 'z_max' is required (the largest redshift recorded)")
    z_max = lightcone["z_max"]
    if isinstance(z_max, bool) or not isinstance(z_max, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(z_max)):
        raise ParameterError(f"lightcone: z_max must be a finite number, got {z_max!r}")
    z_max = float(z_max)
    if z_max > z_ics * (1 + 1e-12):
        raise ParameterError(f"lightcone: z_max = {z_max:g} lies beyond the ICs' redshift "
                             f"z = {z_ics:.6g}; the run cannot record it (z_max <= {z_ics:.6g})")
    if not z_max > z_final:
        raise ParameterError(f"lightcone: z_max = {z_max:g} must be above z_final = "
                             f"{z_final:g}")
    observer = lightcone.get("observer")
    if observer is None:
        obs = [0.5 * box_size] * 3
    else:
        try:
            values = list(observer)
        except TypeError:
            values = None
        ok = values is not None and len(values) == 3 and all(
            not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
            and math.isfinite(float(v)) for v in values)
        if not ok:
            raise ParameterError(f"lightcone: observer must be three finite numbers (x, y, z) "
                                 f"in the box's length units, got {observer!r}")
        obs = [float(v) for v in values]
        if not all(0.0 <= v < box_size for v in obs):
            raise ParameterError(f"lightcone: observer {tuple(obs)} lies outside the box "
                                 f"[0, {box_size:g})^3")
    return {"z_max": z_max, "observer": obs}


def speed_of_light(units: Mapping[str, str] | None) -> float:
    """``c`` in the snapshot's velocity unit."""
    return SPEED_OF_LIGHT_KMS * factor("km/s", (units or {}).get("velocity", "km/s"),
                                       "velocity")


# ----------------------------------------------------------------------------- distances
class Distances:
    """Comoving distance ``chi(a)`` to the observer and its inverse, tabulated once.

    Parameters
    ----------
    cosmology : Cosmology
    h0 : float
        ``H0`` in the run's velocity / length units (100 for km/s and Mpc/h).
    c : float
        Speed of light in the run's velocity units.
    a_min, a_max : float
        Range of scale factors tabulated (``a_max`` may exceed 1: ``chi < 0`` there).
    n : int
        Table nodes, geometric in ``a``; each interval integrated by quadrature, then a
        cubic spline in ``ln a`` (relative error below 1e-10 at 2049 nodes).
    """

    def __init__(self, cosmology, h0: float, c: float, a_min: float, a_max: float = 1.0,
                 n: int = 2049):
        self.cosmology, self.h0, self.c = cosmology, float(h0), float(c)
        lo, hi = min(a_min, 1.0) * (1 - 1e-6), max(a_max, 1.0) * (1 + 1e-6)
        a = np.geomspace(lo, hi, n)
        scale = self.c / self.h0

        def integrand(x):
            return scale / (x * x * float(cosmology.E(x)))

        pieces = np.array([integrate.quad(integrand, a[i], a[i + 1], epsabs=0.0,
                                          epsrel=1e-12)[0] for i in range(n - 1)])
        below = np.concatenate([[0.0], np.cumsum(pieces)])  # int_lo^a
        i1 = np.searchsorted(a, 1.0)
        at_one = below[i1 - 1] + integrate.quad(integrand, a[i1 - 1], 1.0, epsabs=0.0,
                                                epsrel=1e-12)[0]
        chi = at_one - below  # int_a^1
        self._chi = interpolate.CubicSpline(np.log(a), chi)
        self._lna = interpolate.CubicSpline(chi[::-1], np.log(a)[::-1])
        self.a_range = (float(lo), float(hi))

    def chi(self, a):
        """Comoving distance (length units) light travels from ``a`` to ``a = 1``."""
        return self._chi(np.log(np.asarray(a, dtype=np.float64)))

    def a_of_chi(self, chi):
        """Inverse of :meth:`chi`."""
        return np.exp(self._lna(np.asarray(chi, dtype=np.float64)))

    def chi_of_z(self, z):
        return self.chi(1.0 / (1.0 + np.asarray(z, dtype=np.float64)))


# ----------------------------------------------------------------------------- replicas
def _cube_distances(lo, hi, observer):
    """Smallest and largest distance from ``observer`` to boxes ``[lo, hi]`` (K x 3)."""
    near = np.maximum(np.maximum(lo - observer, observer - hi), 0.0)
    far = np.maximum(np.abs(lo - observer), np.abs(hi - observer))
    return np.sqrt((near * near).sum(axis=1)), np.sqrt((far * far).sum(axis=1))


def replica_shifts(observer, box_size: float, chi_lo: float, chi_hi: float,
                   margin: float = 0.0) -> np.ndarray:
    """Integer shifts ``n`` (K x 3) of the box images ``[n L, (n + 1) L)^3`` widened by
    ``margin`` on every side that meet the spherical shell ``chi_lo <= r <= chi_hi``
    around ``observer``."""
    obs = np.asarray(observer, dtype=np.float64)
    if chi_hi < chi_lo or chi_hi < 0:
        return np.zeros((0, 3), dtype=np.int64)
    m = int(math.ceil((chi_hi + margin) / box_size)) + 1
    r = np.arange(-m, m + 1)
    n = np.stack(np.meshgrid(r, r, r, indexing="ij"), axis=-1).reshape(-1, 3)
    lo = n * box_size - margin
    dmin, dmax = _cube_distances(lo, lo + box_size + 2 * margin, obs)
    return n[(dmin <= chi_hi) & (dmax >= chi_lo)]


# ----------------------------------------------------------------------------- one step
@dataclass(frozen=True)
class StepGeometry:
    """What every chunk of one step needs (host values; a few hundred bytes)."""

    dr: float  # the step's drift factor Dr(a0 -> a1)
    u: np.ndarray  # drift fraction at the table's a
    a: np.ndarray
    chi: np.ndarray
    chi_max: float
    shifts: np.ndarray  # candidate replicas (K x 3), see replica_shifts
    margin: float  # the largest drift |x1 - x0| the candidates allow for
    observer: np.ndarray
    box_size: float


def step_geometry(fac, dist: Distances, a0: float, a1: float, ah: float, chi_max: float,
                  observer, box_size: float, margin: float | None = None):
    """The :class:`StepGeometry` of the step ``a0 -> a1`` (KDK midpoint ``ah``), or None
    when no crossing of it can lie within ``chi_max``."""
    chi0, chi1 = float(dist.chi(a0)), float(dist.chi(a1))
    if chi1 > chi_max:
        return None
    dr = float(fac.drift(a0, a1, ah))
    a = np.linspace(a0, a1, STEP_POINTS)
    u = np.array([float(fac.drift(a0, x, ah)) for x in a[1:-1]]) / dr
    u = np.concatenate([[0.0], u, [1.0]])
    margin = box_size if margin is None else float(margin)
    shifts = replica_shifts(observer, box_size, chi1, min(chi0, chi_max), margin)
    return StepGeometry(dr, u, a, dist.chi(a), float(chi_max), shifts, margin,
                        np.asarray(observer, dtype=np.float64), float(box_size))


def _empty(xp, dtype, id_dtype):
    return (xp.zeros((0, 3), dtype=dtype), xp.zeros((0, 3), dtype=dtype),
            xp.zeros((0,), dtype=id_dtype), xp.zeros((0,), dtype=np.float64))


def cross_block(x0, p_half, ids, geo: StepGeometry):
    """The light-cone crossings of one chunk in one step (NumPy or CuPy chunks).

    Parameters
    ----------
    x0 : (n, 3) array
        Positions at ``a0`` (in the box, comoving).
    p_half : (n, 3) array
        Momenta ``p = a^2 dx/dt`` of the step's drift.
    ids : (n,) array
    geo : StepGeometry

    Returns
    -------
    tuple of arrays
        ``pos`` (m, 3) relative to the observer (length units, the state's dtype),
        ``vel`` (m, 3) peculiar ``p_half / a_cross`` (velocity units), ``ids`` (m,),
        ``redshift`` (m,) float64 of crossing; one row per (particle, image) crossing.
    """
    xp = array_module(x0)
    dtype = x0.dtype
    if x0.shape[0] == 0:
        return _empty(xp, dtype, ids.dtype)
    box, obs = geo.box_size, geo.observer
    x = x0.astype(np.float64)
    d = p_half.astype(np.float64) * geo.dr  # x1 - x0, unwrapped
    x1 = x + d
    # the end of the drift exactly as the next step starts from it (the drift's own
    # wrapped, cast positions) and the image it lies in: the sign test at the step's end
    # and at the next step's start then compute the same numbers, so that a crossing at a
    # step boundary is counted once, neither twice nor never
    xn = drift_block(x0, p_half, geo.dr, box, dtype).astype(np.float64)
    k = xp.rint((x1 - xn) / box)
    slack = 1e-9 * box  # the bounding box holds both ends, whatever their rounding
    lo = host(xp.minimum(x.min(axis=0), x1.min(axis=0))) - slack
    hi = host(xp.maximum(x.max(axis=0), x1.max(axis=0))) + slack
    shifts = geo.shifts
    reach = float(host(xp.sqrt((d * d).sum(axis=1)).max()))
    chi0, chi1 = float(geo.chi[0]), float(geo.chi[-1])
    chi_top = min(chi0, geo.chi_max)
    if chi_top <= 0:  # the whole step after a = 1: nothing to cross
        return _empty(xp, dtype, ids.dtype)
    if reach > geo.margin:  # a drift beyond the per-step allowance: this chunk's own list
        shifts = replica_shifts(obs, box, chi1, chi_top, reach)
    if shifts.shape[0]:  # images the chunk's bounding box (start and end of drift) can meet
        dmin, dmax = _cube_distances(shifts * box + lo, shifts * box + hi, obs)
        shifts = shifts[(dmin <= chi_top) & (dmax >= chi1)]
    if shifts.shape[0] == 0:
        return _empty(xp, dtype, ids.dtype)
    u_tab, a_tab, chi_tab = (xp.asarray(t) for t in (geo.u, geo.a, geo.chi))
    # crossings beyond chi_max are not wanted: where the step starts beyond it, the search
    # starts at u_top, where chi(u_top) = chi_max (the table's own inverse), so that only
    # crossings with u >= u_top (chi <= chi_max) are found
    u_top = float(np.interp(chi_top, geo.chi[::-1], geo.u[::-1])) if chi0 > chi_top else 0.0
    x -= xp.asarray(obs)  # relative to the observer, in the box's own image
    xn -= xp.asarray(obs)
    out = []
    for s in shifts:
        rel0 = x + xp.asarray(s * box)
        start = rel0 + u_top * d if u_top > 0 else rel0
        r0 = (start * start).sum(axis=1)  # squared: the sign change first, roots for hits
        rel1 = xn + (k + xp.asarray(s, dtype=np.float64)) * box  # as the next step's rel0
        r1 = (rel1 * rel1).sum(axis=1)
        hit = xp.nonzero((r0 < chi_top * chi_top) & (r1 >= max(chi1, 0.0) ** 2))[0]
        if hit.size == 0:
            continue
        rel, dd = rel0[hit], d[hit]
        g_lo, g_hi = xp.sqrt(r0[hit]) - chi_top, xp.sqrt(r1[hit]) - chi1
        u_lo, u_hi = xp.full_like(g_lo, u_top), xp.ones_like(g_hi)
        u = u_lo - g_lo * (1.0 - u_top) / (g_hi - g_lo)
        for _ in range(ROOT_ITERATIONS):
            p = rel + u[:, None] * dd
            g = xp.sqrt((p * p).sum(axis=1)) - xp.interp(u, u_tab, chi_tab)
            left = g < 0
            u_lo, g_lo = xp.where(left, u, u_lo), xp.where(left, g, g_lo)
            u_hi, g_hi = xp.where(left, u_hi, u), xp.where(left, g_hi, g)
            span = g_hi - g_lo
            u = xp.where(span > 0, u_lo - g_lo * (u_hi - u_lo) / xp.where(span > 0, span, 1),
                         u)
        u = xp.clip(u, u_top, 1.0)  # rounding: chi(u) <= chi_max stays exact
        a_cross = xp.interp(u, u_tab, a_tab)
        pos = rel + u[:, None] * dd
        vel = p_half[hit].astype(np.float64) / a_cross[:, None]
        out.append((pos.astype(dtype), vel.astype(dtype), ids[hit], 1.0 / a_cross - 1.0))
    if not out:
        return _empty(xp, dtype, ids.dtype)
    return tuple(xp.concatenate([o[k] for o in out]) for k in range(4))


def _count(block) -> int:
    return int(block[0].shape[0])


def step_crossings(pos: da.Array, p_half: da.Array, ids: da.Array, geo: StepGeometry):
    """One step's crossings: ``({"pos", "vel", "ids", "redshift"}: dask arrays, count)``.

    One task per state chunk (:func:`cross_block`) is run and persisted: each chunk's
    crossings stay where they were computed (a worker, a GPU) and only their counts come
    to the client; the arrays have one chunk per state chunk (empty ones included)."""
    from dask.base import tokenize

    from ..core.task_graph import TaskGraph

    ids = ids.rechunk((pos.chunks[0],))
    p_half = p_half.rechunk(pos.chunks)
    token = tokenize(pos.name, p_half.name, ids.name, geo.dr, geo.u, geo.a, geo.chi,
                     geo.chi_max, geo.shifts, geo.margin, geo.observer, geo.box_size)
    g = TaskGraph([pos, p_half, ids])
    keys = [(f"lightcone-cross-{token}", i) for i in range(pos.numblocks[0])]
    for i, key in enumerate(keys):
        g.add(key, cross_block, g.chunk(pos, i, 0), g.chunk(p_half, i, 0), g.chunk(ids, i),
              geo)
    done = g.persist(keys)
    h = TaskGraph(done)
    counts = h.compute([h.add((f"lightcone-count-{token}", i), _count, h.ref(d)).key
                        for i, d in enumerate(done)])
    metas = [(f"lightcone-pos-{token}", 0, (3,), pos._meta),
             (f"lightcone-vel-{token}", 1, (3,), pos._meta),
             (f"lightcone-ids-{token}", 2, (), ids._meta),
             (f"lightcone-redshift-{token}", 3, (), empty_meta(pos._meta, 1, np.float64))]
    arrays = h.item_arrays([d.key for d in done], [int(c) for c in counts], metas)
    return dict(zip(ARRAYS, arrays, strict=True)), int(sum(counts))


# ----------------------------------------------------------------------------- recorder
def piece_name(step: int) -> str:
    return f"step_{step:05d}"


class Recorder:
    """Records the crossings of every step of one run (used by ``run``).

    With a store (``root``), each step with crossings is written as one piece
    ``root/lightcone/step_<NNNNN>/`` (a Zarr v3 group of format :data:`PIECE_FORMAT`,
    arrays pos, vel, ids, redshift, through :func:`cosmo_dask.store.zarr_write.store_arrays`:
    every chunk checksummed) and listed in the manifest's ``lightcone["pieces"]``;
    without one the pieces stay in memory (:meth:`result`).
    """

    def __init__(self, spec: dict, *, fac, cosmology, units, box_size: float, a_min: float,
                 a_max: float, attrs: dict):
        self.spec = spec
        self.fac = fac
        self.observer = np.asarray(spec["observer"], dtype=np.float64)
        self.box_size = float(box_size)
        self.dist = Distances(cosmology, fac.h0, speed_of_light(units), a_min, a_max)
        self.chi_max = float(self.dist.chi_of_z(spec["z_max"]))
        self.attrs = attrs
        self.pieces: list[dict] = []
        self.arrays: list[dict] = []

    def manifest(self) -> dict:
        return {**self.attrs, "chi_max": self.chi_max, "pieces": self.pieces}

    def resume(self, entry: dict | None, step: int) -> None:
        """Keep the stored pieces of steps up to ``step`` (the checkpoint's)."""
        pieces = (entry or {}).get("pieces") or []
        self.pieces = [p for p in pieces if int(p["step"]) <= step]

    def step(self, step: int, a0: float, a1: float, ah: float, pos, p_half, ids, root=None):
        """Record the crossings of step ``step`` (``a0 -> a1``) from the state before its
        drift (``pos``) and the drift's momenta; write them under ``root`` if given."""
        geo = step_geometry(self.fac, self.dist, a0, a1, ah, self.chi_max, self.observer,
                            self.box_size)
        if geo is None:
            return 0
        arrays, n = step_crossings(pos, p_half, ids, geo)
        entry = {"step": int(step), "a_start": float(a0), "a": float(a1), "n": n,
                 "name": piece_name(step) if n else None}
        if root is not None and n:
            write_piece(root / "lightcone" / entry["name"], arrays, entry)
        elif n:
            self.arrays.append(arrays)
        self.pieces = [p for p in self.pieces if p["step"] != step] + [entry]
        return n

    def result(self) -> Lightcone:
        """The in-memory lightcone (run without ``out``)."""
        if self.arrays:
            arrays = {k: da.concatenate([a[k] for a in self.arrays]) for k in ARRAYS}
        else:
            arrays = {k: da.zeros((0, 3) if k in ("pos", "vel") else (0,),
                                  dtype=np.int64 if k == "ids" else np.float64)
                      for k in ARRAYS}
        return Lightcone(arrays, self.manifest(), path=None)


def write_piece(path, arrays: dict, entry: dict) -> None:
    """One step's crossings as a checksummed Zarr v3 group at ``path``, atomically
    (replacing a piece a killed run left there)."""
    import zarr

    from ..store.atomic import atomic_directory
    from ..store.zarr_write import plain_attrs, store_arrays

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(path, overwrite=True, what="lightcone piece",
                          fmt=PIECE_FORMAT) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=plain_attrs(
            {"format": PIECE_FORMAT, "format_version": PIECE_VERSION, **entry}))
        store_arrays(group, arrays, root=tmp, label=f"writing {path}", show=False)


def read_piece(path, entry: dict, verify: bool | None = None) -> dict:
    """The arrays of one stored piece (lazy; chunks checked against their CRC-32 as read)."""
    from ..store.zarr_read import open_product_group, read_array

    group, attrs = open_product_group(path, fmt=PIECE_FORMAT, what="lightcone piece",
                                      version=PIECE_VERSION, verify=verify)
    out = {}
    for name in ARRAYS:
        arr = group.get(name)
        if arr is None or arr.shape[0] != int(entry["n"]):
            raise SnapshotError(f"{path}: lightcone piece lacks '{name}' of "
                                f"{entry['n']} rows (the store was altered)")
        out[name] = read_array(arr, name, str(path), verify=verify)
    return out


# ----------------------------------------------------------------------------- the product
class Lightcone:
    """A recorded light cone: one row per crossing of a particle (or one of its periodic
    images) with the observer's past light cone.

    Attributes
    ----------
    pos : dask.array.Array, (N, 3)
        Comoving position relative to the observer (``units["length"]``, Mpc/h).
    vel : dask.array.Array, (N, 3)
        Peculiar velocity at crossing (``units["velocity"]``, km/s).
    ids : dask.array.Array, (N,)
        Particle ids (an id appears once per image that crosses).
    redshift : dask.array.Array, (N,)
        Redshift of crossing (float64).
    observer : tuple of float
        The observer in the box (length units).
    z_max, box_size, units, cosmology, chi_max, path
    """

    def __init__(self, arrays: dict, attrs: dict, path=None):
        self.pos, self.vel = arrays["pos"], arrays["vel"]
        self.ids, self.redshift = arrays["ids"], arrays["redshift"]
        self.attrs = dict(attrs)
        self.observer = tuple(float(v) for v in attrs["observer"])
        self.z_max = float(attrs["z_max"])
        self.z_final = float(attrs.get("z_final", 0.0))
        self.box_size = float(attrs["box_size"])
        self.units = dict(attrs.get("units") or {})
        self.cosmology = dict(attrs.get("cosmology") or {})
        self.chi_max = float(attrs.get("chi_max", float("nan")))
        self.particle_mass = attrs.get("particle_mass")
        self.path = path

    @property
    def n_particles(self) -> int:
        """Number of crossings recorded."""
        return int(self.pos.shape[0])

    @property
    def chi(self) -> da.Array:
        """Comoving distance of each crossing from the observer (length units)."""
        return da.sqrt((self.pos.astype(np.float64) ** 2).sum(axis=1))

    def __len__(self) -> int:
        return self.n_particles

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return (f"<Lightcone{where}: {self.n_particles} crossings, z <= {self.z_max:g} "
                f"(chi <= {self.chi_max:.6g} {self.units.get('length', 'Mpc/h')}), observer "
                f"{self.observer} {self.units.get('length', 'Mpc/h')} in a box of "
                f"{self.box_size:g}; pos relative to the observer "
                f"[{self.units.get('length', 'Mpc/h')}], vel "
                f"[{self.units.get('velocity', 'km/s')}], redshift of crossing>")

    def to_snapshot(self):
        """A non-periodic :class:`~cosmo_dask.store.snapshot.Snapshot` of the crossings
        (positions relative to the observer, velocities, ids; the per-particle
        ``redshift`` as its field ``redshift``)."""
        from ..store.snapshot import Snapshot

        return Snapshot.from_arrays(self.pos, self.vel, self.ids,
                                    particle_mass=self.particle_mass, cosmology=self.cosmology,
                                    units=self.units, fields={"redshift": self.redshift})

    def plot_wedge(self, *, axis: str = "x", across: str = "y", thickness: float | None = None,
                   opening: float = 30.0, ax=None, path=None):
        """Draw a thin wedge of the light cone: the crossings within ``thickness / 2`` of
        the plane of ``axis`` and ``across`` through the observer and within
        ``opening / 2`` degrees of ``+axis``, distances in the length unit (Mpc/h) and
        the redshift of crossing on a second axis.

        Parameters
        ----------
        axis, across : {"x", "y", "z"}
            The wedge's direction and the in-plane direction across it (distinct).
        thickness : float, optional
            Slab thickness in length units (default ``box_size / 20``).
        opening : float
            Full opening angle in degrees, in (0, 180].
        ax, path
            Axes to draw on; file to save (:func:`cosmo_dask.plot.figure.new_axes`).

        Returns
        -------
        matplotlib.axes.Axes
        """
        from ..core.errors import ParameterError
        from ..plot.figure import new_axes
        from ..plot.lightcone import draw_wedge

        names = {"x": 0, "y": 1, "z": 2}
        if axis not in names or across not in names or axis == across:
            raise ParameterError(f"plot_wedge: axis and across must be two distinct of "
                                 f"'x', 'y', 'z', got {axis!r} and {across!r}")
        if not 0.0 < float(opening) <= 180.0:
            raise ParameterError(f"plot_wedge: opening = {opening!r} must be in (0, 180] "
                                 "degrees")
        thickness = self.box_size / 20.0 if thickness is None else float(thickness)
        if not thickness > 0.0:
            raise ParameterError(f"plot_wedge: thickness = {thickness!r} must be > 0")
        i, j = names[axis], names[across]
        (k,) = {0, 1, 2} - {i, j}
        pos = self.pos.astype(np.float64)
        half = np.tan(np.radians(opening) / 2.0)
        keep = (abs(pos[:, k]) < thickness / 2.0) & (pos[:, i] > 0) & (
            abs(pos[:, j]) <= half * pos[:, i])
        x, y, z = (host(v) for v in da.compute(pos[:, i][keep], pos[:, j][keep],
                                               self.redshift[keep]))
        from ..models.cosmology import Cosmology

        z_t = np.linspace(self.z_final, self.z_max, 256)
        dist = Distances(Cosmology.coerce(self.cosmology), float(self.attrs.get("h0", 100.0)),
                         speed_of_light(self.units), 1.0 / (1.0 + self.z_max), n=257)
        chi_t = np.asarray(dist.chi_of_z(z_t), dtype=np.float64)
        length = self.units.get("length", "Mpc/h")
        return draw_wedge(new_axes(ax, path), x, y, z, chi_t, z_t, length_unit=length,
                          title=f"light cone, {x.size:,} crossings within "
                                f"{thickness:g} {length} of the {axis}-{across} plane",
                          path=path)

    def healpix_map(self, nside: int, z_min: float, z_max: float, *, kind: str = "counts"):
        """A HEALPix map (RING ordering) of the crossings with ``z_min <= z < z_max``.

        Parameters
        ----------
        nside : int
            HEALPix resolution (a power of 2).
        z_min, z_max : float
            The redshift shell.
        kind : {"counts", "kappa"}
            ``"counts"``: number of crossings per pixel. ``"kappa"``: the Born
            convergence of sources at ``z_max`` from the matter in the shell (equal
            particle masses), ``kappa = (3/2) Omega_m (H0/c)^2 int dchi chi (chi_s - chi) /
            chi_s (1 + z) delta``, each particle standing for ``1 / nbar`` of volume:
            ``(3/2) Omega_m (H0/c)^2 [sum_i (chi_s - chi_i) (1 + z_i) / (chi_s chi_i nbar
            Omega_pix) - int dchi chi (chi_s - chi) (1 + z) / chi_s]`` (dimensionless).

        Returns
        -------
        numpy.ndarray
            ``12 nside^2`` values (float64).

        Raises
        ------
        ParameterError
            healpy not installed, a bad ``nside``, shell or ``kind``.
        """
        try:
            import healpy
        except ImportError:
            raise ParameterError("Lightcone.healpix_map needs healpy (pip install "
                                 "healpy)") from None
        if kind not in ("counts", "kappa"):
            raise ParameterError(f"healpix_map: kind must be 'counts' or 'kappa', got {kind!r}")
        if isinstance(nside, bool) or not isinstance(nside, (int, np.integer)) \
                or not healpy.isnsideok(int(nside)):
            raise ParameterError(f"healpix_map: nside must be a power of 2, got {nside!r}")
        z_min, z_max = float(z_min), float(z_max)
        if not (math.isfinite(z_min) and math.isfinite(z_max) and z_min < z_max):
            raise ParameterError(f"healpix_map: need finite z_min < z_max, got "
                                 f"{z_min!r}, {z_max!r}")
        npix = healpy.nside2npix(int(nside))
        born = self._born(z_min, z_max, npix) if kind == "kappa" else None

        def block(rows):
            rows = host(rows)
            sel = (rows[:, 3] >= z_min) & (rows[:, 3] < z_max)
            p = rows[sel]
            pix = healpy.vec2pix(int(nside), p[:, 0], p[:, 1], p[:, 2]) if len(p) else \
                np.zeros(0, dtype=np.int64)
            weights = None
            if born is not None:
                chi = np.sqrt((p[:, :3] ** 2).sum(axis=1))
                weights = born["scale"] * (born["chi_s"] - chi) * (1 + p[:, 3]) / chi
            return np.bincount(pix, weights, minlength=npix).astype(np.float64)[None, :]

        if self.n_particles == 0:
            out = np.zeros(npix)
        else:
            rows = da.concatenate([self.pos.astype(np.float64), self.redshift[:, None]],
                                  axis=1).rechunk({1: -1})
            maps = da.map_blocks(block, rows, dtype=np.float64,
                                 chunks=((1,) * rows.numblocks[0], (npix,)),
                                 meta=np.empty((0, 0), np.float64))
            out = maps.sum(axis=0).compute()
        return out if born is None else out - born["mean"]

    def _born(self, z_min: float, z_s: float, npix: int) -> dict:
        """The constants of the Born convergence map (see :meth:`healpix_map`)."""
        from ..models.cosmology import Cosmology

        n_box = self.attrs.get("n_particles_box")
        if not n_box or self.particle_mass is None:
            raise ParameterError("healpix_map(kind='kappa'): needs equal particle masses and "
                                 "the box's particle count (a run's lightcone)")
        cosmo = Cosmology.coerce(self.cosmology)
        h0 = float(self.attrs.get("h0", 100.0))
        dist = Distances(cosmo, h0, speed_of_light(self.units),
                         1 / (1 + max(z_s, self.z_max)), n=513)
        chi_min, chi_s = float(dist.chi_of_z(z_min)), float(dist.chi_of_z(z_s))
        amp = 1.5 * cosmo.Omega_m * (h0 / speed_of_light(self.units)) ** 2
        nbar = n_box / self.box_size**3
        mean = integrate.quad(lambda c: c * (chi_s - c) / chi_s / float(dist.a_of_chi(c)),
                              chi_min, chi_s, epsrel=1e-10)[0]
        return {"chi_s": chi_s, "scale": amp / (chi_s * nbar * 4 * math.pi / npix),
                "mean": amp * mean}


def open_lightcone(path, entry: dict | None, precision: str, verify: bool | None = None
                   ) -> Lightcone:
    """The lightcone of the simulation store at ``path`` from its manifest's ``lightcone``
    entry (``entry``; the pieces' names already checked to be directory names inside the
    store), ``precision`` the run's."""
    if not entry:
        raise ParameterError(f"{path}: the run recorded no lightcone (run it with "
                             "lightcone={'z_max': ...})")
    parts = {k: [] for k in ARRAYS}
    for piece in entry.get("pieces") or []:
        if not piece.get("n"):
            continue
        arrays = read_piece(path / "lightcone" / piece["name"], piece, verify)
        for k in ARRAYS:
            parts[k].append(arrays[k])
    if parts["pos"]:
        arrays = {k: da.concatenate(v) for k, v in parts.items()}
    else:
        dt = np.dtype(precision)
        arrays = {"pos": da.zeros((0, 3), dtype=dt), "vel": da.zeros((0, 3), dtype=dt),
                  "ids": da.zeros((0,), dtype=np.int64),
                  "redshift": da.zeros((0,), dtype=np.float64)}
    return Lightcone(arrays, entry, path=path)


# ----------------------------------------------------------------------------- for run()
def lightcone_recorder(snap, params: dict, fac) -> Recorder:
    """The :class:`Recorder` of a run (``params``: the run's resolved parameters)."""
    spec = params["lightcone"]
    a_ics = float(params["a_initial"])
    a_final = 1.0 / (1.0 + float(params["z_final"]))
    attrs = {"z_max": spec["z_max"], "observer": list(spec["observer"]),
             "box_size": float(snap.box_size), "z_final": float(params["z_final"]),
             "units": {"length": (snap.units or {}).get("length", "Mpc/h"),
                       "velocity": (snap.units or {}).get("velocity", "km/s"),
                       "redshift": "1"},
             "cosmology": dict(params["cosmology"]), "h0": float(params["h0"]),
             "particle_mass": None if snap.particle_mass is None else float(snap.particle_mass),
             "n_particles_box": int(params["n_particles"]),
             "interpolation": "drift fraction Dr(a0->a)/Dr(a0->a1), regula falsi"}
    from ..models.cosmology import Cosmology

    return Recorder(spec, fac=fac, cosmology=Cosmology.coerce(params["cosmology"]),
                    units=snap.units, box_size=snap.box_size, a_min=a_ics, a_max=a_final,
                    attrs=attrs)


def rows(pos: da.Array) -> da.Array:
    """Row numbers as ids (ICs without ids), chunked like ``pos`` and on its device."""
    from ..core.backend import device_of, to_device

    return to_device(da.arange(pos.shape[0], chunks=(pos.chunks[0],), dtype=np.int64),
                     device_of(pos))
