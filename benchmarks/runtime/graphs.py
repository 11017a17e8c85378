"""Graph sizes at 2048^3, built and inspected without running (issue 19 item 5).

A snapshot store of ``n_side^3`` particles is created with metadata only (no chunk
files: ``pos``/``vel`` (N, 3) float32, ``ids`` (N,) int64, the snapshot attributes)
and opened lazily (``open_snapshot(..., allow_missing_chunks=True)``). For each
capability the graph is built, never run, and inspected:

* ``tasks``: ``len(dict(graph))`` (materialised), plus the per-layer counts;
* ``build_s``: the time of the public call that builds the graph, ``materialise_s``
  the time of ``dict(graph)``;
* ``max_task_input_bytes``: the largest sum, over one task, of its dependencies'
  output sizes (array chunks: ``prod(chunk shape) * itemsize`` from the layers'
  collection annotations; a ``getitem`` of a multi-output task: its share of the
  parent; a few functions known to return small tables count 0; any other task:
  the sum of its inputs -- data-conserving, an estimate; a PM interpolation task returns
  its piece's rows and one float64 column per mesh slab it reads);
* ``scheduler_mem_bytes``: the peak-RSS growth of the (fresh) process while
  building and materialising the graph, and ``pickle_bytes`` of the graph.

Eager computes during graph building are intercepted, never run: cosmo_dask's
``compute``/``persist`` are replaced in every loaded module and a
``dask.callbacks.Callback`` stops any other local compute in ``_start`` (the graph
handed to the scheduler is counted, no task runs). The FOF public call persists its
domain graph and computes its catalog eagerly; the graph it would run is measured by
letting ``persist`` return its inputs unpersisted (the labels then carry the whole
graph). Graphs whose predicted size would not fit this machine's memory are not
built: their task counts come from the graph code's own formulas.

Meshes are sized for a simulated cluster (``--workers`` 16 of ``--worker-memory-gib``
64 and ``--worker-threads`` 16 each: the memory and thread queries of the graph code
are replaced), not for this VM, which could not hold a 2048^3 mesh. Rechunks choose
their method as under a distributed client (dask's P2P rechunk above its graph-size
threshold, task-based below), as on that cluster.

Every case runs in a fresh subprocess (clean memory peak). Usage::

    python -m benchmarks graphs                  # 2048^3 -> benchmarks/results/graphs.jsonl
    python -m benchmarks graphs --n-side 256 --out /tmp/g   # -> /tmp/g/graphs.jsonl
    python -m benchmarks graphs --cases treepm,pk --max-build-tasks 1  # PM part only
    python -m benchmarks graphs --cases fof --read-chunks 1048576
    python -m benchmarks graphs --cases treepm,treepm-acc  # with, without potential
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

#: ``treepm``/``pk`` ask for n_mesh = n_side; ``treepm-max``/``pk-max`` for the largest
#: n_mesh the code accepts (min(n_side, MAX_N_MESH = 4096): the same since the slab FFT)
CASES = ("fof", "tree", "treepm", "treepm-max", "pk", "pk-max", "ics1", "ics2")
#: not run by default: ``treepm-acc``, as ``treepm`` without the potential
#: (``potential=False``)
EXTRA_CASES = ("treepm-acc",)
MESH_CAP = 4096
#: DESIGN.md: "keep graphs under ~100k tasks"; the brief's per-task input bound
MAX_TASKS = 100_000
MAX_TASK_INPUT = 2 * 1024**3
#: graphs predicted above this many tasks are not built (memory of this 24 GiB VM)
MAX_BUILD_TASKS = 4_000_000
GIB = 1024**3
#: bytes per particle of a gravity-group result: index int64 + acc 3 float64 + pot float64
GROUP_RESULT_BYTES = 40
#: functions whose outputs are small tables (boundary links, counts, catalogs, boxes), or
#: nothing (``_done``: the tokens and barrier of ``spatial.slabs.after``)
SMALL_OUTPUT_FUNCS = {"_boundary", "_merge", "_count", "_catalog", "domain_bbox", "block_bbox",
                      "_done"}
#: functions whose output is the size of their largest input (sums of partial meshes)
SAME_SIZE_FUNCS = {"_add", "_squeeze"}
#: P2P rechunk: a transfer task hands its input to the worker's shuffle extension and
#: returns a run id, the barrier returns a run id, and an unpack task reads its output
#: chunk from the extension (its input is that chunk, not the barrier)
P2P_SENTINEL_FUNCS = {"rechunk_transfer", "p2p_barrier"}
P2P_UNPACK_FUNCS = {"rechunk_unpack"}
#: the PM interpolation of one piece at the slabs it reads: returns (rows int64, values
#: float64 (m, one column per slab read)) for the piece's m particles (counted from the
#: piece's estimate, which carries the float32 positions: 12 bytes a particle)
INTERP_FUNCS = {"_interp_piece"}
PIECE_BYTES_PER_PARTICLE = 12


class EagerCompute(Exception):
    """Raised instead of running a compute requested while a graph is built."""

    def __init__(self, label, tasks, graph=None):
        super().__init__(f"eager compute {label!r}: {tasks} tasks")
        self.label, self.tasks, self.graph = label, tasks, graph


# ----------------------------------------------------------------------------- store
def make_store(path: Path, n_side: int, chunk_rows: int | None = None) -> None:
    """A snapshot store of ``n_side^3`` particles: metadata only, no chunk files."""
    import zarr

    from cosmo_dask import __version__
    from cosmo_dask.core.backend import default_chunk_size
    from cosmo_dask.store.validation import FORMAT, FORMAT_VERSION

    n = n_side**3
    rows = min(chunk_rows or default_chunk_size(), n)
    box, a = 2048.0, 1.0 / 50.0
    omega_m, h = 0.3089, 0.6774
    attrs = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "box_size": box, "scale_factor": a, "redshift": 1.0 / a - 1.0,
        "cosmology": {"Omega_m": omega_m, "Omega_b": 0.0486, "Omega_L": 1 - omega_m,
                      "h": h, "sigma8": 0.8159, "n_s": 0.9667},
        "units": {"length": "Mpc/h", "velocity": "km/s", "mass": "1e10 Msun/h"},
        "particle_mass": omega_m * 27.7536627 * (box / n_side) ** 3,
        "lagrangian_shape": [n_side] * 3, "G": 43.00917,
        "n_particles": n, "created_by": f"cosmo_dask {__version__} (bench_graphs: no chunks)",
    }
    group = zarr.open_group(str(path), mode="w", zarr_format=3, attributes=attrs)
    for name, shape, dtype, dims in (("pos", (n, 3), "float32", ("particle", "component")),
                                     ("vel", (n, 3), "float32", ("particle", "component")),
                                     ("ids", (n,), "int64", ("particle",))):
        group.create_array(name, shape=shape, chunks=(rows,) + shape[1:], dtype=dtype,
                           compressors=None, fill_value=0, dimension_names=dims)


# ----------------------------------------------------------------------------- interception
class _AbortCallback:
    """A dask Callback stopping every local compute in ``_start`` (no task runs)."""

    def __new__(cls):
        from dask.callbacks import Callback

        class Abort(Callback):
            def _start(self, dsk):
                raise EagerCompute("dask compute (callback)", len(dsk))

            def _pretask(self, key, dsk, state):  # never reached: _start raises
                raise EagerCompute("dask task", 1)

        return Abort()


def _graph_of(collections):
    from dask.base import is_dask_collection
    from dask.highlevelgraph import HighLevelGraph

    graphs = [c.__dask_graph__() for c in collections if is_dask_collection(c)]
    if all(isinstance(g, HighLevelGraph) for g in graphs):
        return HighLevelGraph.merge(*graphs) if graphs else {}
    merged: dict = {}
    for g in graphs:
        merged.update(g)
    return merged


def patch_cosmo_compute(eager: list, fof_fake: bool = False, persisted: list | None = None,
                        n_chunks: int = 1):
    """Replace cosmo_dask.progress compute/persist in every loaded cosmo_dask module.

    Each call is recorded in ``eager`` (label, tasks of the graph it was given). By
    default it raises :class:`EagerCompute`; with ``fof_fake`` persist returns, for each
    input, a Delayed over a placeholder (what a persisted result looks like: a one-key
    graph) and keeps the graph it was given in ``persisted``, and compute returns an
    empty catalog (FOF's only compute) and, for each further value asked, every one of
    the ``n_chunks`` snapshot chunks (the chunks a domain holds rows of, worst case).
    Returns an undo function.
    """
    import numpy as np

    import cosmo_dask.core.progress as progress

    orig = {"compute": progress.compute, "persist": progress.persist}

    def record(kind, args, kwargs):
        t0 = time.perf_counter()
        graph = _graph_of(args)
        n = len(graph)  # materialises: these graphs are the eager ones
        label = kwargs.get("label")
        eager.append({"call": kind, "label": label, "tasks": n,
                      "intercept_s": round(time.perf_counter() - t0, 3)})
        return graph, label, n

    def compute(*args, **kwargs):
        graph, label, n = record("compute", args, kwargs)
        if fof_fake and label is None:
            # the catalog (no halos), then, where asked, the snapshot chunks each domain
            # holds rows of: all of them (the worst case: a snapshot in random order)
            empty = np.zeros(0, np.int64)
            return [(None, None, empty, empty)] + [np.arange(n_chunks)] * (len(args) - 1)
        raise EagerCompute(f"compute {label!r}", n, graph)

    def persist(*args, **kwargs):
        graph, label, n = record("persist", args, kwargs)
        if fof_fake:
            from dask.delayed import Delayed

            from cosmo_dask.core.task_graph import KeyCollection

            if persisted is not None:
                persisted.append((graph, [k for a in args for k in a.__dask_keys__()]))
            return tuple(KeyCollection({k: None for k in a.__dask_keys__()}, a.__dask_keys__())
                         if isinstance(a, KeyCollection) else
                         Delayed(a.key, {a.key: None}, length=getattr(a, "_length", None))
                         for a in args)
        raise EagerCompute(f"persist {label!r}", n, graph)

    repl = {"compute": compute, "persist": persist}
    undo = []
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("cosmo_dask"):
            continue
        for name, fn in orig.items():
            if getattr(mod, name, None) is fn:
                setattr(mod, name, repl[name])
                undo.append((mod, name, fn))

    def restore():
        for mod, name, fn in undo:
            setattr(mod, name, fn)

    return restore


# ----------------------------------------------------------------------------- inspection
def _deps(node, key, dsk):
    deps = getattr(node, "dependencies", None)
    if deps is not None:
        return deps
    from dask.core import get_dependencies

    return get_dependencies(dsk, key)


def _func_name(node) -> str | None:
    func = getattr(node, "func", None)
    if func is None and isinstance(node, tuple) and node and callable(node[0]):
        func = node[0]
    while hasattr(func, "func"):  # functools.partial
        func = func.func
    return getattr(func, "__name__", None) if func is not None else None


def _key_name(key) -> str:
    return key[0] if isinstance(key, tuple) else str(key)


def _kind(key) -> str:
    """Task kind: the key name without its token (``fof-local-<tok>-3`` -> fof-local)."""
    name = _key_name(key)
    parts = name.split("-")
    out = []
    for p in parts:
        if len(p) >= 8 and all(c in "0123456789abcdef" for c in p):
            break
        out.append(p)
    return "-".join(out) or name


def chunk_sizes(hlg) -> dict:
    """``{layer name: (chunks, itemsize)}`` of the array layers (collection annotations)."""
    out = {}
    for name, layer in getattr(hlg, "layers", {}).items():
        ann = getattr(layer, "collection_annotations", None) or {}
        if "chunks" in ann and "dtype" in ann:
            out[name] = (ann["chunks"], int(getattr(ann["dtype"], "itemsize", 8)))
    return out


def input_bytes(dsk: dict, arrays: dict, kind_bytes: dict | None = None) -> dict:
    """Largest per-task input bytes (estimate; see the module docstring)."""
    out_size: dict = {}
    children_getitem: dict = {}
    for key, node in dsk.items():
        if _func_name(node) == "getitem":
            deps = list(_deps(node, key, dsk))
            if len(deps) == 1:
                children_getitem[deps[0]] = children_getitem.get(deps[0], 0) + 1

    def chunk_nbytes(key):
        if not isinstance(key, tuple) or key[0] not in arrays:
            return None
        chunks, itemsize = arrays[key[0]]
        idx = key[1:]
        if len(idx) != len(chunks):
            return None
        n = itemsize
        for c, i in zip(chunks, idx, strict=True):
            n *= c[i] if isinstance(i, int) and i < len(c) else 0
        return n

    sys.setrecursionlimit(100000)
    order = _toposort(dsk)
    best = (0, None)
    by_kind: dict = {}
    for key in order:
        node = dsk[key]
        deps = [d for d in _deps(node, key, dsk) if d in dsk]
        inp = sum(out_size.get(d, 0) for d in deps)
        fname = _func_name(node)
        size = chunk_nbytes(key)
        if fname in P2P_UNPACK_FUNCS:
            inp = size or 0
        if size is None and kind_bytes and _kind(key) in kind_bytes:
            size = kind_bytes[_kind(key)]
        if size is None and fname in INTERP_FUNCS:
            slabs = [d for d in deps if chunk_nbytes(d) is not None]
            piece = sum(out_size.get(d, 0) for d in deps if chunk_nbytes(d) is None)
            size = piece // PIECE_BYTES_PER_PARTICLE * 8 * (1 + len(slabs))
        if size is None:
            if fname in SMALL_OUTPUT_FUNCS or fname in P2P_SENTINEL_FUNCS:
                size = 0
            elif fname in SAME_SIZE_FUNCS:
                size = max((out_size.get(d, 0) for d in deps), default=0)
            elif fname == "getitem" and len(deps) == 1 and children_getitem.get(deps[0]):
                size = out_size.get(deps[0], 0) // children_getitem[deps[0]]
            else:
                size = inp
        out_size[key] = size
        k = _kind(key)
        by_kind[k] = max(by_kind.get(k, 0), inp)
        if inp > best[0]:
            best = (inp, key)
    top = sorted(by_kind.items(), key=lambda kv: -kv[1])[:4]
    return {"max_task_input_bytes": int(best[0]),
            "max_task_input_key": None if best[1] is None else _kind(best[1]),
            "max_input_by_kind": {k: int(v) for k, v in top}}


def _toposort(dsk: dict) -> list:
    """Keys in dependency order (iterative DFS; large graphs)."""
    seen, order = set(), []
    for root in dsk:
        if root in seen:
            continue
        stack = [(root, False)]
        while stack:
            key, done = stack.pop()
            if done:
                order.append(key)
                continue
            if key in seen:
                continue
            seen.add(key)
            stack.append((key, True))
            for d in _deps(dsk[key], key, dsk):
                if d in dsk and d not in seen:
                    stack.append((d, False))
    return order


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def inspect(collections, rss0: int, hlg=None, known=(),
            kind_bytes=None) -> dict:
    """Task counts, layers, input bytes and memory of the graph of ``collections``."""
    t0 = time.perf_counter()
    if hlg is None:
        hlg = _graph_of(collections)
    layers = getattr(hlg, "layers", None)
    layer_counts = {}
    if layers is not None:
        for name, layer in layers.items():
            k = _kind(name)
            layer_counts[k] = layer_counts.get(k, 0) + len(layer)
    dsk = dict(hlg)
    mat_s = time.perf_counter() - t0
    row = {"tasks": len(dsk), "materialise_s": round(mat_s, 3),
           "layers": len(layers) if layers is not None else None,
           "tasks_by_kind": dict(sorted(layer_counts.items(), key=lambda kv: -kv[1])[:40])}
    row["scheduler_mem_bytes"] = max(0, max(_maxrss(), _rss()) - rss0)
    t1 = time.perf_counter()
    arrays = chunk_sizes(hlg)
    for a in known:  # input arrays whose layers lost their annotations (to_delayed)
        arrays.update(chunk_sizes(a.__dask_graph__()))
    row.update(input_bytes(dsk, arrays, kind_bytes))
    row["input_estimate_s"] = round(time.perf_counter() - t1, 3)
    if len(dsk) <= 2_000_000:
        t2 = time.perf_counter()
        try:
            row["pickle_bytes"] = len(pickle.dumps(dsk, protocol=5))
        except Exception:  # noqa: BLE001 (local functions: cloudpickle, as distributed does)
            import cloudpickle

            row["pickle_bytes"] = len(cloudpickle.dumps(dsk, protocol=5))
        row["pickle_s"] = round(time.perf_counter() - t2, 3)
    return row


# ----------------------------------------------------------------------------- cases
def _open(store):
    from cosmo_dask import open_snapshot

    return open_snapshot(store, allow_missing_chunks=True)


def _exchange_keys(n_chunks: int, n_dom: int) -> tuple[int, int]:
    """(split keys, way-back keys) of the domain exchanges (spatial.domains' formulas)."""
    from cosmo_dask.spatial.domains import TWO_STAGE_PAIRS, _groups

    if n_chunks * n_dom <= TWO_STAGE_PAIRS:
        return n_chunks + n_chunks * n_dom, n_chunks * n_dom
    cg, dg = len(_groups(n_chunks)), len(_groups(n_dom))
    return (n_chunks + n_chunks * dg + cg * dg + cg * n_dom,
            n_dom + n_dom * cg + dg * cg + dg * n_chunks)


def tree_prediction(n: int, n_chunks: int, box_size: float | None = None,
                    r_cut: float | None = None) -> dict:
    """Task counts of tree_accelerations' graph from its own formulas (CPU, defaults)."""
    from cosmo_dask.gravity.tree.graph import batches_per_domain, default_n_domains

    nd = default_n_domains(n, False)
    nb = batches_per_domain(n, nd)
    try:
        from cosmo_dask.gravity.tree.graph import let_sources
    except ImportError:  # the graph before 2026-11-25's changes: all pairs, one stage
        by_kind = {"gravity-split": n_chunks, "getitem (split pieces)": n_chunks * nd,
                   "gravity-domain": nd, "gravity-tree": nd, "gravity-bbox": nd,
                   "gravity-let": nd * (nd - 1), "gravity-group": nd * nb,
                   "gravity-acc": n_chunks, "gravity-pot": n_chunks}
        return {"n_domains": nd, "batches_per_domain": nb, "by_kind": by_kind,
                "tasks": sum(by_kind.values()),
                # chunk_rows (gravity-acc/pot) took every gravity-group result
                "max_task_input_bytes": GROUP_RESULT_BYTES * n,
                "max_task_input_key": "gravity-acc",
                "note": "+ the snapshot read/check tasks; each gravity-acc/pot task depends "
                        f"on all {nd * nb} gravity-group results"}
    from cosmo_dask.spatial.domains import domain_grid

    grid = domain_grid(nd, box_size=box_size) if box_size else domain_grid(
        nd, bounds=((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    try:  # LETs for blocks of targets (2026-11-26): one task per (source, level, block)
        from cosmo_dask.gravity.tree.graph import block_index, let_plan

        plan = let_plan(grid, r_cut if box_size else None)
        index = {lv: block_index(grid, lv) for lv in {lv for p in plan for _, lv in p}}
        lets = len({(s, lv, int(index[lv][d]) if lv else d)
                    for d, p in enumerate(plan) for s, lv in p})
    except ImportError:
        lets = sum(len(s) for s in let_sources(grid, r_cut if box_size else None))
    split, back = _exchange_keys(n_chunks, nd)
    by_kind = {"gravity-split (+ regroup, pieces)": split, "gravity-domain": nd,
               "gravity-tree": nd, "gravity-bbox": nd, "gravity-let": lets,
               "gravity-group": nd * nb, "gravity-rows": nd,
               "gravity-piece (way back)": back, "gravity-acc": n_chunks,
               "gravity-pot": n_chunks}
    return {"n_domains": nd, "batches_per_domain": nb, "by_kind": by_kind,
            "tasks": sum(by_kind.values()),
            "note": "+ the snapshot read/check tasks"}


#: bytes per particle of a domain tree (float64 positions, masses, index, order, keys)
TREE_BYTES = 56


def tree_kind_bytes(n: int) -> dict:
    """Output bytes of the tree graph's tasks whose outputs are not their inputs' sum: a
    ``gravity-group`` (its batch's index, acc, pot), a ``gravity-tree`` (the domain's
    octree, ~TREE_BYTES a particle, nodes not counted) and a ``gravity-let`` or
    ``gravity-blocklet`` (not estimated: counted 0, so a group task's input is its
    domain tree only)."""
    from cosmo_dask.gravity.tree.graph import batches_per_domain, default_n_domains

    nd = default_n_domains(n, False)
    return {"gravity-group": GROUP_RESULT_BYTES * -(-n // (nd * batches_per_domain(n, nd))),
            "gravity-tree": TREE_BYTES * -(-n // nd), "gravity-let": 0, "gravity-blocklet": 0}


def simulate_cluster(workers: int, memory: int, threads: int) -> None:
    """Make the graph code size meshes for ``workers`` workers of ``memory`` bytes and
    ``threads`` threads each (the cluster a 2048^3 run would use), not for this VM: the
    memory/worker/thread queries are replaced in every loaded cosmo_dask module."""
    import importlib

    paint = importlib.import_module("cosmo_dask.density.painting")  # (density.paint: a function)
    importlib.import_module("cosmo_dask.spatial.fft")  # its namespace is patched below
    progress = importlib.import_module("cosmo_dask.core.progress")

    # dask's rechunk picks P2P for large rechunks when a distributed client exists (the
    # cluster this simulates): make that choice here, where no client runs
    import distributed

    rechunk_mod = importlib.import_module("dask.array.rechunk")  # (the attribute: a function)
    choose = rechunk_mod._choose_rechunk_method

    def as_on_a_cluster(old_chunks, new_chunks, threshold=None):
        real = distributed.default_client
        distributed.default_client = lambda: None
        try:
            return choose(old_chunks, new_chunks, threshold=threshold)
        finally:
            distributed.default_client = real

    rechunk_mod._choose_rechunk_method = as_on_a_cluster
    repl = {paint.memory_per_worker: lambda gpu: (int(memory), "worker"),
            paint.worker_count: lambda: int(workers),
            progress.worker_threads: lambda: int(workers * threads)}
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("cosmo_dask"):
            continue
        for name, value in list(vars(mod).items()):
            if callable(value) and not isinstance(value, type):
                try:
                    new = repl.get(value)
                except TypeError:  # unhashable
                    continue
                if new is not None:
                    setattr(mod, name, new)


def run_case(case: str, store: str, n_side: int, max_build: int,
             read_chunks: int | None = None, workers: int = 16,
             worker_memory: int = 64 * 1024**3, worker_threads_each: int = 16) -> dict:
    import dask

    import cosmo_dask
    import cosmo_dask.analysis  # noqa: F401 (load modules before patching their names)
    import cosmo_dask.gravity  # noqa: F401
    import cosmo_dask.halos  # noqa: F401
    import cosmo_dask.halos.fof_graph  # noqa: F401
    import cosmo_dask.models  # noqa: F401

    dask.config.set(scheduler="sync")
    simulate_cluster(workers, worker_memory, worker_threads_each)
    if read_chunks:  # dask chunks of the opened store (default: the store's own chunks)
        dask.config.set({"cosmo_dask.read_chunk_size": int(read_chunks)})
    snap = None if case.startswith("ics") else _open(store)
    n = n_side**3
    row: dict = {"graph": case, "n_side": n_side, "n_particles": n,
                 "read_chunk_size": read_chunks,
                 "simulated_cluster": {"workers": workers, "memory_per_worker": worker_memory,
                                       "threads_per_worker": worker_threads_each}}
    if snap is not None:
        row["n_chunks"] = len(snap.pos.chunks[0])
        row["chunk_rows"] = int(snap.pos.chunks[0][0])
    eager: list = []
    rss0 = max(_maxrss(), _rss())

    persisted: list = []

    def attempt(fn, fof_fake=False):
        """(result, build_s, error) of fn() with every compute intercepted."""
        undo = patch_cosmo_compute(eager, fof_fake=fof_fake, persisted=persisted,
                                   n_chunks=row.get("n_chunks", 1))
        t0 = time.perf_counter()
        try:
            with _AbortCallback():
                res = fn()
            return res, time.perf_counter() - t0, None
        except EagerCompute as exc:
            if exc.label == "dask compute (callback)":
                eager.append({"call": "dask compute", "label": None, "tasks": exc.tasks})
            return exc, time.perf_counter() - t0, None
        except Exception as exc:  # noqa: BLE001 (recorded as the row's result)
            return None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
        finally:
            undo()

    colls, hlg, kind_bytes = None, None, None
    known = []
    if snap is not None:
        known = [a for a in (snap.pos, snap.vel, snap.ids) if a is not None]
        known += list((snap._unchecked or {}).values())
    if case == "fof":
        row["call"] = "halos.fof_labels(snap, 0.2) [persist/compute intercepted, not run]"
        res, dt, err = attempt(lambda: cosmo_dask.halos.fof_labels(snap, 0.2), fof_fake=True)
        if err is None and persisted:
            # stage 1: the domain graph fof_labels persists (run eagerly by the call);
            # stage 2: the lazy labels graph over the persisted per-domain results
            graph, args = persisted[0]
            row.update(inspect([], rss0, hlg=graph, known=known))
            labels = inspect([res.labels], max(_maxrss(), _rss()), known=known)
            # the persisted values the labels graph reads (placeholders, not tasks)
            dsk_labels = dict(res.labels.__dask_graph__())
            labels["placeholders"] = sum(1 for k in args if k in dsk_labels
                                         and dsk_labels[k] is None)
            row["labels_stage"] = labels
            row["tasks_domain_stage"] = row["tasks"]
            row["tasks"] += labels["tasks"] - labels["placeholders"]
            if labels["max_task_input_bytes"] > row["max_task_input_bytes"]:
                row["max_task_input_bytes"] = labels["max_task_input_bytes"]
                row["max_task_input_key"] = labels["max_task_input_key"]
        elif err is None:
            colls = [res.labels]
    elif case == "tree":
        row["call"] = 'gravity.accelerations(snap, method="tree")'
        res, dt, err = attempt(lambda: cosmo_dask.gravity.accelerations(snap, method="tree"))
        if isinstance(res, EagerCompute):
            row["call"] += ' -> check=False'
            pred = tree_prediction(n, len(snap.pos.chunks[0]))
            row["predicted"] = pred
            if pred["tasks"] > max_build:
                row["not_built"] = (f"predicted {pred['tasks']:,} tasks > {max_build:,}: "
                                    "not materialised on this VM; counts are the graph code's")
                row["tasks"] = pred["tasks"]
                row["max_task_input_bytes"] = pred.get("max_task_input_bytes")
                row["max_task_input_key"] = pred.get("max_task_input_key")
                res, dt, err = None, 0.0, None
            else:
                res, dt, err = attempt(lambda: cosmo_dask.gravity.accelerations(
                    snap, method="tree", check=False))
        if isinstance(res, tuple):
            colls = [x for x in res if x is not None]
            kind_bytes = tree_kind_bytes(n)
    elif case.startswith("treepm"):
        nm = min(n_side, MESH_CAP) if case == "treepm-max" else n_side
        pot = case != "treepm-acc"
        from cosmo_dask.gravity.parameters import R_SPLIT_CELLS, default_r_cut

        pred = tree_prediction(n, len(snap.pos.chunks[0]), float(snap.box_size),
                               default_r_cut(R_SPLIT_CELLS * float(snap.box_size) / nm))
        if pred["tasks"] > max_build:
            # the short-range tree graph alone is too large to build here (tree_prediction);
            # only the long-range PM graph, as treepm_accelerations builds it, is built
            import numpy as np

            from cosmo_dask.gravity.pm import checked_particles, long_range

            box = float(snap.box_size)
            row["call"] = (f'gravity.accelerations(snap, method="treepm", n_mesh={nm}): '
                           "PM part only (gravity.pm.long_range, float32, interlaced)")
            row["predicted_tree_part"] = pred
            row["not_built"] = (f"short-range tree part: predicted {pred['tasks']:,} tasks > "
                                f"{max_build:,}; tasks/within_limits below are the PM part")

            def pm_part():
                pos, m, _ = checked_particles(snap.pos, snap.particle_mass, box, "treepm")
                return (long_range(pos, m, G=float(snap.G), box_size=box, n_mesh=nm,
                                   r_split=R_SPLIT_CELLS * box / nm, dtype=np.dtype("float32"),
                                   potential=pot, interlace=True),)
            res, dt, err = attempt(pm_part)
            if isinstance(res, tuple):
                colls = list(res)
            nm = None
    if case.startswith("treepm") and nm is not None:
        row["call"] = (f'gravity.accelerations(snap, method="treepm", n_mesh={nm}'
                       + (")" if pot else ", potential=False)"))
        res, dt, err = attempt(lambda: cosmo_dask.gravity.accelerations(
            snap, method="treepm", n_mesh=nm, potential=pot))
        if isinstance(res, EagerCompute) and err is None:
            row["call"] += " -> check=False"
            res, dt, err = attempt(lambda: cosmo_dask.gravity.accelerations(
                snap, method="treepm", n_mesh=nm, check=False, potential=pot))
        if isinstance(res, tuple):
            colls = [x for x in res if x is not None]
            kind_bytes = tree_kind_bytes(n)
    elif case.startswith("pk"):
        nm = n_side if case == "pk" else min(n_side, MESH_CAP)
        row["call"] = f"analysis.power_spectrum(snap, n_mesh={nm}) [compute intercepted]"
        res, dt, err = attempt(lambda: cosmo_dask.analysis.power_spectrum(snap, n_mesh=nm))
        if isinstance(res, EagerCompute) and res.graph is not None:
            hlg, colls = res.graph, []
    elif case.startswith("ics"):
        order = int(case[-1])
        row["call"] = (f"models.lpt_ics({n_side}, box_size=2048.0, redshift=49, "
                       f"order={order})")
        res, dt, err = attempt(lambda: cosmo_dask.models.lpt_ics(
            n_side, box_size=2048.0, redshift=49, order=order))
        if err is None and not isinstance(res, EagerCompute):
            colls = [x for x in (res.pos, res.vel, res.ids) if x is not None]
            # the whole Lagrangian mesh, one task: 3 (order 1) or 6 (order 2) columns
            item = res.pos.dtype.itemsize
            kind_bytes = {"lpt-mesh": 3 * order * n * item,  # lpt-particles: (pos, vel)
                          "lpt-particles": 6 * max(res.pos.chunks[0]) * item}
    row["eager_computes"] = eager
    if err is not None:
        row["error"] = err
    # build time net of the interception's own graph merge + len (recorded per call)
    row["build_s"] = round(max(0.0, dt - sum(e.get("intercept_s", 0) for e in eager)), 3)
    if colls is not None:
        row.update(inspect(colls, rss0, hlg=hlg, known=known, kind_bytes=kind_bytes))
    if "tasks" in row:
        mx = row.get("max_task_input_bytes")
        row["within_limits"] = bool(row["tasks"] <= MAX_TASKS
                                    and (mx is None or mx <= MAX_TASK_INPUT))
    return row


# ----------------------------------------------------------------------------- driver
def main(argv=None) -> list[dict]:
    p = parser(__doc__, devices=("cpu",))
    p.add_argument("--n-side", type=int, default=2048)
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated, of {', '.join(CASES + EXTRA_CASES)}")
    p.add_argument("--max-build-tasks", type=int, default=MAX_BUILD_TASKS)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    p.add_argument("--read-chunks", type=int, default=None,
                   help="particles per dask chunk when opening the store (default: its own "
                        "chunks, cosmo_dask.chunk_size = 2^20)")
    p.add_argument("--workers", type=int, default=16,
                   help="workers of the simulated cluster the meshes are sized for")
    p.add_argument("--worker-memory-gib", type=float, default=64.0)
    p.add_argument("--worker-threads", type=int, default=16)
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, this process
    p.add_argument("--store", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    start(args, "graphs")

    if args.case:
        row = run_case(args.case, args.store, args.n_side, args.max_build_tasks,
                       args.read_chunks, args.workers, int(args.worker_memory_gib * 1024**3),
                       args.worker_threads)
        print("ROW " + json.dumps(row, default=str), flush=True)
        return [row]

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_graphs_") as tmp:
        store = Path(tmp) / f"snap{args.n_side}.zarr"
        make_store(store, args.n_side)
        env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
        for case in [c for c in args.cases.split(",") if c]:
            cmd = [sys.executable, __file__, "--case", case, "--store", str(store),
                   "--n-side", str(args.n_side), "--max-build-tasks",
                   str(args.max_build_tasks)]
            if args.read_chunks:
                cmd += ["--read-chunks", str(args.read_chunks)]
            cmd += ["--workers", str(args.workers), "--worker-memory-gib",
                    str(args.worker_memory_gib), "--worker-threads", str(args.worker_threads)]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.timeout, env=env)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
                if lines:
                    row = json.loads(lines[-1][4:])
                else:
                    row = {"graph": case, "n_side": args.n_side,
                           "error": f"case process failed (rc {proc.returncode}): "
                                    f"{proc.stderr.strip()[-800:]}"}
            except subprocess.TimeoutExpired:
                row = {"graph": case, "n_side": args.n_side,
                       "error": f"timeout after {args.timeout:.0f} s building the graph"}
            row["wall_s"] = round(time.perf_counter() - t0, 2)
            row["host"] = platform.node()
            emit(row)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
