"""Domain decomposition with ghost zones.

Space (the periodic box, or the particles' bounding box for isolated systems)
is cut into a regular grid of ``nx * ny * nz`` domains. Each particle belongs
to the domain holding it; a copy of it is also sent, as a *ghost*, to every
neighbouring domain whose region lies within ``ghost_width`` of it (across
periodic faces too), at most once per domain. Positions travel as stored
(their dtype, no shifts): kernels measure periodic distances by the minimum
image (:attr:`DomainGrid.kernel_periods`). Along an axis with a single domain
in a periodic box no ghosts are made.

This module holds the grid and the task bodies of the decomposition: a chunk's
split among the domains (:func:`split_chunk`, and its two-stage form), a domain's
concatenation (:func:`gather_domain`), the cut of a domain's results by chunk
(:func:`rows_by_chunk`) and the write of an output chunk (:func:`chunk_rows`). The
graph that runs them, both ways, is the layout of :mod:`cosmo_dask.spatial.layout`
(:func:`~cosmo_dask.spatial.layout.decompose`): one ``<name>-split`` task per
particle chunk (splits it among the domains) and one ``<name>-domain`` task per
domain (concatenates its pieces), so no task ever holds more than one chunk or one
domain (plus ghosts); on the way back each output chunk reads one piece of each
domain holding its rows, never whole domain results.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.backend import array_module, host
from ..core.errors import ParameterError
from ..core.task_graph import task_payload


@dataclass(frozen=True)
class DomainGrid:
    """A regular grid of domains over ``[origin, origin + extent)``.

    Attributes
    ----------
    shape : (int, int, int)
        Domains per axis.
    origin, extent : tuple of 3 floats
        Lower corner and side lengths of the decomposed region.
    box_size : float or None
        Period of a periodic box (then origin is 0 and extent is the box).
    """

    shape: tuple[int, int, int]
    origin: tuple[float, float, float]
    extent: tuple[float, float, float]
    box_size: float | None

    @property
    def n_domains(self) -> int:
        return math.prod(self.shape)

    @property
    def width(self) -> np.ndarray:
        """Side lengths of one domain."""
        return np.asarray(self.extent, dtype=np.float64) / np.asarray(self.shape)

    @property
    def kernel_periods(self) -> np.ndarray:
        """Per-axis period a domain kernel applies (0 = open axis).

        Domains hold positions as stored (ghosts are not shifted across periodic
        faces), so in a periodic box every axis is periodic for the kernel: it
        bins cells over the whole period (only occupied cells are stored) and
        measures distances by the minimum image, which is the true periodic
        distance for every pair a domain can see.
        """
        if self.box_size is None:
            return np.zeros(3)
        return np.full(3, self.box_size)

    def check_ghost_width(self, ghost_width: float, what: str = "ghost width") -> None:
        """Ghosts may only come from the nearest neighbours: width < domain side."""
        w = self.width
        cut = [a for a in range(3) if self.shape[a] > 1]
        if cut and ghost_width >= min(w[a] for a in cut):
            maximum = min(w[a] for a in cut)
            raise ParameterError(
                f"{what} {ghost_width:g} is not smaller than the domain side {maximum:g} "
                f"({self.shape[0]}x{self.shape[1]}x{self.shape[2]} domains); use fewer "
                f"domains or a {what} below {maximum:g}"
            )

    def owner_of(self, pos):
        """(m,) int64 domain owning each position, as :func:`split_chunk` assigns it
        (periodic coordinates wrapped first, cells clipped into the grid).

        NumPy or CuPy, following ``pos``."""
        xp = array_module(pos)
        cells = [_axis_cell(self, pos, a, xp)[1] for a in range(3)]
        return self.flat(cells)

    def flat(self, cells) -> Any:
        """The domain index of integer cell coordinates ``(cx, cy, cz)`` (arrays or ints)."""
        nx, ny, nz = self.shape
        return (cells[0] * ny + cells[1]) * nz + cells[2]

    def neighbours(self, domain: int) -> tuple[int, ...]:
        """The other domains that touch ``domain`` (across faces, edges and corners, and
        across periodic faces), sorted: the only domains whose particles can be ghosts
        in it (a ghost width is below a domain's side, :meth:`check_ghost_width`)."""
        nx, ny, nz = self.shape
        cell = (domain // (ny * nz), (domain // nz) % ny, domain % nz)
        out = set()
        for offset in _OFFSETS:
            moved = [c + o for c, o in zip(cell, offset, strict=True)]
            if self.box_size is None and any(not 0 <= v < n for v, n in
                                             zip(moved, self.shape, strict=True)):
                continue
            other = self.flat([v % n for v, n in zip(moved, self.shape, strict=True)])
            if other != domain:
                out.add(int(other))
        return tuple(sorted(out))


def _factor3(n: int) -> tuple[int, int, int]:
    """Three factors of n, as equal as possible, largest first."""
    best = (n, 1, 1)
    for a in range(1, int(round(n ** (1 / 3))) + 2):
        if n % a:
            continue
        rest = n // a
        for b in range(a, int(math.isqrt(rest)) + 1):
            if rest % b:
                continue
            c = rest // b
            cand = tuple(sorted((a, b, c), reverse=True))
            if max(cand) / min(cand) < max(best) / min(best):
                best = cand
    return best  # type: ignore[return-value]


def domain_grid(n_domains: int | tuple[int, int, int], *, box_size: float | None = None,
                bounds: tuple[np.ndarray, np.ndarray] | None = None) -> DomainGrid:
    """A grid of domains for a periodic box or an isolated region.

    Parameters
    ----------
    n_domains : int or (int, int, int)
        Number of domains (factored into three near-equal factors, e.g. 8 ->
        2x2x2, 12 -> 3x2x2) or the per-axis counts.
    box_size : float, optional
        Periodic box side; the grid covers [0, box_size)^3.
    bounds : (lo, hi), optional
        For isolated systems: the region to cover (e.g. the particles'
        bounding box); the upper side is widened by a tiny margin so the
        largest coordinate falls inside.
    """
    if isinstance(n_domains, (tuple, list)):
        shape = tuple(int(n) for n in n_domains)
        if len(shape) != 3 or min(shape) < 1:
            raise ParameterError(f"n_domains must be a positive int or 3 positive ints, "
                                 f"got {n_domains!r}")
    else:
        if isinstance(n_domains, bool) or not isinstance(n_domains, (int, np.integer)) \
                or n_domains < 1:
            raise ParameterError(f"n_domains must be a positive integer, got {n_domains!r}")
        shape = _factor3(int(n_domains))
    if box_size is not None:
        return DomainGrid(shape, (0.0, 0.0, 0.0), (float(box_size),) * 3, float(box_size))
    if bounds is None:
        raise ParameterError("an isolated system needs bounds=(lo, hi) for its domains")
    lo = np.asarray(bounds[0], dtype=np.float64)
    hi = np.asarray(bounds[1], dtype=np.float64)
    span = np.maximum(hi - lo, 1e-300)
    extent = span * (1 + 1e-9) + 1e-300
    return DomainGrid(shape, tuple(lo.tolist()), tuple(extent.tolist()), None)


@task_payload
@dataclass
class DomainPart:
    """The particles one domain task receives.

    ``pos`` (m, 3) positions exactly as stored in the snapshot (its dtype, no
    ghost shifts, no wrapping: in a periodic box a kernel measures distances by
    the minimum image along every axis, :attr:`DomainGrid.kernel_periods`),
    ``index`` (m,) int64 global particle indices (snapshot order); the first
    ``n_owned`` rows are the domain's own particles in increasing index order,
    the rest ghosts (each particle at most once per domain). ``exported`` (m,) is True for owned
    particles that are ghosts in some other domain; ``extra`` holds the other
    per-particle arrays asked for (same order), by name.

    Per particle a domain costs the position, 8 bytes of index, 1 of flag and
    the extra columns: 29 bytes for float32 positions with int64 ids.
    """

    domain: int
    pos: np.ndarray
    index: np.ndarray
    n_owned: int
    exported: np.ndarray
    extra: dict

    @property
    def owned(self):
        """(m,) True for the domain's own rows (the first ``n_owned``)."""
        xp = array_module(self.index)
        out = xp.zeros(self.index.shape[0], dtype=bool)
        out[:self.n_owned] = True
        return out


_OFFSETS = [o for o in itertools.product((-1, 0, 1), repeat=3) if o != (0, 0, 0)]


def _like(xp, x):
    """``x`` as an array of module ``xp`` (NumPy or CuPy)."""
    return host(x) if xp is np else xp.asarray(x)


def _axis_cell(grid: DomainGrid, pos, a: int, xp):
    """Along axis ``a``: the float64 coordinates (wrapped into ``[0, box)`` in a periodic
    box) and the owner cell of every row, clipped into the grid."""
    x = pos[:, a].astype(np.float64)
    if grid.box_size is not None:
        x = xp.mod(x, grid.box_size)
        x[x >= grid.box_size] = 0.0
    c = xp.clip(xp.floor((x - grid.origin[a]) / grid.width[a]).astype(np.int64), 0,
                grid.shape[a] - 1)
    return x, c


def _axis_offsets(grid: DomainGrid, pos, ghost_width: float, xp):
    """Owner cell coordinate of every particle along each axis, and per axis the
    (offset, mask) pairs saying which particles go to the neighbour at that offset.

    Works one axis at a time in float64 (the chunk's positions are never copied
    whole); periodic coordinates are wrapped first. Along a periodic axis cut in
    two, both faces lead to the same neighbour, so there is one offset (+1) whose
    mask is "near either face": no particle reaches a domain twice.
    """
    shape, width = grid.shape, grid.width
    cells, options = [], []
    for a in range(3):
        x, c = _axis_cell(grid, pos, a, xp)
        cells.append(c)
        opts = [(0, None)]
        if shape[a] > 1:
            local = x - (grid.origin[a] + c * width[a])  # offset inside the owner cell
            lo, hi = local < ghost_width, (width[a] - local) <= ghost_width
            if grid.box_size is None:  # no neighbour beyond the outer faces
                lo &= c > 0
                hi &= c < shape[a] - 1
            opts += [(1, lo | hi)] if grid.box_size is not None and shape[a] == 2 \
                else [(-1, lo), (1, hi)]
        options.append(opts)
    return cells, options


def split_chunk(pos, start: int, grid: DomainGrid, ghost_width: float, *extra) -> list:
    """Split one particle chunk among the domains: owned particles and ghost copies.

    Returns one tuple ``(pos, index, n_owned, exported, *extra)`` per domain,
    owned rows first: NumPy arrays for NumPy chunks, CuPy arrays (staying on the
    GPU) for CuPy chunks; ``extra`` are other per-particle arrays of the chunk.
    Positions keep their dtype and values.
    """
    xp = array_module(pos)
    extra = [_like(xp, e) for e in extra]
    m = pos.shape[0]
    if grid.n_domains == 1:  # one domain owns every row in chunk order and has no ghosts
        # (what the general path gives, without its cell indexes and sort of all rows)
        return [(pos.copy(), xp.arange(m, dtype=np.int64) + start, int(m),
                 xp.zeros(m, dtype=bool), *[e.copy() for e in extra])]
    (cx, cy, cz), options = _axis_offsets(grid, pos, ghost_width, xp)
    nx, ny, nz = grid.shape
    owner = grid.flat((cx, cy, cz))
    ghost_rows: list[list] = [[] for _ in range(grid.n_domains)]
    exported = xp.zeros(m, dtype=bool)
    for (ox, mx), (oy, my), (oz, mz) in itertools.product(*options):
        if ox == oy == oz == 0:
            continue
        mask = functools.reduce(operator.and_, [mk for mk in (mx, my, mz) if mk is not None])
        sel = xp.nonzero(mask)[0]
        if sel.size == 0:
            continue
        exported[sel] = True
        dom = grid.flat(((cx[sel] + ox) % nx, (cy[sel] + oy) % ny, (cz[sel] + oz) % nz))
        order = _stable_argsort(dom)
        dom, sel = dom[order], sel[order]
        bounds = host(xp.searchsorted(dom, xp.arange(grid.n_domains + 1)))
        for d in np.flatnonzero(np.diff(bounds)):
            ghost_rows[d].append(sel[int(bounds[d]):int(bounds[d + 1])])
    del cx, cy, cz
    order = _stable_argsort(owner)
    bounds = host(xp.searchsorted(owner[order], xp.arange(grid.n_domains + 1)))
    del owner
    out = []
    for d in range(grid.n_domains):
        own = order[int(bounds[d]):int(bounds[d + 1])]
        rows = xp.concatenate([own] + ghost_rows[d]) if ghost_rows[d] else own
        exp = xp.zeros(rows.size, dtype=bool)
        exp[:own.size] = exported[own]
        out.append((pos[rows], rows + start, int(own.size), exp, *[e[rows] for e in extra]))
    return out


def _stable_argsort(a):
    xp = array_module(a)
    return xp.argsort(a, kind="stable") if xp is np else xp.argsort(a)  # CuPy's sort is stable


def _concat_pieces(pieces) -> tuple:
    """Pieces ``(pos, index, n_owned, exported, *extra)`` of one domain as one piece: all
    owned rows first (each piece lists its owned rows before its ghosts), then all ghosts,
    each in the pieces' order."""
    if len(pieces) == 1:  # nothing to concatenate
        return tuple(pieces[0])
    n_own = [p[2] for p in pieces]
    xp = array_module(pieces[0][0])
    cols = [xp.concatenate([p[k][:o] for p, o in zip(pieces, n_own, strict=True)]
                           + [p[k][o:] for p, o in zip(pieces, n_own, strict=True)])
            for k in range(len(pieces[0])) if k != 2]
    return (cols[0], cols[1], sum(n_own), *cols[2:])


def gather_domain(domain: int, names: tuple[str, ...], *pieces) -> DomainPart:
    """Concatenate one domain's pieces from every chunk: all owned rows first (each
    piece lists its owned rows before its ghosts), then all ghosts, in chunk order."""
    pos, index, n_owned, exported, *extra = _concat_pieces(pieces)
    return DomainPart(domain, pos, index, n_owned, exported,
                      dict(zip(names, extra, strict=True)))


def owned_rows(part: DomainPart, names: tuple[str, ...]) -> tuple:
    """``(n_owned, pos, *columns)``: a domain's own rows of its positions and of the
    extra columns ``names`` (:meth:`~.layout.DomainLayout.by_domain`)."""
    n = part.n_owned
    return (n, part.pos[:n], *[part.extra[k][:n] for k in names])


def split_chunk_grouped(pos, start: int, grid: DomainGrid, ghost_width: float,
                        groups: tuple[tuple[int, int], ...], *extra) -> list:
    """:func:`split_chunk`, its per-domain pieces grouped: one list per domain range
    ``[a, b)`` of ``groups`` (the first stage of a two-stage split)."""
    out = split_chunk(pos, start, grid, ghost_width, *extra)
    return [out[a:b] for a, b in groups]


def regroup(*lists) -> list:
    """Second stage of a two-stage exchange: the lists of one group of domains from
    consecutive chunks -> one piece per domain (chunks concatenated in order, owned rows
    first: :func:`gather_domain` of these gives what it gives of the chunks' pieces)."""
    return [_concat_pieces([lst[q] for lst in lists]) for q in range(len(lists[0]))]


#: an exchange with more (chunk, domain) pairs than this goes in two stages (chunks and
#: domains in groups of about their square roots): ``~2 (n_chunks + n_domains) sqrt(..)``
#: keys instead of ``n_chunks * n_domains``
TWO_STAGE_PAIRS = 1 << 14


def _groups(n: int) -> list[tuple[int, int]]:
    """``ceil(sqrt(n))`` ranges ``[a, b)`` of consecutive items, as equal as possible,
    covering ``range(n)``."""
    k = max(1, math.ceil(math.sqrt(n)))
    cuts = [(i * n) // k for i in range(k + 1)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]


def rows_by_chunk(bounds, index, *columns) -> list[tuple]:
    """Rows of one domain cut by snapshot chunk: ``[(index, *columns) of chunk i]``.

    ``index`` (m,) global particle indices in increasing order (a domain's owned rows),
    ``columns`` per-row arrays in the same order, ``bounds`` (n_chunks + 1,) the chunks'
    first rows and the total; NumPy or CuPy, following ``index``.
    """
    xp = array_module(index)
    cuts = host(xp.searchsorted(index, xp.asarray(bounds)))
    return [(index[a:b], *[c[a:b] for c in columns])
            for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)]


def _slices(items: list, groups: tuple[tuple[int, int], ...]) -> list:
    return [items[a:b] for a, b in groups]


def _merge_rows(*lists) -> list:
    """Pieces of several domains for the same chunks -> one piece per chunk, in
    increasing index (the domains hold disjoint rows)."""
    out = []
    for q in range(len(lists[0])):
        parts = [lst[q] for lst in lists]
        if len(parts) == 1:
            out.append(parts[0])
            continue
        xp = array_module(parts[0][0])
        cols = [xp.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]
        order = xp.argsort(cols[0], kind="stable") if xp is np else xp.argsort(cols[0])
        out.append(tuple(c[order] for c in cols))
    return out


def chunk_rows(column: int, start: int, stop: int, dtype, gpu: bool, fill, *pieces):
    """Task ``<name>-<output>`` of the way back: rows ``[start, stop)`` of output
    ``column`` (1 = the first column after the index) from the domains' pieces
    ``(index, *columns)`` of this chunk (:func:`rows_by_chunk`, each holding only this
    chunk's rows), cast to ``dtype``; rows no piece holds get ``fill``. NumPy or CuPy
    following the pieces; on the GPU (``gpu``) when they are NumPy."""
    first = pieces[0][column]
    xp = array_module(first)
    out = xp.full((stop - start,) + tuple(first.shape[1:]), fill, dtype=dtype)
    for index, *values in pieces:
        out[xp.asarray(index) - start] = xp.asarray(values[column - 1], dtype=dtype)
    if gpu and xp is np:
        import cupy

        out = cupy.asarray(out)
    return out
