"""The domain layout: one decomposition of a chunked particle set, both ways.

:func:`decompose` fixes how the rows of a chunked particle set (dask arrays of ``N``
rows in row chunks) map onto the domains of a :class:`~.domains.DomainGrid`, with
ghost copies within ``ghost_width`` of a domain. The :class:`DomainLayout` it returns
moves data both ways, in the spirit of pmesh/nbodykit's ``layout.exchange`` /
``layout.gather``:

:meth:`DomainLayout.exchange`
    Positions and any other per-particle columns -> one
    :class:`~.domains.DomainPart` per domain (owned rows first, in increasing
    global index, then the ghosts), as ``Delayed`` values. Tasks
    ``<name>-split-<token>`` (one per chunk, plus one key per (chunk, domain)
    piece), ``<name>-regroup-<token>`` (two stages, above
    :data:`~.domains.TWO_STAGE_PAIRS` pairs) and ``<name>-domain-<token>`` (one
    per domain).
:meth:`DomainLayout.gather`
    The way back: per-domain results of the owned rows -> dask arrays in the
    input's row order and row chunks (ghost rows never come back). Each domain's
    task cuts its owned rows by chunk with :func:`~.domains.rows_by_chunk`
    (``rows_by_chunk(layout.bounds, index, *columns)``, inside the task that made
    them); tasks ``<name>-piece-<token>`` (one per (domain, chunk) pair that share
    rows, or two stages ``-piece-out`` / ``-piece-merge``) carry one piece each, and
    one ``<name>-<output>-<token>`` task per chunk and output writes the rows
    (:func:`~.domains.chunk_rows`). No task reads a whole domain's results for a
    chunk.

Round trip: ``gather`` of the owned rows of what ``exchange`` gave returns every
column exactly, in chunk order (``tests/spatial/test_layout.py``, periodic and isolated
boxes, with and without ghosts, one and two stages).

Users: FOF (``fof``, ghosts of one or two linking lengths, :mod:`cosmo_dask.halos.fof_graph`)
and tree gravity, hence TreePM's short range (``gravity``, no ghosts: the locally
essential trees replace them, :mod:`cosmo_dask.gravity.tree.graph`). ``docs/spatial.md``
lists the other decompositions of cosmo_dask (mesh slabs, MEX's radial buckets, PSE's
Lagrangian columns) and why each stays apart.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from . import domains
from .domains import (
    DomainGrid,
    _groups,
    _merge_rows,
    _slices,
    chunk_rows,
    gather_domain,
    regroup,
    split_chunk,
    split_chunk_grouped,
)

__all__ = ["DomainLayout", "decompose", "domain_worker"]

#: a placed gather (``gather(workers=...)``) pins and persists at most this many pieces,
#: each a task of its own layer; above, the pieces are left to the scheduler
PLACED_PIECES = 1024


def domain_worker(workers: Sequence[str], d: int) -> str | None:
    """The worker of domain ``d``'s pinned tasks: ``workers[d mod W]`` (None without
    workers: the scheduler chooses). One rule for the state kept by domain
    (:meth:`DomainLayout.by_domain`) and the tasks that follow it."""
    return workers[d % len(workers)] if workers else None


class DomainLayout:
    """A chunked particle set decomposed over the domains of a grid (:func:`decompose`).

    Attributes
    ----------
    grid : DomainGrid
        The domains.
    ghost_width : float
        Ghost copies reach this far (length units) beyond a domain's region.
    name : str
        Kind of the exchange tasks (``<name>-split``, ``<name>-domain``, ...).
    pos : dask.array.Array
        (N, 3) positions, as given (NumPy or CuPy chunks).
    bounds : numpy.ndarray
        (n_chunks + 1,) int64: the first row of every row chunk of ``pos``, and N.
        Per-domain results are cut by these (:func:`~.domains.rows_by_chunk`) for
        :meth:`gather`.
    """

    def __init__(self, pos: da.Array, grid: DomainGrid, ghost_width: float, name: str):
        self.pos, self.grid, self.ghost_width, self.name = pos, grid, ghost_width, name
        self.bounds = np.cumsum((0,) + tuple(pos.chunks[0]))

    @property
    def n_domains(self) -> int:
        return self.grid.n_domains

    @property
    def n_chunks(self) -> int:
        return len(self.bounds) - 1

    @property
    def row_chunks(self) -> tuple[int, ...]:
        """Rows of every chunk (the output chunks of :meth:`gather`)."""
        return tuple(int(b) for b in np.diff(self.bounds))

    # ------------------------------------------------------------------ to the domains
    def exchange(self, **columns: da.Array) -> list[Any]:
        """The particles of every domain: owned rows and ghost copies.

        Parameters
        ----------
        **columns : dask.array.Array
            Other per-particle arrays (ids, masses, velocities, ...) of ``N`` rows to
            carry along, by name (rechunked to the positions' row chunks if needed).

        Returns
        -------
        list of Delayed
            One :class:`~.domains.DomainPart` per domain (NumPy or CuPy arrays like
            the chunks): positions as stored, global indices, owned rows first in
            increasing index, ``extra`` holding ``columns`` by name.

        Notes
        -----
        Graph size: ``n_chunks`` split tasks, ``n_chunks * n_domains`` piece keys
        (``(<name>-split-<token>, chunk, domain)``: a domain task fetches its pieces,
        not whole splits) and ``n_domains`` domain tasks. Above
        :data:`~.domains.TWO_STAGE_PAIRS` pairs the split goes in two stages: each
        chunk is cut into groups of about ``sqrt(n_domains)`` domains, and a
        ``<name>-regroup`` task per (group of about ``sqrt(n_chunks)`` chunks, group of
        domains) cuts those into domains, so that there are about
        ``n_chunks sqrt(n_domains) + n_domains sqrt(n_chunks)`` keys and every task
        still holds about one chunk; the domains are the same, bit for bit.
        """
        pos, grid, ghost_width, name = self.pos, self.grid, self.ghost_width, self.name
        extra = dict(columns)
        names = tuple(extra)
        for key, arr in extra.items():
            if arr.chunks[0] != pos.chunks[0]:
                extra[key] = arr.rechunk((pos.chunks[0],) + arr.chunks[1:])
        # the two-stage split's keys hold other values than the one-stage split's: in the
        # token
        two_stage = self.n_chunks * grid.n_domains > domains.TWO_STAGE_PAIRS
        token = tokenize(pos, grid, ghost_width, names, *extra.values(), two_stage)
        if len(pos.chunks[1]) != 1:
            pos = pos.rechunk({1: -1})
        starts = self.bounds[:-1]
        n_dom = grid.n_domains
        g = TaskGraph([pos, *extra.values()])
        # tuple keys: the split tasks and their pieces are one layer, the domains another
        extra_chunk = [[g.chunk(e, i, *(0,) * (e.ndim - 1)) for e in extra.values()]
                       for i in range(len(starts))]
        if not two_stage:
            pieces = [g.add_split((f"{name}-split-{token}", i), split_chunk,
                                  g.chunk(pos, i, 0), int(s), grid, ghost_width,
                                  *extra_chunk[i], n=n_dom)
                      for i, s in enumerate(starts)]
            of_domain = [[p[d] for p in pieces] for d in range(n_dom)]
        else:  # two stages: chunks -> groups of domains; groups of chunks -> domains
            cgroups, dgroups = _groups(len(starts)), _groups(n_dom)
            split = [g.add_split((f"{name}-split-{token}", i), split_chunk_grouped,
                                 g.chunk(pos, i, 0), int(s), grid, ghost_width,
                                 tuple(dgroups), *extra_chunk[i], n=len(dgroups))
                     for i, s in enumerate(starts)]
            of_domain = [[] for _ in range(n_dom)]
            for j, (c0, c1) in enumerate(cgroups):
                for k, (a, b) in enumerate(dgroups):
                    out = g.add_split((f"{name}-regroup-{token}", j, k), regroup,
                                      *[split[i][k] for i in range(c0, c1)], n=b - a)
                    for q, d in enumerate(range(a, b)):
                        of_domain[d].append(out[q])
        keys = [g.add((f"{name}-domain-{token}", d), gather_domain, d, names,
                      *of_domain[d]).key for d in range(n_dom)]
        return [g.delayed(key) for key in keys]

    # ------------------------------------------------------------------ kept by domain
    def by_domain(self, **columns: da.Array) -> dict[str, da.Array]:
        """The particles reordered by domain and held in memory: chunk ``d`` of every
        returned array is domain ``d``'s own rows (in increasing input index).

        A simulation keeps its state this way between steps (:func:`cosmo_dask.simulation.run`):
        the rows of domain ``d`` stay on one worker (``d mod W`` of the active client's
        ``W`` workers, sorted by address), and the next step's exchange, over chunks that
        are already domains, moves only the particles that crossed into another domain;
        the other tasks of the step follow their data there.

        Parameters
        ----------
        **columns : dask.array.Array
            Per-particle arrays of ``N`` rows to reorder with the positions, by name.

        Returns
        -------
        dict of dask.array.Array
            ``"pos"`` and every column, by name, in ``n_domains`` row chunks (some may be
            empty), NumPy or CuPy chunks as given; their tasks have run (the values are
            in worker memory under a client).

        Raises
        ------
        ParameterError
            A layout with ghosts (``ghost_width > 0``), or a column named ``pos``.

        Notes
        -----
        Two graph rounds: the exchange and the owned rows (one task per domain, pinned to
        its worker), then their sizes (one integer per domain) for the chunks.
        """
        if self.ghost_width:
            raise ParameterError("by_domain: the layout must have no ghosts "
                                 f"(ghost_width={self.ghost_width:g})")
        if "pos" in columns:
            raise ParameterError("by_domain: 'pos' is the positions' name; name the "
                                 "other columns otherwise")
        from ..core.progress import worker_addresses

        names = tuple(columns)
        parts = self.exchange(**columns)
        token = tokenize(self.pos, self.grid, names, *columns.values())
        workers = worker_addresses()
        g = TaskGraph(parts)
        kind = f"{self.name}-owned-{token}"
        keys = [g.add((kind, d), domains.owned_rows, g.ref(p), names,
                      worker=domain_worker(workers, d)).key
                for d, p in enumerate(parts)]
        held = g.persist(keys, label=None)
        h = TaskGraph(held)
        sizes = h.compute([h.add((f"{self.name}-owned-rows-{token}", d), operator.getitem,
                                 h.ref(x), 0).key for d, x in enumerate(held)],
                          label=None, show=False)
        metas = [("pos", self.pos)] + list(columns.items())
        outputs = [(f"{self.name}-{key}-{token}", k + 1, arr.shape[1:], arr._meta)
                   for k, (key, arr) in enumerate(metas)]
        arrays = h.item_arrays([x.key for x in held], [int(n) for n in sizes], outputs)
        return {key: arr for (key, _), arr in zip(metas, arrays, strict=True)}

    # ------------------------------------------------------------------ the way back
    def _pieces(self, g: TaskGraph, per_domain: Sequence[Any], name: str,
                chunks_of: Sequence[Sequence[int]] | None = None,
                workers: Sequence[str] = ()) -> list[list]:
        """For each chunk, references to pieces ``(index, *columns)`` of its rows (each
        in increasing index, only the chunk's rows): keys ``(name, d, i)``, or in two
        stages (``<name>-out``, ``<name>-merge``) when they make fewer keys. With
        ``workers``, one stage, piece ``(name, d, i)`` pinned to worker ``d mod W``."""
        n_chunks, n_dom = self.n_chunks, len(per_domain)
        pieces: list[list] = [[] for _ in range(n_chunks)]
        pairs = n_chunks * n_dom if chunks_of is None else sum(len(c) for c in chunks_of)
        cg, dg = len(_groups(n_chunks)), len(_groups(n_dom))
        two_stage = n_dom + n_dom * cg + dg * cg + dg * n_chunks  # keys of the two stages
        if workers or pairs <= domains.TWO_STAGE_PAIRS or pairs <= two_stage:
            for d, ref in enumerate(per_domain):
                chunks = range(n_chunks) if chunks_of is None else \
                    np.asarray(chunks_of[d], dtype=np.int64).tolist()
                for i in chunks:
                    pieces[i].append(g.add((name, d, i), operator.getitem, ref, i,
                                           worker=domain_worker(workers, d)))
            for i in range(n_chunks):  # a chunk no domain holds rows of (0 rows): an empty
                if not pieces[i] and n_dom:  # piece, of the domains' array type
                    pieces[i].append(g.add((name, 0, i), operator.getitem, per_domain[0], i,
                                           worker=domain_worker(workers, 0)))
            return pieces
        cgroups, dgroups = _groups(n_chunks), _groups(n_dom)  # (chunks_of unused: too many)
        # stage 1: each domain's pieces in groups of chunks
        split = [g.add_split((f"{name}-out", d), _slices, ref, tuple(cgroups), n=len(cgroups))
                 for d, ref in enumerate(per_domain)]
        # stage 2: a group of domains, a group of chunks -> one piece per chunk
        for s, (a, b) in enumerate(dgroups):
            for j, (c0, c1) in enumerate(cgroups):
                out = g.add_split((f"{name}-merge", s, j), _merge_rows,
                                  *[split[d][j] for d in range(a, b)], n=c1 - c0)
                for q, i in enumerate(range(c0, c1)):
                    pieces[i].append(out[q])
        return pieces

    def gather(self, g: TaskGraph, per_domain: Sequence[Any],
               outputs: Sequence[tuple[str, tuple[int, ...], Any]], *, token: str,
               chunks_of: Sequence[Sequence[int]] | None = None,
               fill: float = 0, workers: Sequence[str] = ()) -> list[da.Array]:
        """Per-domain results of the owned rows -> dask arrays in the input's row order.

        Parameters
        ----------
        g : TaskGraph
            The graph holding (or reading, as inputs) the per-domain tasks; the way
            back's tasks are added to it.
        per_domain : sequence of task references
            One per domain (``g.ref``/``g.add`` results), in domain order. Domain
            ``d``'s value is ``rows_by_chunk(layout.bounds, index, *columns)``
            (:func:`~.domains.rows_by_chunk`): its owned rows' global indices, in
            increasing order, and one array per output, cut by chunk.
        outputs : sequence of (kind, trailing shape, meta)
            Output ``k`` is column ``k`` after the index: array
            ``<name>-<kind>-<token>`` of shape ``(N, *trailing)``, ``meta``'s array
            type and dtype (values are cast to it; NumPy pieces go to the GPU for a
            CuPy ``meta``).
        token : str
            Hashes every input of the per-domain results (it names the tasks).
        chunks_of : sequence of sequences of int, optional
            The chunks each domain holds rows of, when known (a persisted domain
            stage): pieces are made only for these. Default: every chunk of every
            domain.
        fill : scalar
            The value of a row no domain returns (none does when every domain
            returns all its owned rows).
        workers : sequence of str, optional
            Worker addresses: domain ``d``'s results are cut into their per-chunk pieces
            on worker ``d mod W`` and persisted there as the call returns (with at most
            :data:`PLACED_PIECES` pieces; else as without), so that a piece moves only to
            the chunk that reads it (a dask array's graph would drop the placement).

        Returns
        -------
        list of dask.array.Array
            One per output, in the row chunks of :attr:`pos`.

        Notes
        -----
        Graph size: a piece key per (domain, chunk) pair (those of ``chunks_of``);
        above :data:`~.domains.TWO_STAGE_PAIRS` pairs, when fewer, two stages: one
        ``<name>-piece-out`` split per domain into about ``sqrt(n_chunks)`` groups of
        chunks and one ``<name>-piece-merge`` task per (group of about
        ``sqrt(n_domains)`` domains, group of chunks); then one task per chunk and
        output.
        """
        if len(per_domain) != self.n_domains:
            raise ParameterError(f"gather: per_domain must hold one result per domain "
                                 f"({self.n_domains}), got {len(per_domain)}")
        n_pairs = (self.n_chunks * len(per_domain) if chunks_of is None
                   else sum(len(c) for c in chunks_of))
        workers = workers if n_pairs <= PLACED_PIECES else ()
        pieces = self._pieces(g, per_domain, f"{self.name}-piece-{token}", chunks_of, workers)
        if workers:  # persisted as built: the placement holds
            flat = [r.key for rs in pieces for r in rs]
            held = dict(zip(flat, g.persist(flat, label=None), strict=True))
            g = TaskGraph(list(held.values()))
            pieces = [[g.ref(held[r.key]) for r in rs] for rs in pieces]
        bounds = self.bounds
        arrays = []
        for column, (kind, trailing, meta) in enumerate(outputs, start=1):
            name = f"{self.name}-{kind}-{token}"
            gpu = array_module(meta) is not np
            tail = (0,) * len(trailing)
            for i in range(self.n_chunks):
                g.add((name, i, *tail), chunk_rows, column, int(bounds[i]),
                      int(bounds[i + 1]), meta.dtype, gpu, fill, *pieces[i])
            chunks = (self.row_chunks,) + tuple((int(t),) for t in trailing)
            arrays.append(g.array(name, chunks, meta))
        return arrays


def decompose(pos: da.Array, grid: DomainGrid, *, ghost_width: float = 0.0,
              name: str = "domains") -> DomainLayout:
    """The layout of a chunked particle set over the domains of ``grid``.

    Parameters
    ----------
    pos : dask.array.Array
        (N, 3) positions (length units), NumPy or CuPy chunks; other per-particle
        columns given to :meth:`DomainLayout.exchange` follow its row chunks.
    grid : DomainGrid
        The domains (:func:`~.domains.domain_grid`).
    ghost_width : float
        Copy every particle, as a ghost, to each neighbouring domain whose region lies
        within this distance (length units, ``>= 0`` and smaller than a domain's side
        along every cut axis); 0: no ghosts.
    name : str
        Kind of the layout's tasks (``fof``, ``gravity``).

    Returns
    -------
    DomainLayout

    Raises
    ------
    ParameterError
        ``ghost_width`` negative, not finite, or not smaller than a domain's side.
    """
    if not (ghost_width >= 0 and math.isfinite(ghost_width)):
        raise ParameterError(f"ghost_width must be finite and >= 0, got {ghost_width!r}")
    grid.check_ghost_width(ghost_width)
    return DomainLayout(pos, grid, ghost_width, name)
