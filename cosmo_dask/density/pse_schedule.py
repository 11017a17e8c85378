"""Dask graphs of the PSE deposit: ADECO's strategies A ("gather") and B ("reduce").

Both take the persisted block columns (:func:`~.tessellation.block_columns`)
and the octree layout (:func:`~.pse_octree.build_octree`), runs the graph,
and returns the ``(L, p, p, p)`` dask array of the leaves' density patches,
persisted (one chunk per leaf, computed by the task ``(pse-leaf-<token>, i,
0, 0, 0)``): mass over cell volume, float64, NumPy or CuPy like the snapshot.
The graphs are written task by task (:class:`~cosmo_dask.core.task_graph.TaskGraph`),
each task with its placement, which reaches the distributed scheduler.

gather (A)
    One ``pse-leaf`` task per leaf. It depends on every column that holds a
    block overlapping the leaf, builds those blocks' tetrahedra, and deposits
    them onto the patch. Under a distributed client the task is pinned (loosely:
    ``allow_other_workers``) to the worker that holds most of the blocks it
    needs; dask moves the other columns to it. Leaves are prioritised largest
    estimated work first.
reduce (B)
    Columns are grouped by the worker that holds them (without a client: by
    contiguous runs, one group per thread of the local scheduler). Each group
    deposits only its own blocks: one ``pse-partial`` task per (group, leaf),
    pinned to the group's worker, writing a partial mass patch. The partial
    patches of a leaf are summed by a ``pse-reduce`` tree (``split_every``).
    The bound on partial patches held per worker is ``max_partials``: a
    group's n-th partial task also depends on a tiny ``pse-done`` token of the
    leaf its (n - max_partials)-th partial fed, so it cannot start before that
    leaf is fully reduced. This is ADECO's buffer of finished leaves, expressed
    as graph edges. The tokens are None values, and each ``pse-done`` runs where
    its leaf's result lies, so they move no data. The edges point from earlier to
    later leaves of one global order, so they cannot form a cycle.

``auto`` picks the strategy whose estimated transfer is smaller (see
:func:`choose_strategy`).
"""

from __future__ import annotations

import numpy as np

from ..core.backend import array_module
from ..core.task_graph import TaskGraph
from .dispatch import deposit_tets_kernel, rows_tets_kernel

#: tetrahedra gathered before one deposit call (bounds a task's temporary memory)
DEPOSIT_BATCH = 1 << 20


