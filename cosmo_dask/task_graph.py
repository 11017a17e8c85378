"""Hand-built Dask graphs: tasks added one by one, each with its own placement.

The graph code of a capability (the PSE strategies, the tree-gravity domains)
often needs thousands of tasks whose inputs are a few persisted pieces, each
task pinned to a worker and given a priority. Building them as
``dask.delayed`` calls costs a tokenisation and a graph merge per call (about
0.2 ms each, a few hundred ms for a PSE deposit); this builder writes the task
specs directly into one :class:`~dask.highlevelgraph.HighLevelGraph`, one
layer per task (so each task carries its own annotations, as under
``dask.annotate``).

Usage::

    g = TaskGraph(inputs)                       # Delayed objects, usually persisted
    g.add(("pse-leaf-x", 0, 0), func, a, g.ref(inputs[3]), worker=w, priority=5)
    arr = g.persist_array("pse-leaf-x", chunks, meta, dtype)  # run; chunk (name, i, j, ..)

The placement must reach the scheduler: dask arrays (expression-backed in
current dask) drop layer annotations, and many ``Delayed`` objects over one
large graph are slow to submit, so the tasks are submitted as one small
collection (:class:`KeyCollection`) that keeps the layers as built, and the
array is made from the persisted results.
"""

from __future__ import annotations

import itertools
from typing import Any

import dask.array as da
import dask.threaded
from dask._task_spec import Task, TaskRef
from dask.base import DaskMethodsMixin
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from .progress import persist


class KeyCollection(DaskMethodsMixin):
    """The smallest dask collection: a graph and the keys wanted from it (as a list)."""

    def __init__(self, graph, keys, layers=()):
        self._graph, self._keys, self._layers = graph, list(keys), tuple(layers)

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
        return list, ()

    def __dask_postpersist__(self):
        return KeyCollection._rebuild, (self._keys,)

    @staticmethod
    def _rebuild(dsk, keys, rename=None):
        return KeyCollection(dsk, keys)


class TaskGraph:
    """A graph under construction: persisted inputs plus tasks added with :meth:`add`."""

    def __init__(self, inputs=()):
        self.layers: dict[str, Any] = {}
        self.deps: dict[str, set] = {}
        self._layer_of: dict[Any, str] = {}
        for value in inputs:
            graph = value.__dask_graph__()
            (top,) = value.__dask_layers__()
            if not isinstance(graph, HighLevelGraph):  # a persisted value: a plain dict
                graph = HighLevelGraph({top: MaterializedLayer(graph)}, {top: set()})
            for name, layer in graph.layers.items():
                if name not in self.layers:
                    self.layers[name] = layer
                    self.deps[name] = set(graph.dependencies.get(name, ()))
            self._layer_of[value.key] = top

    @staticmethod
    def ref(value) -> TaskRef:
        """A task argument standing for an input (Delayed) or an added key."""
        return TaskRef(value.key if isinstance(value, Delayed) else value)

    def add(self, key, func, *args, worker: str | None = None,
            priority: int | None = None) -> TaskRef:
        """Add task ``key = func(*args)``; :meth:`ref` arguments are its dependencies.

        ``worker``: preferred worker (loosely: ``allow_other_workers``);
        ``priority``: the distributed scheduler's priority (higher runs first).
        Returns a reference to the new key.
        """
        annotations = {}
        if priority is not None:
            annotations["priority"] = int(priority)
        if worker is not None:
            annotations.update(workers=[worker], allow_other_workers=True)
        task = Task(key, func, *args)
        name = key if isinstance(key, str) else "-".join(str(k) for k in key)
        self.layers[name] = MaterializedLayer({key: task}, annotations=annotations or None)
        self.deps[name] = {self._layer_of[d] for d in task.dependencies}
        self._layer_of[key] = name
        return TaskRef(key)

    def graph(self) -> HighLevelGraph:
        return HighLevelGraph(dict(self.layers), {k: set(v) for k, v in self.deps.items()})

    def array(self, name: str, chunks, meta, dtype) -> da.Array:
        """The lazy dask array over tasks ``(name, i, j, ...)``.

        Placement annotations are dropped on this path (see the module
        docstring): use it for graphs that need none, else :meth:`persist_array`.
        """
        keys = self._chunk_keys(name, chunks)
        merged = {self._layer_of[k] for k in keys}
        layers = {k: v for k, v in self.layers.items() if k not in merged}
        deps = {k: set(v) for k, v in self.deps.items() if k not in merged}
        tasks: dict = {}
        for layer in merged:  # dask's array code expects one layer named like the array
            tasks.update(self.layers[layer])
        layers[name] = MaterializedLayer(tasks)
        deps[name] = set().union(*(self.deps[layer] for layer in merged)) - merged
        return da.Array(HighLevelGraph(layers, deps), name, chunks, meta=meta, dtype=dtype)

    @staticmethod
    def _chunk_keys(name, chunks):
        return [(name, *idx) for idx in itertools.product(*(range(len(c)) for c in chunks))]

    def persist_array(self, name: str, chunks, meta, dtype, *, label: str | None = None
                      ) -> da.Array:
        """Run the tasks ``(name, i, j, ...)`` (with their placement) and return their
        results as a dask array with ``chunks`` (in worker memory under a client)."""
        keys = self._chunk_keys(name, chunks)
        collection = KeyCollection(self.graph(), keys, [self._layer_of[k] for k in keys])
        (done,) = persist(collection, label=label)
        return da.Array(dict(done.__dask_graph__()), name, chunks, meta=meta, dtype=dtype)

    def delayed(self, key) -> Delayed:
        """One added key as a Delayed."""
        return Delayed(key, self.graph(), layer=self._layer_of[key])
