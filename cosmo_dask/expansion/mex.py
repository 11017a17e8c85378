"""Multipole expansion (MEX) of an isolated particle system, distributed over dask.

Method (ETICS, Meiron et al. 2014, Sect. 2.4 and 3.2): with the particles sorted
by radius about the centre, the potential at particle ``i`` is

    Phi_i = -G sum_{l<=lmax} sum_{m=0..l} [Re(conj(q_lm(i)) T_lm(x_i)) f_l(r_i)
                                           + Re(conj(p_lm(i)) T_lm(x_i))]

with ``q_lm(i) = sum_{j before i} m_j T_lm(x_j)`` (inner particles) and
``p_lm(i) = sum_{j after i} m_j T_lm(x_j) f_l(r_j)`` (outer particles), where
``T_lm`` are regular solid harmonics (``r^l Y_lm`` up to normalisation, computed
by stable Cartesian recurrences, see :mod:`.mex_kernels`) and
``f_l(r) = (r^2 + eps^2)^-(l+1/2)``. ``q`` and ``p`` are a forward and a reverse
prefix sum over the sorted particles. The force is ``-grad Phi`` at fixed ``q``,
``p`` (exact: they are piecewise constant in ``r``).

Ordering and self-interaction: particles are ordered by (radius, input index).
Particle ``i`` feels the particles before it as inner and those after it as
outer, never itself; particles at equal radius are split by input index. A point
given to :meth:`MEX.potential`/:meth:`MEX.accelerations` sees particles with
``r_j <= r`` as inner and the rest as outer. With ``lmax = 0`` and ``eps = 0``
this is exactly the shell theorem: ``a_i = -G M(before i) x_i / r_i^3``.

Distribution (no task ever holds all particles):

1. radii quantiles from a strided sample of every chunk (<= 4096 radii each)
   give ``B - 1`` bucket boundaries (host); a histogram pass gives the bucket
   sizes;
2. every input chunk splits its particles by bucket; each bucket gathers its
   pieces from all chunks and sorts them by (radius, index);
3. per bucket, the bucket totals of the inner and outer terms (host); the
   ``B`` totals become exclusive offsets (earlier buckets for ``q``, later
   ones for ``p``): a distributed scan;
4. every evaluation builds a bucket's local prefix sums of the inner terms and
   suffix sums of the outer terms, plus its offsets, inside the task that uses
   them, and drops them after. Forces at the fitted particles are computed per
   bucket and routed back to the input chunks (aligned with the input); at
   other points, each chunk of points is split by bucket and located within
   the bucket by binary search.

Fitted state (persisted dask arrays, chunked by bucket): sorted positions
(relative to the centre), masses, radii and input indices (32 bytes per
particle in float32, 48 in float64), plus ``2 B (lmax+1)^2`` offsets on the
host. The per-particle sums ``Q`` and ``P`` (``2 (lmax+1)^2`` numbers per
particle: 392 bytes at lmax = 6 in float32, 53 GB for 512^3 particles) are never
kept: a task holds them for one bucket (plus the float64 scan work space,
``16 (lmax+1)^2`` bytes per particle of the bucket), so the fit of 512^3
particles fits on one GPU. The price is one extra pass of the sums (the fit's
totals, then each evaluation).

Cost: O(N log N) for the sort (per bucket), O(N (lmax+1)^2) for the sums and
for each evaluation, with ``B x C`` small routing tasks for ``C`` input chunks.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, host, resolve_precision
from ..core.errors import ParameterError
from ..core.progress import compute, persist
from ..core.task_graph import TaskGraph
from ..units.products import input_units
from .dispatch import mex_evaluate, mex_terms_scan
from .parameters import (
    CENTER_DEFAULT,
    LMAX_DEFAULT,
    LMAX_LIMIT,
    PRECISION_DEFAULT,
    SOFTENING_DEFAULT,
    check_center_name,
    check_order,
)
from .particles import expansion_input

__all__ = ["LMAX_LIMIT", "MEX"]

_SAMPLE_PER_CHUNK = 4096
#: Default bound on the memory one bucket's task holds for its sums and their scan (see
#: :func:`_scan_bytes`): the default number of buckets is at least N x that / this.
BUCKET_BYTES = 2**32


def _scan_bytes(lmax: int) -> int:
    """Bytes per particle a bucket's sums and their scan hold at once: the float64 terms
    and their running sums (3 x 8 bytes, GPU) plus ``Q`` and ``P`` (2 x 8 at most), for
    each of the ``(lmax+1)^2`` terms."""
    return 40 * (lmax + 1) ** 2


def _pow2(x: float) -> float:
    """The power of two nearest ``x`` (> 0): scaling by it is exact in floating point."""
    if not (x > 0 and np.isfinite(x)):
        return 1.0
    return float(2.0 ** round(math.log2(x)))


# ----------------------------------------------------------------------------- tasks
def _radius(pos):
    xp = array_module(pos)
    p = pos.astype(xp.float64)
    return xp.sqrt((p * p).sum(axis=1))


def _sample(pos, mass, seed):
    """Radii of up to 4096 particles of one chunk, drawn at random (a seeded generator):
    a fixed stride would alias with lattice-ordered inputs (every 4096th particle of a
    512^3 Zel'dovich grid lies in one plane)."""
    xp = array_module(pos)
    n = int(pos.shape[0])
    if n > _SAMPLE_PER_CHUNK:
        pick = np.sort(np.random.default_rng(seed).integers(0, n, _SAMPLE_PER_CHUNK))
        pos = pos[xp.asarray(pick)]
    return {"r": host(_radius(pos)), "n": n, "m": float(host(mass.astype(np.float64).sum()))}


def _histogram(pos, bounds):
    xp = array_module(pos)
    b = xp.searchsorted(xp.asarray(bounds), _radius(pos), side="right")
    return host(xp.bincount(b, minlength=len(bounds) + 1))[None, :]


def _split(pos, mass, offset, bounds):
    """One input chunk's particles, grouped by bucket (input order within a group)."""
    xp = array_module(pos)
    r = _radius(pos)
    b = xp.searchsorted(xp.asarray(bounds), r, side="right")
    order = xp.argsort(b, kind="stable") if xp is np else xp.argsort(b)
    counts = host(xp.bincount(b, minlength=len(bounds) + 1))
    edges = np.concatenate([[0], np.cumsum(counts)])
    idx = xp.arange(pos.shape[0], dtype=np.int64) + offset
    out = []
    for k in range(len(counts)):
        sel = order[edges[k]:edges[k + 1]]
        if xp is not np:  # argsort on the GPU is not promised stable: restore input order
            sel = xp.sort(sel)
        out.append({"pos": pos[sel], "m": mass[sel], "r": r[sel], "idx": idx[sel]})
    return out


def _bucket(*parts):
    """Gather a bucket's pieces and sort them by (radius, index)."""
    xp = array_module(parts[0]["pos"])
    pos = xp.concatenate([p["pos"] for p in parts])
    m = xp.concatenate([p["m"] for p in parts])
    r = xp.concatenate([p["r"] for p in parts])
    idx = xp.concatenate([p["idx"] for p in parts])
    if xp is np:
        order = np.lexsort((idx, r))
    else:
        order = xp.lexsort(xp.stack([idx, r])) if r.size else xp.arange(0)
    return {"pos": pos[order], "m": m[order], "r": r[order], "idx": idx[order]}


def _scan(pos, m, params, qoff=None, poff=None):
    """A bucket's cumulative sums ``Q`` (inner) and ``P`` (outer), ``n + 1`` rows each,
    plus the other buckets' totals (``qoff`` earlier, ``poff`` later) when given."""
    lmax, eps2, inv_a, inv_m = params[:4]
    xp = array_module(pos)
    Q, P = mex_terms_scan(pos * pos.dtype.type(inv_a), m * m.dtype.type(inv_m), lmax, eps2)
    if qoff is not None:
        Q += xp.asarray(qoff.astype(Q.dtype))
        P += xp.asarray(poff.astype(P.dtype))
    return Q, P


def _totals(pos, m, params):
    """A bucket's total inner and outer sums (float64, host), to offset the others."""
    Q, P = _scan(pos, m, params)
    return host(Q[-1]).astype(np.float64), host(P[0]).astype(np.float64)


def _offsets(*totals):
    """Exclusive offsets of the bucket totals: earlier buckets for q, later for p."""
    q = np.array([t[0] for t in totals])
    p = np.array([t[1] for t in totals])
    qoff = np.zeros_like(q)
    poff = np.zeros_like(p)
    for b in range(1, len(totals)):  # sequential: the same rounding for any scheduler
        qoff[b] = qoff[b - 1] + q[b - 1]
    for b in range(len(totals) - 2, -1, -1):
        poff[b] = poff[b + 1] + p[b + 1]
    return qoff, poff


def _eval_self(pos, m, qoff, poff, params):
    """Forces and potentials at a bucket's own particles: its sums are built here and
    dropped after (``2 (lmax+1)^2`` numbers per particle live only inside this task)."""
    lmax, eps2, inv_a, inv_m, acc_scale, phi_scale = params
    Q, P = _scan(pos, m, params, qoff, poff)
    xp = array_module(pos)
    n = pos.shape[0]
    iq = xp.arange(n, dtype=np.int64)
    acc, phi = mex_evaluate(pos * pos.dtype.type(inv_a), Q, P, iq, iq + 1, lmax, eps2)
    del Q, P
    return xp.concatenate([acc * acc.dtype.type(acc_scale),
                           (phi * phi.dtype.type(phi_scale))[:, None]], axis=1)


def _route(values, idx, starts):
    """Split a bucket's results by the input chunk their particle came from."""
    xp = array_module(values)
    c = xp.searchsorted(xp.asarray(starts), idx, side="right") - 1
    order = xp.argsort(c)
    counts = host(xp.bincount(c, minlength=len(starts)))
    edges = np.concatenate([[0], np.cumsum(counts)])
    return [(idx[order[edges[k]:edges[k + 1]]] - int(starts[k]),
             values[order[edges[k]:edges[k + 1]]]) for k in range(len(starts))]


def _assemble(n, *pieces):
    xp = array_module(pieces[0][1])
    out = xp.empty((n, pieces[0][1].shape[1]), pieces[0][1].dtype)
    for where, vals in pieces:
        out[where] = vals
    return out


def _shift(block, c):
    return block - array_module(block).asarray(c)


def _split_points(pos, bounds):
    xp = array_module(pos)
    r = _radius(pos)
    b = xp.searchsorted(xp.asarray(bounds), r, side="right")
    order = xp.argsort(b)
    counts = host(xp.bincount(b, minlength=len(bounds) + 1))
    edges = np.concatenate([[0], np.cumsum(counts)])
    return [(order[edges[k]:edges[k + 1]], pos[order[edges[k]:edges[k + 1]]],
             r[order[edges[k]:edges[k + 1]]]) for k in range(len(counts))]


def _eval_points(piece, r_sorted, sums, params):
    lmax, eps2, inv_a, inv_m, acc_scale, phi_scale = params
    where, pos, r = piece
    Q, P = sums
    xp = array_module(Q)
    pos = xp.asarray(pos)
    n_in = xp.searchsorted(r_sorted, xp.asarray(r), side="right").astype(np.int64)
    acc, phi = mex_evaluate(pos * pos.dtype.type(inv_a), Q, P, n_in, n_in, lmax, eps2)
    vals = xp.concatenate([acc * acc.dtype.type(acc_scale),
                           (phi * phi.dtype.type(phi_scale))[:, None]], axis=1)
    return where, vals


# ----------------------------------------------------------------------------- class
class MEX:
    """Multipole expansion (MEX) of an isolated N-body system.

    Parameters
    ----------
    lmax : int
        Highest multipole order, ``0 <= lmax <= 32``. The fit holds
        ``2 (lmax+1)^2`` cumulative sums per particle (two sets of
        ``(lmax+1)^2`` real numbers: the complex ``q_lm``, ``p_lm`` for
        ``m >= 0``); ``lmax = 32`` is 2178 numbers (17 kB in float64) per particle.
    center : "com", "potential_min" or 3 floats
        Expansion centre: the centre of mass, the potential minimum (from
        :func:`cosmo_dask.expansion.scf.potential_min_center`), or a point.
    softening : float
        ``eps >= 0``: the irregular radial functions ``r^-(2l+1)`` become
        ``(r^2 + eps^2)^-(l+1/2)`` (Plummer-like, the White 1983 form); the
        monopole force is ``G M(<r) r / (r^2 + eps^2)^(3/2)``. Only the
        divergence at the centre is softened; ``eps = 0`` is the plain expansion.
    precision : "float32" or "float64"
        Working precision of positions, stored sums and results. Harmonics are
        computed and sums accumulated in float64 in every case; positions and
        masses are scaled by powers of two (exact) so float32 stays in range.
    buckets : int, optional
        Number of radial buckets (tasks of the sort, scan and evaluation);
        default: the number of input chunks, or more so that one bucket's sums and
        their scan stay under :data:`BUCKET_BYTES` (4 GiB: ``40 (lmax+1)^2`` bytes
        per particle, 2 kB at lmax = 6, so about 2 million particles a bucket).

    Attributes
    ----------
    units_ : dict
        After :meth:`fit`: the unit strings of the results
        (:func:`~cosmo_dask.units.products.input_units` of the fitted input):
        ``units_["acceleration"]`` (velocity^2 / length), ``units_["potential"]``
        (velocity^2), ``units_["length"]`` (``center_``, ``softening``), ``G_``
        in ``units_["gravitational_constant"]``; mass / length^2 and mass /
        length marked "(G = 1)" when neither ``fit(G=)`` nor the snapshot gave G.

    Notes
    -----
    Particle ordering, self-interaction and the distributed algorithm are
    described in the module docstring (:mod:`cosmo_dask.expansion.mex`). Chunks
    may be NumPy (numba kernels) or CuPy (CUDA kernels); results follow them.
    """

    def __init__(self, lmax: int = LMAX_DEFAULT, *, center=CENTER_DEFAULT,
                 softening: float = SOFTENING_DEFAULT, precision=PRECISION_DEFAULT,
                 buckets: int | None = None):
        lmax = check_order(lmax, "lmax", LMAX_LIMIT, "MEX", " (the fit keeps 2 (lmax+1)^2 "
                           "real cumulative sums per particle: 2178 at lmax=32)")
        try:
            eps = float(softening)
        except (TypeError, ValueError):
            eps = float("nan")
        if not (np.isfinite(eps) and eps >= 0):
            raise ParameterError(f"MEX: softening must be a finite number >= 0, got "
                                 f"{softening!r}")
        if buckets is not None and (isinstance(buckets, bool) or
                                    not isinstance(buckets, (int, np.integer)) or buckets < 1):
            raise ParameterError(f"MEX: buckets must be a positive integer, got {buckets!r}")
        check_center_name(center, "MEX", "3 floats")
        self.lmax = int(lmax)
        self.softening = eps
        self.dtype = resolve_precision(precision)
        self.center = center
        self.buckets = None if buckets is None else int(buckets)
        self._fitted = False

    # ------------------------------------------------------------------ fit
    def fit(self, snap_or_pos, mass=None, *, G=None):
        """Sort the particles by radius and build the cumulative multipole sums.

        Parameters
        ----------
        snap_or_pos : Snapshot or array (N, 3) (NumPy, CuPy or dask)
        mass : array (N,) or float, optional (required with raw positions)
        G : float, optional (default: the snapshot's G, else 1)

        Returns
        -------
        self

        Notes
        -----
        Three small host computations (centre of mass and input checks; radii
        samples; bucket sizes, skipped with one bucket), then one persisted pass: split,
        sort, scan.
        """
        from ..store.snapshot import Snapshot

        center = self.center
        if isinstance(center, str) and center == "potential_min":
            from .scf import potential_min_center

            g_find = G
            if g_find is None and isinstance(snap_or_pos, Snapshot):
                g_find = snap_or_pos.G
            g_find = 1.0 if g_find is None else float(g_find)

            def center(pos, m, _g=g_find):
                return potential_min_center(pos, m, _g)

        inp = expansion_input(snap_or_pos, mass, center=center, G=G,
                              precision=self.dtype.name, what="MEX")
        pos, m = inp.pos, inp.mass
        if len(pos.chunks[1]) != 1:
            pos = pos.rechunk({1: 3})
        n = inp.n_particles
        nchunks = len(pos.chunks[0])
        n_buckets = self.buckets or max(nchunks, -(-n * _scan_bytes(self.lmax)
                                                   // BUCKET_BYTES))
        n_buckets = max(1, min(n_buckets, n))

        # 1. radii sample -> bucket boundaries and unit scales (host)
        g = TaskGraph([pos, m])
        sample = f"mex-sample-{tokenize(pos, m)}"
        samples = g.compute([g.add((sample, c), _sample, g.chunk(pos, c, 0), g.chunk(m, c), c).key
                             for c in range(nchunks)], label=None)
        r_s = np.concatenate([s["r"] for s in samples])
        w_s = np.concatenate([np.full(s["r"].size, s["n"] / s["r"].size) for s in samples])
        m_tot = sum(s["m"] for s in samples)
        order = np.argsort(r_s, kind="stable")
        r_s, w_s = r_s[order], w_s[order]
        cw = np.cumsum(w_s)
        targets = cw[-1] * np.arange(1, n_buckets) / n_buckets
        bounds = r_s[np.minimum(np.searchsorted(cw, targets), r_s.size - 1)]
        bounds = np.asarray(bounds, dtype=np.float64)
        a = _pow2(float(np.median(r_s)) if r_s.size else 1.0)
        mscale = _pow2(m_tot)
        self._inv_a, self._inv_m = 1.0 / a, 1.0 / mscale
        self._eps2_scaled = (self.softening / a) ** 2
        self._acc_scale = inp.G * mscale / (a * a)
        self._phi_scale = inp.G * mscale / a

        # 2. bucket sizes (one bucket holds every particle: no pass over the data)
        if n_buckets == 1:
            counts = np.array([n], dtype=np.int64)
        else:
            counts = pos.map_blocks(_histogram, bounds, dtype=np.int64,
                                    chunks=((1,) * nchunks, (n_buckets,)),
                                    meta=np.empty((0, 0), dtype=np.int64))
            (counts,) = compute(counts.sum(axis=0), label=None)
            counts = np.asarray(host(counts), dtype=np.int64)

        # 3. split / gather-sort as one graph, persisted: the sorted particles
        starts = np.concatenate([[0], np.cumsum(pos.chunks[0])])[:-1]
        params = (self.lmax, self._eps2_scaled, self._inv_a, self._inv_m)
        tok = tokenize(pos, m, bounds, starts)  # every input of the tasks below
        split, bucket = f"mex-split-{tok}", f"mex-bucket-{tok}"
        splits = [g.add((split, c), _split, g.chunk(pos, c, 0), g.chunk(m, c), int(starts[c]),
                        bounds) for c in range(nchunks)]
        buckets = [g.add((bucket, b), _bucket, *[g.item(s, b) for s in splits]).key
                   for b in range(n_buckets)]
        xp = array_module(pos._meta)
        fields = {"pos": (pos.dtype, (3,)), "m": (m.dtype, ()), "r": (np.float64, ()),
                  "idx": (np.int64, ())}
        arrays = g.item_arrays(buckets, counts, [
            (f"mex-{key}-{tok}", key, tail, xp.empty((0,) + tail, dtype=dt))
            for key, (dt, tail) in fields.items()])
        persisted = persist(*arrays, label="MEX fit")
        st = self._state = dict(zip(fields, persisted, strict=True))

        # 4. each bucket's totals (its sums built and dropped), then the offsets (host)
        tot = f"mex-totals-{tokenize(st['pos'], st['m'], params)}"
        g = TaskGraph([st["pos"], st["m"]])
        totals = g.compute([g.add((tot, b), _totals, g.chunk(st["pos"], b, 0),
                                  g.chunk(st["m"], b), params).key for b in range(n_buckets)],
                           label="MEX totals")
        self._qoff, self._poff = _offsets(*totals)
        self.bounds_ = bounds
        self.counts_ = counts
        self.center_ = inp.center
        self.G_ = inp.G
        self.units_ = input_units(snap_or_pos, G)
        self.n_particles_ = n
        self._input_chunks = pos.chunks[0]
        self._starts = starts
        self._xp = xp
        self._self_result = None
        self._fitted = True
        return self

    # ------------------------------------------------------------------ evaluation
    def _check(self):
        if not self._fitted:
            raise ParameterError("MEX: call fit() before evaluating forces or potentials")

    def _eval_params(self):
        return (self.lmax, self._eps2_scaled, self._inv_a, self._inv_m, self._acc_scale,
                self._phi_scale)

    def _at_particles(self) -> da.Array:
        if self._self_result is not None:
            return self._self_result
        st = self._state
        nb = len(self.counts_)
        tok = tokenize(st["pos"], st["m"], st["idx"], self._qoff, self._poff, self._starts,
                       self._eval_params())
        ev, route, out = (f"mex-eval-{tok}", f"mex-route-{tok}", f"mex-self-{tok}")
        params = self._eval_params()
        g = TaskGraph(list(st.values()))
        routes = []
        for b in range(nb):
            values = g.add((ev, b), _eval_self, g.chunk(st["pos"], b, 0), g.chunk(st["m"], b),
                           self._qoff[b], self._poff[b], params)
            routes.append(g.add((route, b), _route, values, g.chunk(st["idx"], b),
                                self._starts))
        for c, n_c in enumerate(self._input_chunks):
            g.add((out, c, 0), _assemble, n_c, *[g.item(r, c) for r in routes])
        self._self_result = g.array(out, (self._input_chunks, (4,)),
                                    self._xp.empty((0, 0), dtype=self.dtype))
        return self._self_result

    def _at_points(self, pos) -> da.Array:
        xp = self._xp
        if not isinstance(pos, da.Array):
            if array_module(pos) is np:
                pos = np.asarray(pos)
            if xp is not np and array_module(pos) is np:
                pos = xp.asarray(pos)
            pos = da.from_array(pos, chunks=(min(max(1, pos.shape[0]), 2**20), 3),
                                asarray=False)
        if pos.ndim != 2 or pos.shape[1] != 3:
            raise ParameterError(f"MEX: points must have shape (M, 3), got {pos.shape}")
        if len(pos.chunks[1]) != 1:
            pos = pos.rechunk({1: 3})
        if xp is not np and array_module(pos._meta) is np:
            pos = pos.map_blocks(xp.asarray, dtype=pos.dtype)
        rel = pos.astype(np.float64).map_blocks(_shift, self.center_, dtype=np.float64)
        rel = rel.astype(self.dtype)
        st = self._state
        nb = len(self.counts_)
        params = self._eval_params()
        tok = tokenize(rel, st["pos"], st["m"], st["r"], self._qoff, self._poff, self.bounds_,
                       params)
        sums, sp, ev, out = (f"mex-sums-{tok}", f"mex-psplit-{tok}", f"mex-peval-{tok}",
                             f"mex-points-{tok}")
        # each bucket's sums are built once per computation, shared by every chunk of
        # points, and released when those are done
        g = TaskGraph([rel] + list(st.values()))
        scans = [g.add((sums, b), _scan, g.chunk(st["pos"], b, 0), g.chunk(st["m"], b), params,
                       self._qoff[b], self._poff[b]) for b in range(nb)]
        for k, n_k in enumerate(rel.chunks[0]):
            pieces = g.add((sp, k), _split_points, g.chunk(rel, k, 0), self.bounds_)
            g.add((out, k, 0), _assemble, n_k, *[
                g.add((ev, k, b), _eval_points, g.item(pieces, b), g.chunk(st["r"], b),
                      scans[b], params) for b in range(nb)])
        return g.array(out, (rel.chunks[0], (4,)), xp.empty((0, 0), dtype=self.dtype))

    def accelerations(self, pos=None) -> da.Array:
        """Accelerations ``-grad Phi`` (dask, (N, 3)).

        Without ``pos``: at the fitted particles, in input order and chunks,
        without self-interaction. With ``pos`` (array (M, 3), same frame as the
        fitted input): at those points (radius located by binary search in
        the bucket boundaries, then in the bucket's sorted radii).
        O(N (lmax+1)^2). Unit: ``units_["acceleration"]``.
        """
        self._check()
        res = self._at_particles() if pos is None else self._at_points(pos)
        return res[:, :3]

    def potential(self, pos=None) -> da.Array:
        """Potential (dask, (N,), in ``units_["potential"]``); see :meth:`accelerations`
        for the points used."""
        self._check()
        res = self._at_particles() if pos is None else self._at_points(pos)
        return res[:, 3]
