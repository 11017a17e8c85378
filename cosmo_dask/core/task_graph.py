"""Hand-built Dask graphs: the one module of cosmo_dask that touches dask's graph internals.

Chunk-wise work is ``map_blocks`` / ``blockwise`` / ``map_overlap`` on dask arrays.
Everything else (tasks over chosen chunks of several inputs, tasks returning several
values, tasks pinned to a worker, reductions in a fixed order) is a :class:`TaskGraph`:
tasks added one by one, each with its key, its function and its arguments, where
:meth:`TaskGraph.chunk`, :meth:`TaskGraph.ref` and :meth:`TaskGraph.item` stand for
the values of other tasks. The graph then becomes dask arrays (:meth:`~TaskGraph.array`,
:meth:`~TaskGraph.item_arrays`, :meth:`~TaskGraph.persist_array`), ``Delayed`` values
(:meth:`~TaskGraph.delayed`, :meth:`~TaskGraph.persist`) or results
(:meth:`~TaskGraph.compute`). No other module builds ``HighLevelGraph`` layers, task
specs or ``dask.delayed`` calls (``tests/system/test_structure.py`` checks it).

Keys are chosen by the caller: ``<kind>-<token>`` (a string, or the first element of a
tuple key), where the token hashes every input of the task, so that the dashboard
groups tasks by kind and a reused cluster never hands one call another's result.

Why not ``dask.delayed``: each call costs a tokenisation and a graph merge (about
0.2 ms, a few hundred ms for a PSE deposit), and its placement annotations are lost on
the way to an array. Here the tasks are written straight into one
:class:`~dask.highlevelgraph.HighLevelGraph`: tasks without placement share one layer
per kind (the first element of a tuple key, or the key), and each placed task (given
``worker`` or ``priority``) has its own layer carrying its annotations, as under
``dask.annotate``. Graph building stays linear and cheap at a million tasks: a task's
dependencies are checked with set operations per layer, a list argument
(:meth:`~TaskGraph.list`) once for every task that reads it, the item tasks of
:meth:`~TaskGraph.add_items` are dask's plain task tuples, and a layer is copied only
when tasks join it after a graph holding it was made.

Usage::

    g = TaskGraph([pos, columns[3]])            # dask arrays and Delayed values
    g.add(("pse-leaf-x", 0, 0), func, g.chunk(pos, 0, 0), g.ref(columns[3]), worker=w)
    arr = g.persist_array("pse-leaf-x", chunks, meta)  # run; chunk (name, i, j, ..)

The placement must reach the scheduler: dask arrays drop layer annotations, and many
``Delayed`` objects over one large graph are slow to submit, so :meth:`persist_array`
submits the tasks as one small collection (:class:`KeyCollection`) that keeps the
layers as built, and makes the array from the persisted results.
"""

from __future__ import annotations

import itertools
import operator
import sys
from collections.abc import Hashable, Sequence
from typing import Any

import dask.array as da
import dask.threaded
from dask._task_spec import List, Task, TaskRef
from dask.base import DaskMethodsMixin
from dask.core import flatten
from dask.delayed import Delayed, single_key
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.sizeof import sizeof

from . import progress

__all__ = ["KeyCollection", "TaskGraph", "task_payload"]


class KeyCollection(DaskMethodsMixin):
    """The smallest dask collection: a graph and the keys wanted from it.

    Computes to the list of the keys' values, or with ``one=True`` (one key) to its
    value, with no finalising task. The graph goes to the scheduler as built (no
    optimisation pass, so every layer keeps its annotations); the schedulers run only
    the tasks the keys need.
    """

    def __init__(self, graph, keys, layers=(), one: bool = False):
        self._graph, self._keys, self._layers = graph, list(keys), tuple(layers)
        self._one = one

    def __dask_graph__(self):
        return self._graph

    def __dask_keys__(self):
        return list(self._keys)

    def __dask_layers__(self):
        return self._layers

    def __dask_tokenize__(self):
        return tuple(self._keys)

    __dask_optimize__ = staticmethod(lambda dsk, keys, **kwargs: dsk)

    __dask_scheduler__ = staticmethod(dask.threaded.get)

    def __dask_postcompute__(self):
        return (single_key, ()) if self._one else (list, ())

    def __dask_postpersist__(self):
        return KeyCollection._rebuild, (self._keys,)

    @staticmethod
    def _rebuild(dsk, keys, rename=None):
        return KeyCollection(dsk, keys)


