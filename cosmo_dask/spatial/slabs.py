"""Particle chunks exchanged with the slabs of a periodic mesh, and the way back (``docs/fft.md``).

The mesh path (painting, P(k), PM and TreePM's long range) holds an ``n^3``
mesh in **slabs along axis 0** (:func:`cosmo_dask.spatial.fft.slab_chunks`),
while particles come in row chunks. This module is the one layout between the
two; no task ever holds a whole mesh unless the mesh is one slab.

Route (``mesh-split``, one task per particle chunk)
    Every particle has a mesh coordinate along axis 0, ``u = x n / L + offset``
    (``offset`` = the smallest shift used, minus 1/2: the convention of
    :mod:`cosmo_dask.density.paint_kernels`), wrapped into ``[0, n)``, and a
    *home plane* ``h = floor(u)``. Its assignment kernel reaches the planes
    ``h - below .. h + above`` (periodic): :func:`slab_layout` derives them from
    the kernel's order and the shifts, **plus one plane of margin on each side**,
    so that routing never depends on the last bit of ``u`` (a GPU kernel may
    fuse ``x * n / L + offset`` into one FMA, a router may not). The chunk is
    split into one *piece* per slab: the particles (positions, masses, row
    numbers in the chunk) whose planes meet that slab. A particle reaches each
    slab at most once and keeps its chunk order within a slab. Non-finite
    positions go to slab 0, where the kernels report them. A mesh of one slab
    skips the split: a chunk is its own piece.
Deposit (:meth:`SlabExchange.deposit`)
    Per slab, one task deposits the pieces of every chunk into a fresh slab
    (``(hi - lo, n, n)``): a slab is written by one task, each cell summing its
    particles in chunk order, as a one-chunk whole mesh would. When there are
    fewer slabs than worker threads, a slab's chunks are split into groups
    painted in parallel and summed by a tree of in-place additions.
Interpolate (:meth:`SlabExchange.interpolate`)
    One task per (slab, chunk) evaluates the slab's part of a kernel sum at
    the piece's particles (a particle near a slab edge gets a part from each
    slab it reaches) and returns ``(rows, values)``; one ``gather`` task per
    chunk adds the parts at their rows, in slab order, and returns the
    values in the chunk's row order. A mesh of one slab skips both: one task per
    chunk evaluates every mesh at the chunk and finishes its values.

Two stages (above :data:`~cosmo_dask.spatial.domains.TWO_STAGE_PAIRS` (chunk, slab)
pairs, as :meth:`~cosmo_dask.spatial.layout.DomainLayout.exchange`)
    Chunks and slabs go in about ``sqrt(C)`` and ``sqrt(S)`` groups of consecutive
    ones (as the domains' two-stage split). Each ``mesh-split`` task cuts its
    chunk into one list of pieces per group of slabs (rows global: the chunk's first
    row added), and one ``mesh-regroup`` task per (group of chunks, group of slabs)
    concatenates the chunks' pieces of each of its slabs **in chunk order**: a
    ``mesh-piece`` per (group of chunks, slab). A deposit reads the pieces of the
    groups of chunks, so every cell still sums its particles in chunk order (the
    kernels add the particles of a piece one after the other): the meshes are the
    one-stage meshes bit for bit (a run of chunks painted apart, when slabs are
    fewer than threads, cuts the pieces of a group it shares with another run at
    its rows). The way back: one ``<name>-slab`` task per (slab, group of chunks)
    returns ``(global rows, values)``; one ``<name>-merge`` task per (group of
    chunks, group of slabs) cuts its slabs' parts by chunk
    (:func:`~cosmo_dask.spatial.domains.rows_by_chunk`), and each chunk's gather
    reads one cut per group of slabs and adds every column's parts in slab order,
    as the one-stage gather does.

Graph size, ``C`` chunks and ``S`` slabs. One stage: ``C`` split tasks, ``C S``
piece keys, ``S`` (or a few times ``S``) deposit tasks per mesh, ``C S``
interpolation tasks and ``C`` gathers per interpolation (e.g. 16 chunks x 64
slabs: about 3,100 tasks). Two stages, with ``Cg = ceil(sqrt(C))`` and
``Sg = ceil(sqrt(S))`` groups: ``C (1 + Sg)`` split keys, ``Cg Sg`` regroups and
``Cg S`` pieces; per interpolation ``Cg S`` interpolation tasks, ``Cg Sg + C Sg``
merge keys and ``C`` gathers. At 2048^3 (512 chunks x 1,025 slabs) the exchange
has 41,742 keys instead of 525,312, and the P(k) graph 65,863 tasks instead of
549,433 (``benchmarks/RESULTS.md``).

Memory: a split task holds its chunk and its pieces (the chunk plus the copies
of particles near slab edges: with slabs ``t`` planes thick, a fraction of
about ``(below + above) / t`` of the particles is copied, 25 % for CIC with two
shifts and ``t = 16``); a deposit task one slab and its particles; an
interpolation task the slab (or slabs) it reads and one piece. In two stages a
regroup task holds the pieces of about ``sqrt(C)`` chunks for ``sqrt(S)`` slabs
(about ``sqrt(C / S)`` chunks' worth), a piece about ``sqrt(C) / S`` of a chunk,
and a merge task the values of about ``sqrt(C / S)`` chunks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, host
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from . import domains
from .domains import _groups, _slices, rows_by_chunk
from .fft import slab_chunks

__all__ = ["SlabExchange", "SlabLayout", "after", "route_rows", "slab_layout"]


@dataclass(frozen=True)
class SlabLayout:
    """The slabs of an ``n^3`` periodic mesh along axis 0 and the reach of a kernel.

    Attributes
    ----------
    n : int
        Cells per side.
    chunks : tuple of int
        Planes per slab (sum ``n``), as :func:`~cosmo_dask.spatial.fft.slab_chunks`.
    box_size : float
        Side of the periodic box (length units).
    offset : float
        ``u = x n / box_size + offset`` is a particle's mesh coordinate (cells).
    below, above : int
        A particle with home plane ``h = floor(u)`` reaches the planes
        ``h - below .. h + above`` (margin included).
    """

    n: int
    chunks: tuple[int, ...]
    box_size: float
    offset: float
    below: int
    above: int

    @property
    def n_slabs(self) -> int:
        return len(self.chunks)

    @property
    def bounds(self) -> tuple[int, ...]:
        """The ``n_slabs + 1`` plane boundaries: slab ``s`` is ``[bounds[s], bounds[s+1])``."""
        return tuple(int(b) for b in np.cumsum((0,) + self.chunks))

    def slab(self, s: int) -> tuple[int, int]:
        """``(lo, hi)``: the planes of slab ``s``."""
        b = self.bounds
        return b[s], b[s + 1]

    def plane_slab(self) -> np.ndarray:
        """(n,) int64: the slab holding each plane."""
        return np.repeat(np.arange(self.n_slabs, dtype=np.int64), self.chunks)


def slab_layout(n: int, n_slabs: int, box_size: float, *, order: int,
                shifts: Sequence[float] = (0.0,)) -> SlabLayout:
    """The layout of ``n_slabs`` slabs for assignment kernels of ``order`` and ``shifts``.

    Parameters
    ----------
    n : int
        Cells per side.
    n_slabs : int
        Number of slabs (at most ``n``).
    box_size : float
        Periodic box side (length units).
    order : int
        Kernel order: 1 (NGP), 2 (CIC), 3 (TSC), 4 (PCS); it touches ``order``
        planes per axis.
    shifts : sequence of float
        The mesh shifts (cells) the pieces will be used with, e.g. ``(0, 0.5)``
        for an interlaced pair: one routing serves them all.
    """
    if order not in (1, 2, 3, 4):
        raise ParameterError(f"slab_layout: order must be 1, 2, 3 or 4, got {order!r}")
    shifts = [float(s) for s in shifts]
    if not shifts or not all(math.isfinite(s) for s in shifts):
        raise ParameterError(f"slab_layout: shifts must be finite numbers, got {shifts!r}")
    spread = math.ceil(max(shifts) - min(shifts))
    reach = (order - 1) // 2  # planes a kernel touches below its home plane
    return SlabLayout(n=int(n), chunks=slab_chunks(n, n_slabs), box_size=float(box_size),
                      offset=min(shifts) - 0.5, below=reach + 1,
                      above=reach + 1 + spread + 1)


# ----------------------------------------------------------------------------- routing
def route_rows(pos, layout: SlabLayout):
    """Which rows of a chunk go to which slab: ``(rows, bounds)``.

    ``rows[bounds[s]:bounds[s + 1]]`` are the rows (increasing) of the
    particles sent to slab ``s``; ``bounds`` is a host (n_slabs + 1,) array.
    NumPy or CuPy, following ``pos``.
    """
    xp = array_module(pos)
    m, n, n_slabs = int(pos.shape[0]), layout.n, layout.n_slabs
    fn = float(n)
    u = pos[:, 0].astype(np.float64) * (n / layout.box_size) + layout.offset
    bad = ~xp.isfinite(u)
    u[bad] = 0.0
    u = u - fn * xp.floor(u / fn)
    home = xp.floor(u).astype(np.int64) % n
    del u
    plane_slab = xp.asarray(layout.plane_slab())
    span = min(layout.below + layout.above + 1, n)
    first = (home - layout.below) % n
    s0 = plane_slab[first]
    s0[bad] = 0  # the kernels of slab 0 report non-finite positions
    rows, slabs = [xp.arange(m, dtype=np.int64)], [s0]
    prev = s0
    for d in range(1, span):
        sd = plane_slab[(first + d) % n]
        new = (sd != prev) & (sd != s0) & ~bad  # a new slab, not the first come round again
        idx = xp.nonzero(new)[0]
        if idx.size:
            rows.append(idx)
            slabs.append(sd[idx])
        prev = sd
    rows_all = xp.concatenate(rows) if len(rows) > 1 else rows[0]
    slab_all = xp.concatenate(slabs) if len(slabs) > 1 else slabs[0]
    order = xp.argsort(slab_all * max(m, 1) + rows_all)  # unique keys: slab, then row
    rows_all, slab_all = rows_all[order], slab_all[order]
    bounds = host(xp.searchsorted(slab_all, xp.arange(n_slabs + 1)))
    return rows_all, bounds


def _split_chunk(pos, mass, layout: SlabLayout, start: int | None = None,
                 groups: tuple[tuple[int, int], ...] | None = None):
    """``mesh-split``: one ``(pos, mass, rows)`` piece per slab (``mass`` None: one mass).

    Two-stage (``start`` and ``groups`` given): the rows are global (``start`` = the
    chunk's first row) and the pieces come as one list per slab range ``[a, b)`` of
    ``groups``.
    """
    rows, bounds = route_rows(pos, layout)
    if mass is not None and array_module(mass) is not array_module(rows):
        mass = host(mass) if array_module(rows) is np else array_module(rows).asarray(mass)
    out = []
    for s in range(layout.n_slabs):
        r = rows[int(bounds[s]):int(bounds[s + 1])]
        out.append((pos[r], None if mass is None else mass[r], r if start is None else r + start))
    return tuple(out) if groups is None else _slices(out, groups)


def _concat_pieces(pieces) -> tuple:
    """Pieces ``(pos, mass, rows)`` of consecutive chunks for one slab as one piece: the
    chunks' particles concatenated in chunk order (rows global, so still increasing)."""
    if len(pieces) == 1:
        return pieces[0]
    xp = array_module(pieces[0][0])
    pos = xp.concatenate([p[0] for p in pieces])
    mass = None if pieces[0][1] is None else xp.concatenate([p[1] for p in pieces])
    return pos, mass, xp.concatenate([p[2] for p in pieces])


def _regroup(*lists) -> tuple:
    """``mesh-regroup``: the split lists of a group of consecutive chunks for one group of
    slabs -> one piece per slab of the group (:func:`_concat_pieces`)."""
    return tuple(_concat_pieces([lst[q] for lst in lists]) for q in range(len(lists[0])))


def _within(func, r0: int, r1: int, pieces, lo, hi):
    """``func(pieces, lo, hi)`` on the pieces' particles of global rows ``[r0, r1)`` only
    (a run of chunks whose first or last chunk group is shared with another run)."""
    cut = []
    for pos, mass, rows in pieces:
        xp = array_module(rows)
        a, b = host(xp.searchsorted(rows, xp.asarray([r0, r1], dtype=rows.dtype))).tolist()
        cut.append((pos[a:b], None if mass is None else mass[a:b], rows[a:b]))
    return func(cut, lo, hi)


def _gated(func, pieces, lo, hi, _barrier_token):
    return func(pieces, lo, hi)


def _whole_piece(pos, mass) -> tuple:
    """A chunk as the one piece of a one-slab mesh (rows None: all, in order)."""
    return pos, mass, None


def _add(*blocks):
    """Sum partial slabs into the first (each has this task as only consumer)."""
    out = blocks[0]
    for b in blocks[1:]:
        out += b
    return out


def _gather(m: int, ncols: int, columns: tuple, finish, *parts_and_args):
    """Values of one chunk: ``parts`` of ``(rows, values)`` added at their rows and columns
    (``columns[j] = (c0, c1)`` for part ``j``), then ``finish(out, *args)``."""
    parts = parts_and_args[:len(columns)]
    args = parts_and_args[len(columns):]
    return _add_parts(m, ncols, columns, finish, parts, args)


def _cut_parts(bounds: tuple[int, ...], *parts) -> list:
    """``<name>-merge``: parts ``(rows, values)`` of a group of consecutive chunks (global
    rows, increasing) cut by chunk (``bounds``: the chunks' first rows and the last
    one's end): per chunk, the list of its ``(rows, values)`` of each part, in order."""
    cuts = [rows_by_chunk(bounds, rows, vals) for rows, vals in parts]
    return [[c[q] for c in cuts] for q in range(len(bounds) - 1)]


def _gather_lists(m: int, ncols: int, columns: tuple, finish, start: int, n_lists: int,
                  *lists_and_args):
    """:func:`_gather` of the parts in ``n_lists`` lists of :func:`_cut_parts`, their global
    rows less ``start`` (the chunk's first row)."""
    parts = [(rows - start, vals) for lst in lists_and_args[:n_lists] for rows, vals in lst]
    return _add_parts(m, ncols, columns, finish, parts, lists_and_args[n_lists:])


def _interpolate_whole(funcs: tuple, n: int, finish, piece, *meshes_and_args):
    """``<name>``, one-slab meshes: a chunk's values from every group's meshes (whole, the
    chunk its own piece) side by side, then ``finish(values, *args)``. ``funcs``: the
    groups' ``(func, number of meshes)``. The values are those of the slab tasks and
    the gather (which adds each column's one part to zeros) bit for bit."""
    values, k = [], 0
    for func, count in funcs:
        values.append(func(piece, 0, n, *meshes_and_args[k:k + count])[1])
        k += count
    xp = array_module(values[0])
    out = values[0] if len(values) == 1 else xp.concatenate(values, axis=1)
    out = out.astype(np.float64, copy=False)
    return finish(out, *meshes_and_args[k:]) if finish is not None else out


def _add_parts(m: int, ncols: int, columns: tuple, finish, parts, args):
    xp = array_module(parts[0][1])
    out = xp.zeros((m, ncols), dtype=np.float64)
    for (c0, c1), (rows, vals) in zip(columns, parts, strict=True):
        if rows is None:
            out[:, c0:c1] += vals
        elif rows.size:
            out[rows, c0:c1] += vals
    return finish(out, *args) if finish is not None else out


# ----------------------------------------------------------------------------- ordering
def _done(*_):
    """A barrier's token: nothing (its inputs have been computed)."""
    return None


def _first(value, *_):
    return value


def _barrier(g: TaskGraph, deps: Sequence[da.Array], name: str):
    """Add to ``g`` tasks finishing when every chunk of ``deps`` is computed; returns the
    reference of the last (``(<name>-barrier,)``).

    One token task per chunk (``(<name>-token, d, j)``, run where the chunk is, returning
    None) and one barrier over the tokens, so nothing but Nones travels to the barrier.
    """
    tokens = []
    for d, dep in enumerate(deps):
        g.add_input(dep)
        for j, index in enumerate(np.ndindex(*dep.numblocks)):
            tokens.append(g.add((f"{name}-token", d, j), _done, g.chunk(dep, *index)))
    return g.add((f"{name}-barrier",), _done, *tokens)


def after(x: da.Array, *deps: da.Array, name: str = "mesh-after") -> da.Array:
    """``x`` (same values, no copy) whose blocks are handed on only once every chunk of
    ``deps`` is computed: an order on the graph that bounds memory, e.g. one force
    component's mesh made only after the previous component was interpolated and
    freed. Tasks ``<name>-token`` (one per chunk of ``deps``), ``<name>-barrier``
    and ``<name>`` (one per block of ``x``)."""
    out = f"{name}-{tokenize(x, *deps)}"
    g = TaskGraph([x])
    gate = _barrier(g, deps, out)
    for index in np.ndindex(*x.numblocks):
        g.add((out, *index), _first, g.chunk(x, *index), gate)
    return g.array(out, x.chunks, x._meta, x.dtype)


class SlabExchange:
    """Particle chunks routed to the slabs of a layout: the graph of their pieces.

    Parameters
    ----------
    pos : dask array (N, 3)
        Positions, chunked along rows only (NumPy or CuPy chunks).
    mass : dask array (N,) chunked like ``pos``, or a float
        Carried along in the pieces (None in a piece when one number).
    layout : SlabLayout
        The mesh's slabs and the kernel's reach.
    name : str
        Task-name prefix (``<name>-split``, ``<name>-piece``).

    The pieces, the deposits and the interpolations are tasks of one
    :class:`~cosmo_dask.core.task_graph.TaskGraph`, so every mesh and every value array
    made from the exchange shares its (large) piece layer.
    """

    def __init__(self, pos: da.Array, mass, layout: SlabLayout, name: str = "mesh"):
        self.pos, self.mass, self.layout = pos, mass, layout
        n_chunks, n_slabs = pos.numblocks[0], layout.n_slabs
        #: chunks and slabs in two stages (module docstring); read when the graph is built
        self.two_stage = n_slabs > 1 and n_chunks * n_slabs > domains.TWO_STAGE_PAIRS
        # the two-stage pieces hold other values than the one-stage ones: in the token
        self.token = tokenize(pos, mass, layout, *(("two-stage",) if self.two_stage else ()))
        self.name = f"{name}-piece-{self.token}"
        split = f"{name}-split-{self.token}"
        mass_array = isinstance(mass, da.Array)
        g = self._graph = TaskGraph([pos] + ([mass] if mass_array else []))
        self._pieces: dict[tuple, Any] = {}  # (slab, first, last chunk) -> their pieces
        #: first row of every chunk, and the total
        self._starts = tuple(int(b) for b in np.cumsum((0,) + tuple(pos.chunks[0])))
        #: the chunk range ``[c0, c1)`` of each source of pieces (a chunk, or a group)
        self._sources = [(i, i + 1) for i in range(n_chunks)]
        if self.two_stage:
            self._sources, self._slab_groups = _groups(n_chunks), _groups(n_slabs)
            self._in_group = [(k, s - a) for k, (a, b) in enumerate(self._slab_groups)
                              for s in range(a, b)]  # slab -> (its group, place in it)
            regroup = f"{name}-regroup-{self.token}"
            lists = [g.add_split((split, i), _split_chunk, g.chunk(pos, i, 0),
                                 g.chunk(mass, i) if mass_array else None, layout,
                                 self._starts[i], tuple(self._slab_groups),
                                 n=len(self._slab_groups))
                     for i in range(n_chunks)]
            for j, (c0, c1) in enumerate(self._sources):
                for k, (a, b) in enumerate(self._slab_groups):
                    g.add((regroup, j, k), _regroup, *[lists[i][k] for i in range(c0, c1)])
                    g.add_items((regroup, j, k), b - a, self.name)
            return
        for i in range(n_chunks):
            m = g.chunk(mass, i) if mass_array else None
            if n_slabs == 1:
                g.add((self.name, i, 0), _whole_piece, g.chunk(pos, i, 0), m)
            else:
                g.add((split, i), _split_chunk, g.chunk(pos, i, 0), m, layout)
                g.add_items((split, i), n_slabs, self.name)

    @property
    def n_chunks(self) -> int:
        return self.pos.numblocks[0]

    def piece(self, j: int, s: int) -> tuple:
        """The key of source ``j``'s piece for slab ``s``: ``(pos, mass, rows)``.

        One stage: source ``j`` is chunk ``j`` and ``rows`` are rows in the chunk;
        two stages: source ``j`` is the ``j``-th group of consecutive chunks, the piece
        their particles in chunk order and ``rows`` global rows (increasing)."""
        if self.two_stage:
            return (self.name, j, *self._in_group[s])
        return (self.name, j, s)

    def deposit(self, func: Callable, *, name: str, dtype, groups: int = 1,
                split_every: int = 8, after: Sequence[da.Array] = (), **kwargs) -> da.Array:
        """A mesh ``(n, n, n)`` in the layout's slabs, deposited slab by slab.

        ``func(pieces, lo, hi, **kwargs)`` returns the ``(hi - lo, n, n)`` slab
        holding the deposits of ``pieces`` (a list of ``(pos, mass, rows)``, in chunk
        order: one per chunk, or in two stages one per group of chunks) on planes
        ``lo .. hi - 1`` (a fresh array: the partial sums add into it).
        Each slab's chunks are cut into ``groups`` runs of consecutive chunks
        (one task each) whose slabs are summed by a tree of ``split_every``-way
        in-place additions. Tasks: ``<name>-part`` and ``<name>-sum``; chunks
        ``(layout.chunks, (n,), (n,))``, the pieces' array type. ``after``: dask
        arrays to compute first (see :func:`after`): no deposit starts before.
        """
        lay, n, g = self.layout, self.layout.n, self._graph
        token = tokenize(self.token, func, kwargs, groups, split_every,
                         [a.name for a in after])
        out, part, add = f"{name}-{token}", f"{name}-part-{token}", f"{name}-sum-{token}"
        task = functools.partial(func, **kwargs) if kwargs else func
        runs = np.array_split(np.arange(self.n_chunks), max(1, min(groups, self.n_chunks)))
        gate: tuple = ()
        if after:
            gate = (_barrier(g, after, out),)
        run_tasks, run_sources = [], []
        for run in runs:  # the sources of each run's pieces, and its task
            first, last = int(run[0]), int(run[-1])
            sources = [j for j, (c0, c1) in enumerate(self._sources)
                       if c0 <= last and c1 > first]
            whole = (self._sources[sources[0]][0] == first
                     and self._sources[sources[-1]][1] == last + 1)
            t = task if whole else functools.partial(_within, task, self._starts[first],
                                                     self._starts[last + 1])
            run_tasks.append(functools.partial(_gated, t) if after else t)
            run_sources.append((first, last, sources))
        for s in range(lay.n_slabs):
            lo, hi = lay.slab(s)
            keys = []
            for gi, (first, last, sources) in enumerate(run_sources):
                key = (out, s, 0, 0) if len(runs) == 1 else (part, s, gi)
                pieces = self._pieces.get((s, first, last))
                if pieces is None:  # one argument for every mesh deposited from the run
                    pieces = self._pieces[s, first, last] = g.list(
                        g.refs([self.piece(j, s) for j in sources]))
                keys.append(g.add(key, run_tasks[gi], pieces, lo, hi, *gate))
            level = 0
            while len(keys) > 1:
                nxt = []
                for j in range(0, len(keys), split_every):
                    last = len(keys) <= split_every
                    key = (out, s, 0, 0) if last else (add, s, level, j)
                    nxt.append(g.add(key, _add, *keys[j:j + split_every]))
                keys, level = nxt, level + 1
        meta = array_module(self.pos).empty((0, 0, 0), dtype=dtype)
        return g.array(out, (lay.chunks, (n,), (n,)), meta, np.dtype(dtype))

    def interpolate(self, groups: Sequence[tuple[Callable, Sequence[da.Array], int]], *,
                    name: str, dtype, finish: Callable | None = None,
                    finish_args: Sequence[Any] = ()) -> da.Array:
        """Values at the particles from meshes in the layout's slabs, chunked like ``pos``.

        Parameters
        ----------
        groups : sequence of ``(func, meshes, ncols)``
            ``func(piece, lo, hi, *slabs)`` gets one piece and slab ``[lo, hi)`` of
            each of ``meshes`` (dask arrays chunked ``(layout.chunks, n, n)``) and
            returns ``(rows, values)``: the piece's ``rows`` as given (rows in the
            chunk, or in two stages global rows of a group of chunks) and float64
            ``values`` of shape ``(len(piece), ncols)``, the slab's part of the
            sum. One ``<name>-slab`` task per (group, slab, chunk or group of
            chunks).
        name : str
            Task-name prefix; the gather tasks are ``<name>``.
        dtype : dtype
            dtype of the result (that ``finish`` returns).
        finish : callable, optional
            ``finish(values, *args)``: the gathered ``(m, sum ncols)`` float64
            values of a chunk (the groups' columns side by side) -> the chunk's
            result; default: the values as they are.
        finish_args : sequence
            Dask arrays chunked like ``pos`` along axis 0 and not along the others
            (their chunk ``i`` is passed) or plain values, appended to ``finish``'s
            arguments.

        Returns
        -------
        dask array (N, ncols_out)
            ``pos``'s row chunks; ``ncols_out`` = the columns ``finish`` returns
            (probed on a zero-row block).
        """
        lay, g = self.layout, self._graph
        for _, meshes, _ in groups:
            for mesh in meshes:
                if tuple(mesh.chunks[0]) != lay.chunks or len(mesh.chunks[1]) != 1 \
                        or len(mesh.chunks[2]) != 1:
                    raise ParameterError(f"{name}: a mesh must be in the layout's slabs "
                                         f"({lay.chunks}, n, n), got chunks {mesh.chunks}")
        token = tokenize(self.token, [(f, [m.name for m in ms], c) for f, ms, c in groups],
                         finish, finish_args)
        out, slab = f"{name}-{token}", f"{name}-slab-{token}"
        for _, meshes, _ in groups:
            for mesh in meshes:
                g.add_input(mesh)
        for a in finish_args:
            if isinstance(a, da.Array):
                g.add_input(a)
        ref = g.ref
        xp = array_module(self.pos)
        if lay.n_slabs == 1:  # one task per chunk reads every mesh: no parts, no gathers
            funcs = tuple((func, len(meshes)) for func, meshes, _ in groups)
            probe = np.zeros((0, sum(c for _, _, c in groups)))
            probe_args = [np.zeros((0, *a.shape[1:])) if isinstance(a, da.Array) else a
                          for a in finish_args]
            ncols_out = (finish(probe, *probe_args) if finish is not None else probe).shape[1]
            for i in range(len(self.pos.chunks[0])):
                meshes = [g.chunk(mesh, 0, 0, 0) for _, ms, _ in groups for mesh in ms]
                args = [g.chunk(a, i, *(0,) * (a.ndim - 1)) if isinstance(a, da.Array) else a
                        for a in finish_args]
                g.add((out, i, 0), _interpolate_whole, funcs, lay.n, finish,
                      ref(self.piece(i, 0)), *meshes, *args)
            return g.array(out, (self.pos.chunks[0], (ncols_out,)),
                           xp.empty((0, 0), dtype=dtype), np.dtype(dtype))
        columns, c0 = [], 0
        for gi, (func, meshes, ncols) in enumerate(groups):
            for s in range(lay.n_slabs):
                lo, hi = lay.slab(s)
                slabs = [g.chunk(mesh, s, 0, 0) for mesh in meshes]
                for j in range(len(self._sources)):
                    g.add((slab, gi, s, j), func, ref(self.piece(j, s)), lo, hi, *slabs)
            columns.append((c0, c0 + ncols))
            c0 += ncols
        ncols_in = c0
        probe = np.zeros((0, ncols_in))
        probe_args = [np.zeros((0, *a.shape[1:])) if isinstance(a, da.Array) else a
                      for a in finish_args]
        ncols_out = (finish(probe, *probe_args) if finish is not None else probe).shape[1]
        rows = self.pos.chunks[0]
        if self.two_stage:
            self._gather_two_stage(out, f"{name}-merge-{token}", slab, len(groups), columns,
                                   ncols_in, finish, finish_args)
            return g.array(out, (rows, (ncols_out,)), xp.empty((0, 0), dtype=dtype),
                           np.dtype(dtype))
        part_columns = tuple(columns[gi] for gi in range(len(groups))
                             for _ in range(lay.n_slabs))
        for i, m in enumerate(rows):
            parts = [ref((slab, gi, s, i)) for gi in range(len(groups))
                     for s in range(lay.n_slabs)]
            args = [g.chunk(a, i, *(0,) * (a.ndim - 1)) if isinstance(a, da.Array) else a
                    for a in finish_args]
            g.add((out, i, 0), _gather, int(m), ncols_in, part_columns, finish, *parts, *args)
        return g.array(out, (rows, (ncols_out,)), xp.empty((0, 0), dtype=dtype),
                       np.dtype(dtype))

    def _gather_two_stage(self, out: str, merge: str, slab: str, n_groups: int,
                          columns: list, ncols: int, finish, finish_args) -> None:
        """The way back in two stages: one ``merge`` task per (group of chunks, group of
        slabs) cuts the parts ``(slab, gi, s, j)`` of its slabs by chunk, and one gather
        ``(out, i, 0)`` per chunk adds the cut parts of every slab group at their rows,
        each column's parts in slab order (as the one-stage gather)."""
        g = self._graph
        part_columns = tuple(columns[gi] for a, b in self._slab_groups
                             for gi in range(n_groups) for _ in range(a, b))
        for j, (c0, c1) in enumerate(self._sources):
            lists = [g.add_split((merge, j, k), _cut_parts, self._starts[c0:c1 + 1],
                                 *[g.ref((slab, gi, s, j)) for gi in range(n_groups)
                                   for s in range(a, b)], n=c1 - c0)
                     for k, (a, b) in enumerate(self._slab_groups)]
            for q, i in enumerate(range(c0, c1)):
                args = [g.chunk(a, i, *(0,) * (a.ndim - 1)) if isinstance(a, da.Array)
                        else a for a in finish_args]
                m = self._starts[i + 1] - self._starts[i]
                g.add((out, i, 0), _gather_lists, m, ncols, part_columns, finish,
                      self._starts[i], len(lists), *[lst[q] for lst in lists], *args)
