"""TaskGraph: hand-built tasks run with their dependencies, and their placement reaches
the distributed scheduler (dask arrays alone drop layer annotations)."""

from __future__ import annotations

import dask
import numpy as np

from cosmo_dask.core.task_graph import TaskGraph


def _inputs():
    return [dask.delayed(np.arange, pure=True)(3 * i, 3 * i + 3, dask_key_name=f"in-{i}")
            for i in range(4)]


def test_tasks_compute_from_their_inputs_locally():
    ins = _inputs()
    g = TaskGraph(ins)
    for i in range(4):
        g.add(("out", i), np.multiply, g.ref(ins[i]), 2.0)
    g.add("total", np.add, g.ref(("out", 0)), g.ref(("out", 3)))
    with dask.config.set(scheduler="synchronous"):
        arr = g.persist_array("out", ((3,) * 4,), np.empty(0), np.float64)
        np.testing.assert_array_equal(arr.compute(), 2.0 * np.arange(12))
        assert list(g.delayed("total").compute()) == [18.0, 22.0, 26.0]


def test_worker_placement_reaches_the_scheduler(client):
    workers = sorted(client.scheduler_info()["workers"])
    ins = _inputs()
    g = TaskGraph(ins)
    for i in range(8):
        g.add(("placed", i), np.add, g.ref(ins[i % 4]), float(i),
              worker=workers[i % 2], priority=i)
    arr = g.persist_array("placed", ((3,) * 8,), np.empty(0), np.float64)
    futures = list(arr.__dask_graph__().values())
    from distributed import wait

    wait(futures)
    where = client.who_has(futures)
    for i in range(8):
        assert workers[i % 2] in where[("placed", i)]
    np.testing.assert_array_equal(arr.compute()[:3], np.arange(3.0))


def test_chunks_of_arrays_split_tasks_and_item_arrays():
    """Array inputs by chunk, a multi-valued task split into values, and one array per
    output of tuple-valued tasks: the same numbers as NumPy on the whole array."""
    import dask.array as da

    rng = np.random.default_rng(1)
    x = rng.normal(size=(10, 3))
    arr = da.from_array(x, chunks=(4, 3)) * 2.0  # a graph with more than one layer
    g = TaskGraph([arr])
    # each chunk split by the sign of column 0; the two halves gathered over all chunks
    parts = [g.add_split(("split", i), lambda b: (b[b[:, 0] < 0], b[b[:, 0] >= 0]),
                         g.chunk(arr, i, 0), n=2) for i in range(arr.numblocks[0])]
    neg = g.add("neg", lambda *p: np.concatenate(p), *[p[0] for p in parts])
    pos = g.add("pos", lambda *p: np.concatenate(p), *[p[1] for p in parts])
    with dask.config.set(scheduler="synchronous"):
        got_neg, got_pos = g.compute([neg.key, pos.key])
        np.testing.assert_array_equal(got_neg, 2 * x[x[:, 0] < 0])
        np.testing.assert_array_equal(got_pos, 2 * x[x[:, 0] >= 0])
        # tuple-valued tasks (sum of rows, sum of squares per row) -> two arrays
        sources = [g.add(("pair", i), lambda b: (b.sum(axis=1), b * b), g.chunk(arr, i, 0)).key
                   for i in range(arr.numblocks[0])]
        sums, squares = g.item_arrays(sources, arr.chunks[0],
                                      [("sums", 0, (), np.empty(0)),
                                       ("squares", 1, (3,), np.empty((0, 3)))])
        assert sums.chunks == ((4, 4, 2),) and squares.chunks == ((4, 4, 2), (3,))
        np.testing.assert_allclose(sums.compute(), 2 * x.sum(axis=1), rtol=1e-15)
        np.testing.assert_array_equal(squares.compute(), 4 * x * x)
        # an item taken inside the reading task (the whole value moves to it)
        g.add(("total", 0), lambda a, b: np.atleast_1d(a.sum() + b.sum()),
              g.item(TaskGraph.ref(("pair", 0)), 0), g.item(TaskGraph.ref(("pair", 2)), 1))
        total = g.array("total", ((1,),), np.empty(0)).compute()
        np.testing.assert_allclose(total, [2 * x[:4].sum() + 4 * (x[8:] ** 2).sum()],
                                   rtol=1e-14)


def test_compute_runs_only_what_the_keys_need():
    import dask.array as da

    def boom():
        raise RuntimeError("a chunk nobody asked for was computed")

    good = da.from_array(np.arange(4.0), chunks=2)
    bad = da.from_delayed(dask.delayed(boom)(), shape=(2,), dtype=float)
    arr = da.concatenate([good, bad])
    g = TaskGraph([arr])
    keys = [g.add(("twice", i), np.multiply, g.chunk(arr, i), 2.0).key for i in range(3)]
    with dask.config.set(scheduler="synchronous"):
        (a, b) = g.compute(keys[:2])
        np.testing.assert_array_equal(np.concatenate([a, b]), [0.0, 2.0, 4.0, 6.0])
        (value,) = dask.compute(g.delayed(keys[1]))
        np.testing.assert_array_equal(value, [4.0, 6.0])
    # an array result keeps the input's layers (dask optimises the whole array later);
    # a run gets the input optimised once, as to_delayed does, and nothing else of it
    assert arr.name in g.graph().layers
    ran = g.graph(optimized_inputs=True)
    assert f"input-{arr.name}" in ran.layers and arr.name not in ran.layers
    assert set(ran.layers) == {f"input-{arr.name}", "twice"}