# --------------------------------------------------------------------------- task bodies
def _deposit_items(patch, leaf_lo, h, geom, packed, columns):
    """Deposit the pieces ``packed`` (rows of :func:`_pack`) onto ``patch`` (mass).

    Tetrahedra are built in batches of about ``DEPOSIT_BATCH`` by
    ``rows_tets_kernel`` (on the GPU one launch builds a whole batch from several
    columns), then one ``deposit_tets_kernel`` call; both are chosen by the
    columns' array type, and nothing waits for the GPU.
    """
    block, ncz, box, pm = geom
    p = patch.shape[0]
    rows_per_batch = max(1, DEPOSIT_BATCH // (6 * block**3))
    for a in range(0, len(packed), rows_per_batch):
        tets, mass = rows_tets_kernel(columns, packed[a:a + rows_per_batch], block, ncz, box, pm)
        deposit_tets_kernel(tets, mass, leaf_lo, h, (p, p, p), out=patch)
    return patch


def pse_leaf(leaf_lo, h, p, geom, packed, *columns):
    """Gather task: the density patch (1, p, p, p) of one leaf from all its blocks."""
    patch = array_module(columns[0][0]).zeros((p, p, p))
    _deposit_items(patch, leaf_lo, h, geom, packed, columns)
    return (patch / h**3)[None]


def pse_partial(leaf_lo, h, p, geom, packed, _token, *columns):
    """Reduce strategy, step 1: one group's partial mass patch of one leaf."""
    patch = array_module(columns[0][0]).zeros((p, p, p))
    return _deposit_items(patch, leaf_lo, h, geom, packed, columns)


def pse_reduce(*parts):
    """Reduce strategy, step 2: the sum of partial mass patches."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def pse_density_patch(h, mass):
    """Mass patch -> density chunk (1, p, p, p)."""
    return (mass / h**3)[None]


def pse_done(_result):
    """Token: the leaf is finished (depends on it, returns nothing)."""
    return None


def pse_empty(p, gpu):
    """The density chunk of a leaf no block overlaps. No column is at hand to take the
    array type from: ``gpu`` says where the result lives (no kernel is chosen)."""
    return array_module(_patch_meta(gpu)).zeros((1, p, p, p))


# --------------------------------------------------------------------------- graph helpers
def leaf_items(layout, cols):
    """Per leaf, its pieces grouped by column (:func:`_leaf_items`); computed once per run."""
    return [_leaf_items(layout, cols, i) for i in range(len(layout.level))]


def _leaf_items(layout, cols, i):
    """Pieces of leaf ``i`` grouped by column: ``{column: (bks, image shifts)}``."""
    a, b = layout.leaf_ptr[i], layout.leaf_ptr[i + 1]
    blk = layout.piece_block[a:b]
    shift = layout.piece_shift[a:b]
    col = cols.column_of_block[blk]
    bk = cols.blocks.index[blk, 2]
    order = np.argsort(col, kind="stable")
    col, bk, shift = col[order], bk[order], shift[order]
    if not len(col):
        return {}
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    ends = list(starts[1:]) + [len(col)]
    return {int(col[s]): (bk[s:e], shift[s:e]) for s, e in zip(starts, ends, strict=True)}


def _pack(items):
    """``{column: (bks, shifts)}`` -> one int64 array of rows (slot, bk, sx, sy, sz).

    ``slot`` numbers the columns in ``items`` order (the task's column
    arguments); rows are grouped by slot. One array per task argument keeps
    graph construction cheap (dask walks lists and tuples of arguments, not
    arrays)."""
    if not items:
        return np.zeros((0, 5), np.int64)
    bks = [np.asarray(b, np.int64).reshape(-1) for b, _ in items.values()]
    shifts = [np.asarray(s).reshape(-1, 3) for _, s in items.values()]
    slot = np.repeat(np.arange(len(bks)), [len(b) for b in bks])
    return np.column_stack([slot, np.concatenate(bks),
                            np.concatenate(shifts).astype(np.int64)])


def leaf_geometry(layout, p):
    """``(leaf_lo (L, 3), cell size (L,))`` of the leaves."""
    side = layout.root_size / 2.0 ** layout.level
    return layout.root_lo + layout.origin * side[:, None], side / p


def _geom(cols):
    b = cols.blocks
    return (b.block, b.cells_shape[2], cols.box_size, cols.particle_mass)


def _work_order(layout):
    """Leaves by decreasing estimated work, and a dask priority per leaf."""
    order = np.argsort(-layout.est_tets, kind="stable")
    priority = np.empty(len(order), np.int64)
    priority[order] = np.arange(len(order))[::-1]
    return order, priority


def _bytes_of_column(cols):
    b = cols.blocks
    nz = b.cells_shape[2] + 1
    return (b.block + 1) ** 2 * nz * 3 * 8


def _transfer_estimate(cols, items_per_leaf, p, workers):
    """Estimated bytes moved by each strategy: ``{"gather": g, "reduce": r}``.

    gather: each worker fetches once every column its leaves need and does not
    hold (dask keeps a fetched copy for later tasks); reduce: every leaf moves
    (groups touching it - 1) partial patches to its reduction.
    """
    colb = _bytes_of_column(cols)
    fetched = set()
    reduce = 0.0
    for items in items_per_leaf:
        if not items:
            continue
        owners = [workers[c] if workers is not None else 0 for c in items]
        names, counts = np.unique(owners, return_counts=True)
        chosen = names[np.argmax(counts)]
        fetched.update((chosen, c) for c, w in zip(items, owners, strict=True) if w != chosen)
        reduce += (len(counts) - 1) * p**3 * 8
    return {"gather": float(len(fetched) * colb), "reduce": reduce}


def choose_strategy(cols, items_per_leaf, p, workers) -> tuple[str, dict]:
    """The ``strategy="auto"`` rule: fewer estimated bytes moved wins; ties go to gather.

    See :func:`_transfer_estimate` for the two estimates. On one
    worker, or without a client, both estimates are 0, and gather is taken
    (no partial patches, no reduction). ADECO measured A ahead of B at scale.
    """
    est = _transfer_estimate(cols, items_per_leaf, p, workers)
    return ("reduce" if est["reduce"] < est["gather"] else "gather"), est


def _leaf_worker(items, workers):
    """The worker holding most of a leaf's columns (None without a client)."""
    if workers is None:
        return None
    owners, counts = np.unique([workers[c] for c in items], return_counts=True)
    return str(owners[np.argmax(counts)])


def _patch_meta(gpu):
    if gpu:
        import cupy

        return cupy.empty((0, 0, 0, 0))
    return np.empty((0, 0, 0, 0))


def _patches(graph, name, n_leaves, p, gpu, label):
    """Run the graph: the (L, p, p, p) patches, chunk i from task ``(name, i, 0, 0, 0)``."""
    return graph.persist_array(name, ((1,) * n_leaves, (p,), (p,), (p,)), _patch_meta(gpu),
                               np.float64, label=label)


# --------------------------------------------------------------------------- strategies
def gather_graph(cols, layout, items_per_leaf, p, workers, token, *, gpu=False):
    """Strategy A (one task per leaf), run: the (L, p, p, p) density patches (persisted)."""
    lo, h = leaf_geometry(layout, p)
    geom = _geom(cols)
    _, priority = _work_order(layout)
    g = TaskGraph(cols.values)
    name = f"pse-leaf-{token}"
    for i, items in enumerate(items_per_leaf):
        key = (name, i, 0, 0, 0)
        if not items:
            g.add(key, pse_empty, p, bool(gpu))
            continue
        g.add(key, pse_leaf, lo[i], float(h[i]), p, geom, _pack(items),
              *[g.ref(cols.values[c]) for c in items],
              worker=_leaf_worker(items, workers), priority=priority[i])
    return _patches(g, name, len(items_per_leaf), p, gpu,
                    f"PSE deposit (gather, {len(items_per_leaf)} leaves)")


def column_groups(cols, workers, n_groups):
    """Group index of each column: its worker's, or contiguous runs of ``n_groups``."""
    nc = len(cols.values)
    if workers is not None:
        names = sorted(set(workers))
        return np.array([names.index(w) for w in workers], np.int64), names
    n_groups = max(1, min(int(n_groups), nc))
    return (np.arange(nc) * n_groups) // nc, [None] * n_groups


def reduce_graph(cols, layout, items_per_leaf, p, workers, token, *, n_groups, max_partials,
                 split_every, gpu=False):
    """Strategy B (partials + sums), run: the (L, p, p, p) density patches (persisted)."""
    lo, h = leaf_geometry(layout, p)
    geom = _geom(cols)
    order, priority = _work_order(layout)
    group, names = column_groups(cols, workers, n_groups)
    sequence = {g: [] for g in range(len(names))}
    per_leaf = {}
    for i in order:  # issue work largest first, in one global order
        by_group = {}
        for c, it in items_per_leaf[i].items():
            by_group.setdefault(int(group[c]), {})[c] = it
        per_leaf[i] = by_group
        for grp in by_group:
            sequence[grp].append(i)
    position = {(grp, i): n for grp, seq in sequence.items() for n, i in enumerate(seq)}
    g = TaskGraph(cols.values)
    name = f"pse-leaf-{token}"
    done = {}

    def done_token(leaf):  # added once, the first time a later partial waits for it
        if leaf not in done:
            done[leaf] = g.add(f"pse-done-{token}-{leaf}", pse_done,
                               g.ref((name, leaf, 0, 0, 0)))
        return done[leaf]

    for i in order:
        partials = []
        for grp, items in per_leaf[i].items():
            n = position[(grp, i)]
            gate = done_token(sequence[grp][n - max_partials]) if n >= max_partials else None
            partials.append(g.add(
                f"pse-partial-{token}-{i}-{grp}", pse_partial, lo[i], float(h[i]), p, geom,
                _pack(items), gate, *[g.ref(cols.values[c]) for c in items],
                worker=names[grp], priority=priority[i]))
        key = (name, i, 0, 0, 0)
        if not partials:
            g.add(key, pse_empty, p, bool(gpu))
            continue
        level = 0
        while len(partials) > 1:
            partials = [g.add(f"pse-reduce-{token}-{i}-{level}-{k}", pse_reduce,
                              *partials[k:k + split_every], priority=priority[i])
                        for k in range(0, len(partials), split_every)]
            level += 1
        g.add(key, pse_density_patch, float(h[i]), partials[0], priority=priority[i])
    return _patches(g, name, len(items_per_leaf), p, gpu,
                    f"PSE deposit (reduce, {len(items_per_leaf)} leaves)")
