"""Tree gravity as a Dask graph: domains, locally essential trees, group walks.

The particles are split among the domains of the shared decomposition (a
:class:`~cosmo_dask.spatial.layout.DomainLayout`, no ghosts). The graph, per domain
``d``:

``gravity-tree-d``
    The domain's octree (:func:`~cosmo_dask.spatial.octree.build_octree`) over
    its own particles, with node multipoles.
``gravity-bbox-d``
    The bounding box of those particles (48 bytes): the only thing other
    domains learn about ``d`` before sending it their trees.
``gravity-let-s-d``
    For every other domain ``s``: the part of ``s``'s tree that any group of
    ``d`` could open (:func:`~cosmo_dask.gravity.tree.walk.let_subtree`), i.e.
    node multipoles plus the particles of the leaves a walk from inside
    ``d``'s box may open. This locally essential tree (LET) is what moves
    between workers; never the remote domain's particles in bulk.
``gravity-blocklet-s-l-b`` and ``gravity-blockbox-l-b``
    Without a cutoff, a source well separated from a whole block of target
    domains (``2^l`` a side) sends one LET cut for the block's box (the union of
    its domains' boxes), read by every domain of the block (:func:`let_plan`):
    the same forces bit for bit, far fewer LET tasks.
``gravity-group-d-b``
    Batch ``b`` of ``d``'s groups (consecutive groups holding about
    ``GROUP_BATCH_PARTICLES`` particles, so a task takes about a second of
    one CPU core): one walk per group against ``d``'s own tree and against each LET
    (the same :func:`~cosmo_dask.gravity.tree.walk.interaction_lists` and
    :func:`~cosmo_dask.gravity.tree.list_kernels.evaluate_lists`), summed in domain
    order. On a GPU worker with a single domain (the default with one worker) the
    graph is one task, the GPU tree (:func:`~cosmo_dask.gravity.tree.forces_gpu.tree_forces_gpu`)
    on all the chunks concatenated (no scatter: the GPU tree sorts the particles itself and
    returns the input order), and one slice of it per output chunk.

On CuPy chunks with several domains (by default one per worker of the active
client), every tree, LET and group task runs on the GPU of the worker that holds it
(:mod:`cosmo_dask.gravity.tree.let_gpu`): the GPU octree, a LET cut on the source's
GPU, one ``gravity-group`` task per domain with the GPU walk and force kernels; the
LETs are the only trees that move.
``gravity-rows-d``
    Domain ``d``'s results (its batches, in increasing particle index) cut by
    input chunk (:func:`~cosmo_dask.spatial.domains.rows_by_chunk`).
``gravity-acc-c`` / ``gravity-pot-c``
    Accelerations and potentials of input chunk ``c``, from one piece of each
    domain's rows (the way back,
    :meth:`~cosmo_dask.spatial.layout.DomainLayout.gather`: in two stages when
    there are many chunks and domains); never whole domain results.

With a cutoff (TreePM's short range, ``r_cut``) in a periodic box, a domain
gets LETs only from the domains whose cells come within ``r_cut`` of its own
(the others' LETs would be empty: their walks add nothing).

Graph size: ``n_chunks`` splits, ``n_domains`` trees, boxes and rows tasks,
LETs: with a cutoff ``n_domains`` times the neighbours within ``r_cut``,
without one at most ``n_domains * (n_domains - 1)`` and with block LETs far fewer
(512 domains: 20,720 for an isolated system, 28,992 in a periodic box, against
261,632 per pair), at most :data:`MAX_GROUP_TASKS` group tasks and
the two exchanges (:meth:`~cosmo_dask.spatial.layout.DomainLayout.exchange`,
:meth:`~cosmo_dask.spatial.layout.DomainLayout.gather`). The default domain count is
at most :data:`MAX_DOMAINS`.

A walk through a LET cut for ``d``'s box gives every group inside that box
exactly the cells and leaves a walk through the whole remote tree gives, so
the domain split changes which trees exist, not the accuracy criterion.
Results do not depend on the chunking, the batching or the number of workers
(the domains and the order of every sum are fixed by ``n_domains``), bit for
bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from dask.base import tokenize

from ...core.backend import array_module, chunk_ranges, host, value_ranges
from ...core.progress import compute, worker_addresses, worker_count
from ...core.task_graph import TaskGraph
from ...spatial import decompose, domain_grid, rows_by_chunk
from ...spatial.layout import domain_worker
from .. import dispatch as kernels
from ..parameters import MAX_GROUP_DEFAULT, MAX_LEAF_DEFAULT, THETA_DEFAULT, default_r_cut

#: particles per domain the default ``n_domains`` aims at (CPU)
DOMAIN_PARTICLES = 1 << 21
#: particles per ``gravity-group`` task (whole groups; a tenth of a second of one core
#: for an isolated Plummer sphere, about a second for the TreePM short range:
#: benchmarks/RESULTS.md, Gravity, part (d))
GROUP_BATCH_PARTICLES = 1 << 15
#: most domains of the default decomposition (LET tasks grow as its square): above
#: ``MAX_DOMAINS * DOMAIN_PARTICLES`` (2^30) particles the domains grow instead
MAX_DOMAINS = 512
#: most ``gravity-group`` tasks of a graph: above, the batches grow beyond
#: ``GROUP_BATCH_PARTICLES`` (2^26 particles with one batch per 2^15; at 2048^3, 512
#: domains of 4 batches of 2^22 particles: 8 tasks per thread of 16 workers x 16
#: threads, each reading its domain's tree and LETs as a batch of 2^15 would)
MAX_GROUP_TASKS = 1 << 11


def domain_tree(part, mass, opts):
    """Task ``gravity-tree``: the octree of a domain's own particles (the contract
    :data:`~cosmo_dask.gravity.dispatch.domain_tree`: on the GPU for CuPy particles)."""
    n = part.n_owned
    m = mass if mass is not None else part.extra["mass"][:n]
    return kernels.domain_tree(part.pos[:n], m, part.index[:n], opts)


def domain_bbox(dt):
    """Task ``gravity-bbox``: (lo, hi) of a domain's particles, or None when empty."""
    if dt.tree is None or dt.tree.n_particles == 0:
        return None
    return host(dt.tree.lo[0]).astype(np.float64), host(dt.tree.hi[0]).astype(np.float64)