def test_persist_gives_one_delayed_per_key(client):
    ins = _inputs()
    g = TaskGraph(ins)
    keys = [g.add(f"cube-{i}", np.power, g.ref(ins[i]), 3).key for i in range(4)]
    values = g.persist(keys)
    from distributed import futures_of

    assert len(futures_of(values)) == 4
    h = TaskGraph(values)  # persisted values are inputs of a later graph
    total = h.compute([h.add("total", lambda *v: sum(a.sum() for a in v),
                             *[h.ref(v) for v in values]).key])
    assert total == [int((np.arange(12) ** 3).sum())]


def _halves(b):
    return b[b[:, 0] < 0], b[b[:, 0] >= 0]


def _stack(values):
    return np.concatenate(values)


def test_items_lists_and_inputs_made_from_the_graph():
    """Item tasks of their own kind (add_items), a list argument read by two tasks, an
    array made from the graph's tasks read back as an input, and a layer joined after an
    array was made from it: values as NumPy on the whole array, the early array intact."""
    import dask.array as da

    rng = np.random.default_rng(2)
    x = rng.normal(size=(11, 3))
    arr = da.from_array(x, chunks=(4, 3))
    g = TaskGraph([arr])
    n = arr.numblocks[0]
    for i in range(n):
        g.add(("halves", i), _halves, g.chunk(arr, i, 0))
        g.add_items(("halves", i), 2, "half")
    assert g.graph().layers["half"][("half", 1, 0)][1] == ("halves", 1)
    negatives = g.list(g.refs([("half", i, 0) for i in range(n)]))
    g.add(("neg", 0, 0), _stack, negatives)
    g.add(("neg-again", 0), _stack, negatives)
    assert g.deps["neg"] == {"half"} and g.deps["neg-again"] == {"half"}
    neg = g.array("neg", ((int((x[:, 0] < 0).sum()),), (3,)), np.empty((0, 3)))
    # the made array becomes an input of later tasks; the "neg" layer is joined later
    g.add_input(neg * 1.0)
    scaled = (neg * 1.0).name
    g.add(("neg", 1, 0), np.multiply, g.chunk(neg * 1.0, 0, 0), 3.0)
    assert g.deps["neg"] == {"half", scaled}
    with dask.config.set(scheduler="synchronous"):
        np.testing.assert_array_equal(neg.compute(), x[x[:, 0] < 0])
        assert ("neg", 1, 0) not in dict(neg.__dask_graph__())
        (again, tripled) = g.compute([("neg-again", 0), ("neg", 1, 0)])
    np.testing.assert_array_equal(again, x[x[:, 0] < 0])
    np.testing.assert_array_equal(tripled, 3.0 * x[x[:, 0] < 0])


def test_unknown_keys_are_named():
    import dask.array as da
    import pytest

    arr = da.zeros((4, 3), chunks=(2, 3))
    g = TaskGraph([arr])
    g.add(("a", 0), np.negative, g.chunk(arr, 0, 0))
    with pytest.raises(ValueError, match="reads \\('b', 0\\)"):
        g.add(("c", 0), _stack, g.list(g.refs([("a", 0), ("b", 0)])))
    with pytest.raises(ValueError, match="reads"):
        g.add(("c", 0), np.negative, g.ref(("a", 5)))


def test_task_payloads_count_their_bytes_and_travel_field_by_field():
    """Domain parts, octrees and domain trees (the objects tasks hand each other) tell
    dask their real size (they read as ~56 bytes before, so the scheduler moved whole
    trees to run a task beside a small input) and serialize field by field."""
    from dask.sizeof import sizeof
    from distributed.protocol import deserialize, serialize

    from cosmo_dask.gravity.tree.forces import DomainTree
    from cosmo_dask.spatial import DomainPart
    from cosmo_dask.spatial.octree import build_octree

    rng = np.random.default_rng(3)
    n = 20_000
    pos = rng.random((n, 3))
    part = DomainPart(2, pos, np.arange(n), n - 5, np.zeros(n, bool), {"mass": rng.random(n)})
    arrays = pos.nbytes + part.index.nbytes + part.exported.nbytes + part.extra["mass"].nbytes
    assert arrays <= sizeof(part) < arrays + 4096
    tree = build_octree(pos, part.extra["mass"], max_leaf=16, max_group=16)
    dt = DomainTree(tree, np.zeros(tree.n_nodes), part.index)
    assert sizeof(dt) > tree.pos.nbytes + tree.lo.nbytes + dt.index.nbytes
    for obj in (part, dt):
        header, frames = serialize(obj, serializers=("dask", "pickle"))
        assert header["serializer"] == "dask"
        back = deserialize(header, frames)
        assert type(back) is type(obj)
    assert back.tree.n_nodes == tree.n_nodes
    np.testing.assert_array_equal(back.tree.com, tree.com)
    np.testing.assert_array_equal(back.index, dt.index)
    header, frames = serialize(part, serializers=("dask", "pickle"))
    back = deserialize(header, frames)
    assert back.n_owned == n - 5 and back.domain == 2
    np.testing.assert_array_equal(back.extra["mass"], part.extra["mass"])