def _key_name(key) -> str:
    return key if isinstance(key, str) else "-".join(str(k) for k in key)


class TaskGraph:
    """A graph under construction: inputs (dask arrays, Delayed values) plus tasks.

    Parameters
    ----------
    inputs : sequence of dask arrays or Delayed objects
        The collections whose chunks or values the tasks read (usually persisted).
        An array's graph enters as it is when the result is an array (dask's array
        optimisation then runs over the whole graph, as for any array); when the
        result is run or handed out as values (:meth:`compute`, :meth:`persist`,
        :meth:`delayed`), it enters optimised once, as
        :meth:`dask.array.Array.to_delayed` does (blockwise steps and linear chains
        fused), so its reads, slices and casts run as in the array's own compute.
    """

    def __init__(self, inputs: Sequence[Any] = ()):
        self._inputs: dict[str, Any] = {}  # layer name -> Layer of an input's tasks
        self._tops: set[str] = set()  # the inputs' top layers
        self._arrays: dict[str, da.Array] = {}  # top layer -> array input
        self._tasks: dict[str, dict] = {}  # layer name -> {key: Task} added here
        self._annotations: dict[str, dict] = {}
        self.deps: dict[str, set] = {}
        # the layer of each input key and placed task; an unplaced task's layer is its kind
        self._layer_of: dict[Hashable, str] = {}
        self._lists: dict[int, tuple[List, set[str]]] = {}  # id -> (list, its layers)
        self._handed_out: set[str] = set()  # layers of added tasks shared with a graph made
        self._graphs: dict[bool, HighLevelGraph] = {}
        for value in inputs:
            self.add_input(value)

    def add_input(self, value) -> None:
        """Add an input (a dask array or Delayed value) after construction, e.g. arrays
        made from this graph's own tasks (their layers already here are kept as added)."""
        graph = value.__dask_graph__()
        (top,) = value.__dask_layers__()
        if not isinstance(graph, HighLevelGraph):  # a persisted value: a plain dict
            graph = HighLevelGraph({top: MaterializedLayer(graph)}, {top: set()})
        for name, layer in graph.layers.items():
            if name not in self._inputs and name not in self._tasks:
                self._inputs[name] = layer
                self.deps[name] = set(graph.dependencies.get(name, ()))
        self._graphs.clear()
        if top in self._tasks:  # made from this graph's own tasks: nothing more to read
            return
        self._tops.add(top)
        if isinstance(value, da.Array):
            self._arrays[top] = value
            for key in flatten(value.__dask_keys__()):
                self._layer_of[key] = top
        else:
            self._layer_of[value.key] = top

    def _layer(self, key) -> str:
        """The layer of an input key or added task (KeyError if neither)."""
        tasks = self._tasks.get(key[0] if isinstance(key, tuple) else key)
        if tasks is not None and key in tasks:
            return key[0] if isinstance(key, tuple) else key
        return self._layer_of[key]

    def _layers_read(self, key, deps) -> set[str]:
        """The layers of the keys ``deps`` task ``key`` reads (ValueError: a key is no
        input key and no added task). Set operations, one per layer: a task may read
        thousands of keys."""
        layers: set[str] = set()
        if not deps:
            return layers
        # the usual cases first: every key a task of one layer (checked by one set
        # operation), or every key a chunk of one input array
        d = next(iter(deps))
        name = d[0] if d.__class__ is tuple else d
        tasks = self._tasks.get(name)
        if tasks is not None and tasks.keys() >= deps:
            layers.add(name)
            return layers
        if name in self._arrays and all(self._layer_of.get(k) == name for k in deps):
            layers.add(name)
            return layers
        rest = set(deps)
        while rest:
            d = next(iter(rest))
            try:
                name = self._layer(d)
            except KeyError:
                raise ValueError(f"TaskGraph: task {key!r} reads {d!r}, which is neither a "
                                 "key of an input nor an added task") from None
            layers.add(name)
            tasks = self._tasks.get(name)
            if tasks is not None:
                rest -= tasks.keys() & rest
            else:
                rest -= {k for k in rest if self._layer_of.get(k) == name}
        return layers

    def _layer_tasks(self, name: str) -> dict:
        """The task dict of layer ``name`` (new, or copied if a made graph holds it)."""
        tasks = self._tasks.get(name)
        if tasks is None:
            tasks = self._tasks[name] = {}
            self.deps[name] = set()
        elif name in self._handed_out:
            tasks = self._tasks[name] = dict(tasks)
            self._handed_out.discard(name)
        return tasks

    # ------------------------------------------------------------------ task arguments
    @staticmethod
    def ref(value) -> TaskRef:
        """A task argument standing for an input (Delayed) or an added key."""
        return TaskRef(value.key if isinstance(value, Delayed) else value)

    @staticmethod
    def refs(keys) -> list[TaskRef]:
        """Task arguments standing for added keys or input keys, one per key (the bulk
        form of :meth:`ref` for keys)."""
        return list(map(TaskRef, keys))

    @staticmethod
    def chunk(array: da.Array, *index: int) -> TaskRef:
        """A task argument standing for chunk ``index`` of an input array."""
        return TaskRef((array.name, *index))

    @staticmethod
    def item(value, index) -> Task:
        """A task argument standing for ``value[index]``, taken inside the task that reads
        it (the whole ``value`` moves to that task; :meth:`add_split` moves one item)."""
        return Task(None, operator.getitem, value, index)

    def list(self, values: Sequence[Any]) -> List:
        """A task argument standing for the list of ``values`` (references or plain
        values), e.g. every piece a task reads. It may be passed to several tasks: the
        layers it reads are found once."""
        arg = List(*values)
        self._lists[id(arg)] = (arg, self._layers_read("a list", arg.dependencies))
        return arg

    # ------------------------------------------------------------------ adding tasks
    def add(self, key, func, *args, worker: str | None = None,
            priority: int | None = None) -> TaskRef:
        """Add task ``key = func(*args)``; :meth:`ref`, :meth:`chunk` and :meth:`item`
        arguments are its dependencies.

        ``worker``: preferred worker (loosely: ``allow_other_workers``);
        ``priority``: the distributed scheduler's priority (higher runs first).
        Returns a reference to the new key.
        """
        task = Task(key, func, *args)
        deps, layers = task.dependencies, set()
        for a in args:  # lists made by self.list: their layers are known
            known = self._lists.get(id(a))
            if known is not None and known[0] is a:
                layers |= known[1]
                deps = deps - a.dependencies
        layers |= self._layers_read(key, deps)
        if worker is None and priority is None:
            name = key[0] if isinstance(key, tuple) else key
            if name in self._annotations or name in self._inputs:
                raise ValueError(f"TaskGraph: {key!r} would join the layer of a placed task "
                                 "or an input")
        else:
            name = _key_name(key)
            if name in self._tasks or name in self._inputs:
                raise ValueError(f"TaskGraph: the placed task {key!r} needs a layer of its "
                                 f"own, but {name!r} exists")
            annotations = {} if priority is None else {"priority": int(priority)}
            if worker is not None:
                annotations.update(workers=[worker], allow_other_workers=True)
            self._annotations[name] = annotations
            self._layer_of[key] = name
        tasks = self._layer_tasks(name)
        tasks[key] = task
        layers.discard(name)
        self.deps[name] |= layers
        self._graphs.clear()
        return TaskRef(key)

    def add_split(self, key, func, *args, n: int, worker: str | None = None,
                  priority: int | None = None) -> list[TaskRef]:
        """Add task ``key = func(*args)`` returning ``n`` values, and one task per value.

        The value tasks, keyed ``(key, k)`` (``(*key, k)`` for a tuple key), let a
        reader fetch one value, not the whole result (:meth:`add_items`). Returns their
        references.
        """
        self.add(key, func, *args, worker=worker, priority=priority)
        base = key if isinstance(key, tuple) else (key,)
        self.add_items(key, n, base[0])
        return [TaskRef((*base, k)) for k in range(n)]

    def add_items(self, key, n: int, name: str) -> None:
        """Add one task per value of the ``n``-valued task ``key``: ``(name, *key[1:], k)
        = value_of(key)[k]`` (``(name, k)`` for a string key), so that a reader fetches
        one value, not the whole result; ``name`` is their kind and layer.

        Built in bulk (a P(k) mesh at 2048^3 particles has a million): each is dask's
        plain task tuple ``(getitem, key, k)``, which costs a fifth of a task spec to
        build and which dask converts when the graph is submitted, as for any graph.
        """
        source = self._layer(key)  # KeyError: not a task of this graph
        if name in self._annotations or name in self._inputs:
            raise ValueError(f"TaskGraph: items {name!r} would join the layer of a placed "
                             "task or an input")
        tasks = self._layer_tasks(name)
        rest = key[1:] if isinstance(key, tuple) else ()
        getitem = operator.getitem
        for k in range(n):
            tasks[(name, *rest, k)] = (getitem, key, k)
        if source != name:
            self.deps[name].add(source)
        self._graphs.clear()

    # ------------------------------------------------------------------ results
    def graph(self, optimized_inputs: bool = False) -> HighLevelGraph:
        """The whole graph (the inputs' and the added tasks), one layer per kind or
        per placed task; with ``optimized_inputs`` each array input is one layer
        ``input-<name>`` of its optimised tasks."""
        if optimized_inputs not in self._graphs:
            layers = dict(self._inputs)
            deps = {k: set(v) for k, v in self.deps.items()}
            for name, tasks in self._tasks.items():  # copied when added to later
                layers[name] = MaterializedLayer(tasks, annotations=self._annotations.get(name))
                self._handed_out.add(name)
            graph = HighLevelGraph(layers, deps)
            if optimized_inputs and self._arrays:
                rename = {top: f"input-{top}" for top in self._arrays}
                for top, arr in self._arrays.items():
                    keys = arr.__dask_keys__()
                    optimized = arr.__dask_optimize__(arr.__dask_graph__(), keys)
                    layers[rename[top]] = MaterializedLayer(dict(optimized))
                    deps[rename[top]] = set()
                deps = {k: {rename.get(d, d) for d in v} for k, v in deps.items()}
                roots = set(self._tasks) | {rename.get(t, t) for t in self._tops}
                graph = HighLevelGraph(layers, deps).cull_layers(roots)
            self._graphs[optimized_inputs] = graph
        return self._graphs[optimized_inputs]

    @staticmethod
    def _chunk_keys(name, chunks):
        return [(name, *idx) for idx in itertools.product(*(range(len(c)) for c in chunks))]

    def array(self, name: str, chunks, meta, dtype=None) -> da.Array:
        """The lazy dask array over tasks ``(name, i, j, ...)`` (``dtype``: ``meta``'s).

        Placement annotations are dropped on this path (see the module
        docstring): use it for graphs that need none, else :meth:`persist_array`.
        """
        keys = self._chunk_keys(name, chunks)
        merged = {self._layer(k) for k in keys}
        graph = self.graph()
        if merged != {name}:  # dask's array code expects one layer named like the array
            layers = {k: v for k, v in graph.layers.items() if k not in merged}
            deps = {k: set(v) for k, v in graph.dependencies.items() if k not in merged}
            tasks: dict = {}
            for layer in merged:
                tasks.update(graph.layers[layer])
            layers[name] = MaterializedLayer(tasks)
            deps[name] = set().union(*(self.deps[layer] for layer in merged)) - merged
            graph = HighLevelGraph(layers, deps)
        return da.Array(graph, name, chunks, meta=meta,
                        dtype=meta.dtype if dtype is None else dtype)

    def item_arrays(self, sources: Sequence[Any], rows: Sequence[int],
                    outputs: Sequence[tuple[str, Any, tuple[int, ...], Any]]) -> list[da.Array]:
        """One dask array per output of multi-valued tasks, one task per row chunk.

        Parameters
        ----------
        sources : sequence of keys
            The task of each row chunk; its value is a tuple, list or dict.
        rows : sequence of int
            The rows of each chunk (the arrays' chunks along axis 0).
        outputs : sequence of (name, index, trailing shape, meta)
            Array ``name``'s chunk ``i`` is ``value_of(sources[i])[index]``, of shape
            ``(rows[i], *trailing)`` and ``meta``'s type and dtype.
        """
        arrays = []
        for name, index, trailing, meta in outputs:
            tail = (0,) * len(trailing)
            for i, source in enumerate(sources):
                self.add((name, i, *tail), operator.getitem, TaskRef(source), index)
            chunks = (tuple(rows),) + tuple((t,) for t in trailing)
            arrays.append(self.array(name, chunks, meta))
        return arrays

    def persist_array(self, name: str, chunks, meta, dtype=None, *,
                      label: str | None = None) -> da.Array:
        """Run the tasks ``(name, i, j, ...)`` (with their placement) and return their
        results as a dask array with ``chunks`` (in worker memory under a client)."""
        (done,) = progress.persist(self.collection(self._chunk_keys(name, chunks)), label=label)
        return da.Array(dict(done.__dask_graph__()), name, chunks, meta=meta,
                        dtype=meta.dtype if dtype is None else dtype)

    def _run_layer(self, key) -> str:
        """The layer of ``key`` in ``graph(optimized_inputs=True)``."""
        layer = self._layer(key)
        return f"input-{layer}" if layer in self._arrays else layer

    def collection(self, keys: Sequence[Any]) -> KeyCollection:
        """The keys as one collection (computing it gives the list of their values)."""
        return KeyCollection(self.graph(optimized_inputs=True), keys,
                             dict.fromkeys(self._run_layer(k) for k in keys))

    def compute(self, keys: Sequence[Any], *, label: str | None = None,
                show: bool | None = None, scheduler: str | None = None) -> list:
        """The values of ``keys`` (a list), computed with :func:`cosmo_dask.core.progress.compute`
        (only the tasks they need run; each value comes straight from its task)."""
        graph = self.graph(optimized_inputs=True)
        one = [KeyCollection(graph, [k], [self._run_layer(k)], one=True) for k in keys]
        return list(progress.compute(*one, label=label, show=show, scheduler=scheduler))

    def persist(self, keys: Sequence[Any], *, label: str | None = None) -> list[Delayed]:
        """Run the tasks ``keys`` (with their placement); one Delayed per key over its
        persisted value (a future under a distributed client)."""
        (done,) = progress.persist(self.collection(keys), label=label)
        dsk = done.__dask_graph__()
        # a tuple key's Delayed gets a string layer name (TaskGraph inputs, HighLevelGraph)
        return [Delayed(k, {k: dsk[k]}, layer=_key_name(k)) for k in keys]

    def delayed(self, key) -> Delayed:
        """One added key as a Delayed (lazy; the graph is shared between calls)."""
        return Delayed(key, self.graph(optimized_inputs=True), layer=self._run_layer(key))


def _fields_sizeof(obj) -> int:
    return sys.getsizeof(obj) + sum(sizeof(v) for v in vars(obj).values())


def task_payload(cls):
    """Class decorator for the objects tasks hand each other (domain parts, octrees,
    domain trees, LETs: dataclasses of NumPy or CuPy arrays).

    - dask's ``sizeof`` of an instance counts its fields' bytes. Without it an
      instance reads as ~56 bytes, so the scheduler sees no cost in moving a
      gigabyte tree to run a task beside a small input, and memory limits miss it.
    - distributed serializes an instance field by field (``register_generic``, the
      ``dask`` and ``cuda`` families), so CuPy arrays travel as device buffers over
      UCX, or as one host copy each over TCP, instead of through pickle.
    """
    sizeof.register(cls)(_fields_sizeof)
    try:
        from distributed.protocol import dask_deserialize, dask_serialize, register_generic
        from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    except ImportError:  # pragma: no cover - distributed is a dependency
        return cls
    for family, ser, de in (("dask", dask_serialize, dask_deserialize),
                            ("cuda", cuda_serialize, cuda_deserialize)):
        register_generic(cls, family, ser, de)
    return cls