def domain_let(dt, bbox, opts):
    """Task ``gravity-let``: the part of a source tree a target box needs (or None); the
    contract :data:`~cosmo_dask.gravity.dispatch.domain_let` (cut on the GPU for a GPU
    tree)."""
    if bbox is None:
        return None
    return kernels.domain_let(dt, bbox[0], bbox[1], opts)


def batches_per_domain(n_particles: int, n_domains: int) -> int:
    """``gravity-group`` tasks per domain: about ``GROUP_BATCH_PARTICLES`` particles
    each for domains of equal size (the domain sizes are known only at run time), at
    most :data:`MAX_GROUP_TASKS` in all (at least one per domain)."""
    per = math.ceil(n_particles / (n_domains * GROUP_BATCH_PARTICLES))
    return max(1, min(per, MAX_GROUP_TASKS // max(1, n_domains)))


def domain_forces(dt, opts, batch, *lets):
    """Task ``gravity-group``: batch ``batch = (b, n_batches)`` of a domain's groups
    against the domain's tree and the LETs, by the contract
    :data:`~cosmo_dask.gravity.dispatch.domain_forces` (a GPU tree, one batch per domain,
    is evaluated on the GPU).

    Returns ``(index, acc (n, 3) float64, pot (n,) float64)`` of the batch's
    particles, in increasing (global) index.
    """
    return kernels.domain_forces(dt, lets, batch, opts)


def whole_forces(n_chunks: int, scalar, opts, potential: bool, *blocks):
    """Task ``gravity-group`` on a GPU worker with one domain: the tree on all the
    particles at once (the contract :data:`~cosmo_dask.gravity.dispatch.tree_forces`, the
    GPU tree for CuPy chunks). ``blocks`` are the position chunks, then (without
    ``scalar``) the mass chunks. The GPU tree sorts the particles itself and returns the
    input order, so there is no domain scatter: one concatenation in, slices out
    (:func:`chunk_slice`)."""
    xp = array_module(blocks[0])
    pos = blocks[0] if n_chunks == 1 else xp.concatenate(blocks[:n_chunks])
    m = scalar
    if scalar is None:
        masses = [xp.asarray(b) for b in blocks[n_chunks:]]  # on the positions' device
        m = masses[0] if len(masses) == 1 else xp.concatenate(masses)
    return kernels.tree_forces(pos, m, G=opts["G"], theta=opts["theta"],
                              softening=opts["softening"],
                              softening_kernel=opts["softening_kernel"],
                              precision=opts["precision"], potential=potential,
                              max_leaf=opts["max_leaf"], max_group=opts["max_group"],
                              box_size=opts["box_size"], rs=opts["rs"], r_cut=opts["r_cut"])


def chunk_slice(which: int, start: int, stop: int, dtype, result):
    """Task ``gravity-acc``/``gravity-pot`` after :func:`whole_forces`: rows
    ``[start, stop)`` of its accelerations (``which = 1``) or potentials (2)."""
    return result[which - 1][start:stop].astype(dtype, copy=False)


def _whole_gpu(pos, mass, scalar, opts, precision: str, potential: bool):
    """The graph of one GPU domain: a ``gravity-group`` task on every chunk
    (:func:`whole_forces`) and one slice per output chunk."""
    token = tokenize(pos, mass if scalar is None else scalar, opts, potential)[:12]
    g = TaskGraph([pos] if scalar is not None else [pos, mass])
    blocks = [g.chunk(pos, c, 0) for c in range(len(pos.chunks[0]))]
    masses = [] if scalar is not None else [g.chunk(mass, c) for c in range(len(mass.chunks[0]))]
    result = g.add(f"gravity-group-{token}-0", whole_forces, len(blocks), scalar, opts,
                   bool(potential), *blocks, *masses)
    return _output_arrays(g, pos, token, precision, potential, chunk_slice,
                          lambda c: (result,))


def _output_arrays(g: TaskGraph, pos, token: str, precision: str, potential: bool, task,
                   args_of):
    """``(acc, pot)`` dask arrays in ``pos``'s row chunks: task ``gravity-acc``/``-pot``
    ``c`` is ``task(which, start, stop, dtype, *args_of(c))`` for chunk ``c``'s rows."""
    dtype = np.dtype(precision)
    starts = np.cumsum((0,) + pos.chunks[0])
    xp = array_module(pos._meta)
    out = []
    for which, name, tail in ((1, "gravity-acc", (3,)), (2, "gravity-pot", ())):
        if which == 2 and not potential:
            out.append(None)
            continue
        arr_name = f"{name}-{token}"
        for c in range(len(pos.chunks[0])):
            g.add((arr_name, c) + (0,) * len(tail), task, which, int(starts[c]),
                  int(starts[c + 1]), dtype, *args_of(c))
        chunks = (pos.chunks[0],) + tuple((t,) for t in tail)
        out.append(g.array(arr_name, chunks, xp.empty((0,) * (1 + len(tail)), dtype), dtype))
    return out[0], out[1]


def domain_rows(bounds, *batches) -> list:
    """Task ``gravity-rows``: a domain's ``gravity-group`` results ``(index, acc, pot)``
    in increasing index, cut by input chunk (:func:`rows_by_chunk`)."""
    if len(batches) == 1:
        index, acc, pot = batches[0]
    else:
        index, acc, pot = (np.concatenate([b[k] for b in batches]) for k in range(3))
        order = np.argsort(index, kind="stable")
        index, acc, pot = index[order], acc[order], pot[order]
    return rows_by_chunk(bounds, index, acc, pot)


def default_n_domains(n_particles: int, gpu: bool) -> int:
    """One domain per ``DOMAIN_PARTICLES`` particles on CPU, at most :data:`MAX_DOMAINS`;
    on GPUs one domain per worker of the active client (one without a client)."""
    if gpu:
        return worker_count()
    return max(1, min(math.ceil(n_particles / DOMAIN_PARTICLES), MAX_DOMAINS))


def let_sources(grid, r_cut: float | None) -> list[list[int]]:
    """For every domain ``d``, the domains ``s != d`` whose LETs it needs: all of them,
    or with a cutoff in a periodic box those whose cells come within ``r_cut`` of
    ``d``'s (a domain's particles lie in its cell; farther trees contribute nothing)."""
    n = grid.n_domains
    if r_cut is None or grid.box_size is None:
        return [[s for s in range(n) if s != d] for d in range(n)]
    shape = np.asarray(grid.shape)
    cells = np.stack(np.unravel_index(np.arange(n), grid.shape), axis=1)
    out = []
    for d in range(n):
        steps = np.abs(cells - cells[d])
        steps = np.minimum(steps, shape - steps)  # periodic cell distance per axis
        gap = np.maximum(steps - 1, 0) * grid.width  # smallest separation per axis
        near = np.sqrt((gap**2).sum(axis=1)) <= float(r_cut) * (1 + 1e-6)
        out.append([s for s in np.flatnonzero(near).tolist() if s != d])
    return out


#: cut LETs for blocks of target domains from well-separated sources (:func:`let_plan`);
#: False: one LET per (source, target) pair (the same results, bit for bit)
LET_BLOCKS = True


def _block_gap(cells, d: int, level: int, shape, periodic: bool):
    """Per source domain: the largest per-axis gap, in domains, between its cell and the
    level-``level`` block (``2^level`` domains a side) holding domain ``d``'s cell."""
    lo = (cells[d] >> level) << level
    hi = np.minimum(lo + (1 << level) - 1, np.asarray(shape) - 1)
    if periodic:  # the shorter way round the ring
        size = np.asarray(shape)
        gap = np.minimum((lo - cells) % size, (cells - hi) % size)
        gap = np.where((cells >= lo) & (cells <= hi), 0, gap)
    else:
        gap = np.maximum(0, np.maximum(lo - cells, cells - hi))
    return gap.max(axis=1)


def let_plan(grid, r_cut: float | None) -> list[list[tuple[int, int]]]:
    """For every target domain ``d``, the LETs it reads as ``(source, level)`` pairs.

    Level 0: a LET cut for ``d``'s own box (task ``gravity-let``). Level ``l >= 1``: a LET
    cut for the box of ``d``'s level-``l`` block (the domains whose grid cells agree with
    ``d``'s in all but the last ``l`` bits of each coordinate: ``2^l`` domains a side),
    shared by every domain of the block that reads it (task ``gravity-blocklet``). A
    source gets the coarsest level whose block it is separated from by at least one
    whole domain (so that its LET for the block is not much larger than for ``d``), else
    level 0. A source next to ``d`` always sends ``d`` its own LET; at level 1 (blocks
    of 2 a side) a source may touch the block (its LET then resolves the face the
    block's nearest members need anyway, shared instead of repeated). Any level gives
    the same forces bit for bit: a LET cut for a box holds every
    node a walk from inside the box opens or accepts, and the walk never goes further.
    With a cutoff (TreePM) the sources are :func:`let_sources` (the domains within
    ``r_cut``): those in ``d``'s own level-1 block at level 0, the others at level 1 (a
    LET cut for the neighbouring block's box holds the source's nodes within ``r_cut`` of
    that box, about what its nearest member needs): at 512 domains, 14 LET tasks per
    source instead of 26.
    """
    n = grid.n_domains
    if not LET_BLOCKS or n <= 8:
        return [[(s, 0) for s in sources] for sources in let_sources(grid, r_cut)]
    if r_cut is not None and grid.box_size is not None:
        block = block_index(grid, 1)
        return [[(s, 0 if block[s] == block[d] else 1) for s in sources]
                for d, sources in enumerate(let_sources(grid, r_cut))]
    if r_cut is not None:  # isolated with a cutoff: every pair (not used by TreePM)
        return [[(s, 0) for s in sources] for sources in let_sources(grid, r_cut)]
    shape = tuple(int(v) for v in grid.shape)
    cells = np.stack(np.unravel_index(np.arange(n), shape), axis=1)
    top = max(1, math.ceil(math.log2(max(shape))))
    periodic = grid.box_size is not None
    plan = []
    for d in range(n):
        level = np.zeros(n, dtype=np.int64)
        far = _block_gap(cells, d, 0, shape, periodic) >= 2  # not d's neighbour
        for lv in range(top, 0, -1):  # the coarsest level that qualifies
            gap = _block_gap(cells, d, lv, shape, periodic)
            level[(level == 0) & far & (gap >= (1 if lv == 1 else 2))] = lv
        plan.append([(s, int(level[s])) for s in range(n) if s != d])
    return plan


def block_index(grid, level: int) -> np.ndarray:
    """Per domain, the flat index of its level-``level`` block (:func:`let_plan`)."""
    cells = np.stack(np.unravel_index(np.arange(grid.n_domains), grid.shape)) >> level
    return np.ravel_multi_index(tuple(cells), tuple(-(-np.asarray(grid.shape) >> level)))


def block_bbox(*boxes):
    """Task ``gravity-blockbox``: the union of the member domains' boxes (None: all empty)."""
    boxes = [b for b in boxes if b is not None]
    if not boxes:
        return None
    return (np.min([b[0] for b in boxes], axis=0), np.max([b[1] for b in boxes], axis=0))


def tree_accelerations(pos, mass, *, G: float, theta: float = THETA_DEFAULT,  # noqa: N803
                       softening: float = 0.0, softening_kernel: str = "plummer",
                       precision: str = "float64", potential: bool = True,
                       box_size: float | None = None, rs: float | None = None,
                       r_cut: float | None = None, max_leaf: int = MAX_LEAF_DEFAULT,
                       max_group: int = MAX_GROUP_DEFAULT,
                       n_domains: int | None = None, placed: bool = False) -> tuple[Any, Any]:
    """Tree accelerations (and potentials) of every particle, as dask arrays.

    Parameters
    ----------
    pos : dask array (N, 3)
        Positions (length), NumPy or CuPy chunks.
    mass : dask array (N,) or float
        Masses, or the mass of every particle.
    G, theta, softening, softening_kernel, precision, potential, max_leaf, max_group
        As for :func:`cosmo_dask.gravity.accelerations` (checked there).
    box_size : float, optional
        Periodic box: minimum-image separations (short range with ``rs``).
    rs, r_cut : float, optional
        The truncated short-range kernel of TreePM (length); ``r_cut`` defaults
        to ``4.5 rs``.
    n_domains : int, optional
        Domains of the decomposition (default :func:`default_n_domains`). The
        results depend on it only through the tree shapes (at the level of the
        force error), never on the chunking or the workers.
    placed : bool
        ``pos`` is kept by domain (:meth:`~cosmo_dask.spatial.layout.DomainLayout.by_domain`
        of this grid: chunk ``d`` on worker ``d mod W``). Under a client, each domain's
        tasks (tree, box, the LETs cut from it, its force batches, rows and their pieces
        by chunk) then run on that worker and are persisted there as the call returns
        (dask arrays would drop the placement), so that only LETs and the particles
        that crossed a face move. Without a client it changes nothing.

    Returns
    -------
    acc : dask array (N, 3), pot : dask array (N,) or None
        In the input order and row chunks, dtype ``precision``, NumPy or CuPy
        chunks like ``pos``.
    """
    gpu = array_module(pos._meta) is not np
    n = int(pos.shape[0])
    if rs is not None and r_cut is None:
        r_cut = default_r_cut(float(rs))
    opts = {"G": float(G), "theta": float(theta), "softening": float(softening),
            "softening_kernel": softening_kernel, "precision": precision,
            "box_size": None if box_size is None else float(box_size),
            "rs": None if rs is None else float(rs),
            "r_cut": None if r_cut is None else float(r_cut),
            "max_leaf": int(max_leaf), "max_group": int(max_group)}
    nd = default_n_domains(n, gpu) if n_domains is None else int(n_domains)
    scalar = None if hasattr(mass, "chunks") else float(mass)
    if gpu and nd == 1:
        return _whole_gpu(pos, mass, scalar, opts, precision, potential)
    if box_size is not None:
        grid = domain_grid(nd, box_size=float(box_size))
    else:
        # the bounding box: one task per chunk (per-axis min and max), one host read
        (table,) = compute(chunk_ranges(pos[:, 0], pos[:, 1], pos[:, 2]), label=None,
                           show=False)
        lo, hi = zip(*value_ranges(table), strict=True)
        grid = domain_grid(nd, bounds=(np.array(lo), np.array(hi)))
    extra = {} if scalar is not None else {"mass": mass}
    token = tokenize(pos, mass if scalar is None else scalar, opts, grid)[:12]
    layout = decompose(pos, grid, name="gravity")
    parts = layout.exchange(**extra)
    g = TaskGraph(parts)
    results = []
    n_batches = 1 if gpu else batches_per_domain(n, grid.n_domains)
    bounds = layout.bounds
    workers = worker_addresses() if placed else []

    def on(d: int):
        return domain_worker(workers, d)

    trees = [g.add((f"gravity-tree-{token}", d), domain_tree, g.ref(p), scalar, opts,
                   worker=on(d)) for d, p in enumerate(parts)]
    boxes = [g.add((f"gravity-bbox-{token}", d), domain_bbox, t, worker=on(d))
             for d, t in enumerate(trees)]
    plan = let_plan(grid, opts["r_cut"])
    blocks: dict = {}  # (level, block) -> its box task, and its LETs by source
    index_of: dict = {}  # level -> block index per domain

    def block_let(s: int, d: int, level: int):
        if level not in index_of:
            index_of[level] = block_index(grid, level)
        b = int(index_of[level][d])
        if (level, b) not in blocks:
            members = np.flatnonzero(index_of[level] == b).tolist()
            box = g.add((f"gravity-blockbox-{token}", level, b), block_bbox,
                        *[boxes[e] for e in members])
            blocks[(level, b)] = (box, {})
        box, lets = blocks[(level, b)]
        if s not in lets:
            lets[s] = g.add((f"gravity-blocklet-{token}", s, level, b), domain_let,
                            trees[s], box, opts, worker=on(s))
        return lets[s]

    for d, t in enumerate(trees):
        lets = [g.add((f"gravity-let-{token}", s, d), domain_let, trees[s], boxes[d], opts,
                      worker=on(s))
                if level == 0 else block_let(s, d, level) for s, level in plan[d]]
        batches = [g.add((f"gravity-group-{token}", d, b), domain_forces, t, opts,
                         (b, n_batches), *lets, worker=on(d)) for b in range(n_batches)]
        results.append(g.add((f"gravity-rows-{token}", d), domain_rows, bounds, *batches,
                             worker=on(d)))
    dtype, xp = np.dtype(precision), array_module(pos._meta)
    outputs = [("acc", (3,), xp.empty((0, 0), dtype))]
    if potential:
        outputs.append(("pot", (), xp.empty((0,), dtype)))
    # placed: the per-domain stage persisted as built (a dask array drops the placement)
    arrays = layout.gather(g, results, outputs, token=token, workers=workers)
    return arrays[0], (arrays[1] if potential else None)
