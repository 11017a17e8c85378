"""The domain layout both ways (spatial.layout): exchange to the domains, then gather of
each domain's owned rows, returns every column exactly, in chunk order."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import cosmo_dask.spatial.domains as sd
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.core.task_graph import TaskGraph
from cosmo_dask.spatial import DomainPart, decompose, domain_grid, rows_by_chunk

N, BOX = 3000, 10.0


def _cloud(seed: int = 11):
    """Positions (a clump, points on domain faces and on the box edge), ids, velocities."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0, BOX, (N, 3))
    pos[:600] = (4.0 + 0.5 * rng.standard_normal((600, 3))) % BOX
    pos[600:650] = rng.choice([0.0, BOX * (1 - 1e-12), BOX / 3, BOX / 2], size=(50, 3))
    ids = rng.permutation(N).astype(np.int64) * 3 + 1
    vel = rng.standard_normal((N, 3)).astype(np.float32)
    return pos, ids, vel


def _identity(bounds, part: DomainPart):
    """A per-domain result: the owned rows' columns as received, cut by chunk."""
    n = part.n_owned
    return rows_by_chunk(bounds, part.index[:n], part.pos[:n], part.extra["ids"][:n],
                         part.extra["vel"][:n])


def _occupied(pieces) -> np.ndarray:
    return np.flatnonzero([p[0].shape[0] > 0 for p in pieces])


def _round_trip(pos, ids, vel, grid, gw, *, known_chunks=False):
    """exchange -> identity per domain -> gather; also the rows every domain received."""
    layout = decompose(pos, grid, ghost_width=gw, name="rt")
    parts = layout.exchange(ids=ids, vel=vel)
    g = TaskGraph(parts)
    token = dask.base.tokenize(*[p.key for p in parts])
    per_domain = [g.add(("rt-identity-" + token, d), _identity, layout.bounds, g.ref(p))
                  for d, p in enumerate(parts)]
    received = g.add("rt-received-" + token, lambda *ps: [p.index.size for p in ps],
                     *[g.ref(p) for p in parts])
    chunks_of = None
    if known_chunks:  # as FOF: the persisted domain stage says which chunks it holds
        occupied = [g.add(("rt-occupied-" + token, d), _occupied, r)
                    for d, r in enumerate(per_domain)]
        chunks_of = g.compute([o.key for o in occupied])
    xp = np if isinstance(pos._meta, np.ndarray) else __import__("cupy")
    outputs = [("pos", (3,), xp.empty((0, 0), pos.dtype)), ("ids", (), xp.empty(0, np.int64)),
               ("vel", (3,), xp.empty((0, 0), np.float32))]
    back = layout.gather(g, per_domain, outputs, token=token, chunks_of=chunks_of)
    (sizes,) = g.compute([received.key])
    return layout, back, sizes


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("gw", [0.0, 0.9])
@pytest.mark.parametrize("chunks, n_domains", [(700, 8), (333, 27), ((1000, 0, 2000), (3, 1, 2)),
                                               (N, 1), (500, 64)])
@pytest.mark.parametrize("two_stage", [False, True])
def test_exchange_then_gather_returns_every_column(monkeypatch, periodic, gw, chunks,
                                                   n_domains, two_stage):
    x, i, v = _cloud()
    if not periodic:
        x = x - 5.0  # an isolated system around the origin
    grid = (domain_grid(n_domains, box_size=BOX) if periodic
            else domain_grid(n_domains, bounds=(x.min(0), x.max(0))))
    if two_stage:  # both exchanges in two stages
        monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    pos = da.from_array(x, chunks=(chunks, 3))
    ids, vel = da.from_array(i, chunks=pos.chunks[0]), da.from_array(v, chunks=(400, 3))
    layout, back, sizes = _round_trip(pos, ids, vel, grid, gw)
    for arr, ref in zip(back, (x, i, v), strict=True):
        assert arr.chunks[0] == pos.chunks[0]  # the input's row chunks
        got = arr.compute()
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)  # exact, in chunk order
    # ghosts did travel (so the way back dropped them), exactly when asked for
    if gw > 0 and grid.n_domains > 1:
        assert sum(sizes) > N
    else:
        assert sum(sizes) == N
    assert layout.n_chunks == len(pos.chunks[0]) and layout.bounds[-1] == N


@pytest.mark.parametrize("periodic", [True, False])
def test_gather_with_known_chunks_reads_only_their_pieces(periodic):
    """Lattice-ordered input (each chunk a slab of x): with the chunks each domain holds
    (``chunks_of``), one piece per (domain, chunk) sharing rows, and the same columns."""
    n_side = 16
    q = (np.stack(np.meshgrid(*[np.arange(n_side)] * 3, indexing="ij"), -1)
         .reshape(-1, 3) + 0.5) * (BOX / n_side)
    x = q if periodic else q - 5.0
    i = np.arange(n_side**3, dtype=np.int64)
    v = x.astype(np.float32)
    pos = da.from_array(x, chunks=(n_side * n_side * 2, 3))  # 8 chunks, two x-planes each
    grid = (domain_grid((4, 2, 1), box_size=BOX) if periodic
            else domain_grid((4, 2, 1), bounds=(x.min(0), x.max(0))))
    _, back, _ = _round_trip(pos, da.from_array(i, chunks=pos.chunks[0]),
                             da.from_array(v, chunks=(pos.chunks[0], 3)), grid, 0.3,
                             known_chunks=True)
    keys = [k for k in dict(back[0].__dask_graph__()) if isinstance(k, tuple)
            and str(k[0]).startswith("rt-piece")]
    assert len(keys) == 8 * 2  # a chunk lies in one x-column of 2 domains (not 8 x 8)
    for arr, ref in zip(back, (x, i, v), strict=True):
        np.testing.assert_array_equal(arr.compute(), ref)


def test_round_trip_on_a_distributed_cluster(client):
    x, i, v = _cloud(3)
    pos = da.from_array(x.astype(np.float32), chunks=(500, 3))
    grid = domain_grid(8, box_size=BOX)
    _, back, sizes = _round_trip(pos, da.from_array(i, chunks=500),
                                 da.from_array(v, chunks=(500, 3)), grid, 1.0)
    got = dask.compute(*back)
    for arr, ref in zip(got, (x.astype(np.float32), i, v), strict=True):
        np.testing.assert_array_equal(arr, ref)
    assert sum(sizes) > N


def test_placed_gather_pins_each_domains_pieces_to_its_worker(client):
    """gather(workers=...): every column back exactly; each domain's pieces were cut on
    worker d mod 2 (the placement survives: they are persisted as built)."""
    from cosmo_dask.core.progress import worker_addresses

    x, i, v = _cloud(7)
    pos = da.from_array(x, chunks=(750, 3))
    grid = domain_grid(8, box_size=BOX)
    layout = decompose(pos, grid, name="pl")
    parts = layout.exchange(ids=da.from_array(i, chunks=750),
                            vel=da.from_array(v, chunks=(750, 3)))
    g = TaskGraph(parts)
    token = dask.base.tokenize(*[p.key for p in parts], "placed")
    per_domain = [g.add(("pl-identity-" + token, d), _identity, layout.bounds, g.ref(p))
                  for d, p in enumerate(parts)]
    workers = worker_addresses()
    outputs = [("pos", (3,), np.empty((0, 0), x.dtype)), ("ids", (), np.empty(0, np.int64)),
               ("vel", (3,), np.empty((0, 0), np.float32))]
    back = layout.gather(g, per_domain, outputs, token=token, workers=workers)
    from distributed import futures_of, wait

    futures = futures_of(back[0])  # the persisted pieces behind the chunk tasks
    wait(futures)
    held = client.who_has(futures)  # before any chunk task reads (and copies) them
    assert len(held) == 8 * 4  # every (domain, chunk) pair, one stage
    for key, where in held.items():
        assert list(where) == [workers[key[1] % len(workers)]], (key, where)
    for arr, ref in zip(dask.compute(*back), (x, i, v), strict=True):
        np.testing.assert_array_equal(arr, ref)


def test_layout_errors_name_the_parameter():
    pos = da.zeros((10, 3), chunks=(5, 3))
    grid = domain_grid(8, box_size=BOX)
    with pytest.raises(ParameterError, match="ghost_width must be finite and >= 0"):
        decompose(pos, grid, ghost_width=-1.0)
    with pytest.raises(ParameterError, match="ghost_width must be finite and >= 0"):
        decompose(pos, grid, ghost_width=float("nan"))
    with pytest.raises(ParameterError, match="not smaller than the domain side 5"):
        decompose(pos, grid, ghost_width=5.0)
    layout = decompose(pos, grid)
    with pytest.raises(ParameterError, match="one result per domain \\(8\\), got 2"):
        layout.gather(TaskGraph(), [None, None], [], token="t")


@pytest.mark.gpu
@pytest.mark.parametrize("two_stage", [False, True])
def test_gpu_round_trip(monkeypatch, two_stage):
    """CuPy chunks: the parts and the gathered arrays stay on the GPU, every column exact."""
    cupy = pytest.importorskip("cupy")
    if two_stage:
        monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    x, i, v = _cloud(5)
    pos = da.from_array(cupy.asarray(x), chunks=(450, 3), asarray=False)
    ids = da.from_array(cupy.asarray(i), chunks=450, asarray=False)
    vel = da.from_array(cupy.asarray(v), chunks=(450, 3), asarray=False)
    grid = domain_grid(27, box_size=BOX)
    _, back, sizes = _round_trip(pos, ids, vel, grid, 0.8)
    for arr, ref in zip(back, (x, i, v), strict=True):
        got = arr.compute()
        assert isinstance(got, cupy.ndarray)
        np.testing.assert_array_equal(got.get(), ref)
    assert sum(sizes) > N


def _check_by_domain(xp, client=None):
    """by_domain over ``xp`` chunks (NumPy or CuPy): chunk d of every column is domain
    d's own rows, in input order, the same rows in every column, of ``xp``'s type; on a
    client the chunks lie on both workers."""
    x, i, v = _cloud(5)
    grid = domain_grid(8, box_size=BOX)

    def arr(a, chunks):
        return da.from_array(xp.asarray(a), chunks=chunks, asarray=False)

    out = decompose(arr(x, (700, 3)), grid, name="keep").by_domain(ids=arr(i, 700),
                                                                  vel=arr(v, (700, 3)))
    assert set(out) == {"pos", "ids", "vel"}
    chunks = out["pos"].chunks[0]
    assert len(chunks) == 8 and sum(chunks) == N
    assert all(out[k].chunks[0] == chunks for k in out)
    got = dask.compute(out["pos"], out["ids"], out["vel"])
    assert all(isinstance(a, type(xp.asarray(x))) for a in got)
    p, ids, vel = (a.get() if hasattr(a, "get") else a for a in got)
    row = {int(k): r for r, k in enumerate(i)}
    src = np.array([row[int(k)] for k in ids])  # the input row of every output row
    np.testing.assert_array_equal(p, x[src])
    np.testing.assert_array_equal(vel, v[src])
    bounds = np.cumsum((0,) + chunks)
    owner = grid.owner_of(x)
    for d in range(8):
        np.testing.assert_array_equal(src[bounds[d]:bounds[d + 1]], np.flatnonzero(owner == d))
    if client is not None:  # each domain's rows on worker d mod 2
        from distributed import futures_of, wait

        futures = futures_of(out["pos"].persist())
        wait(futures)
        held = client.who_has(futures)
        assert len({w for ws in held.values() for w in ws}) == 2


@pytest.mark.parametrize("distributed", [False, True])
def test_by_domain_holds_each_domain_in_its_chunk(request, distributed):
    """On the threaded scheduler, and pinned to workers on a cluster."""
    _check_by_domain(np, request.getfixturevalue("client") if distributed else None)


@pytest.mark.gpu
@pytest.mark.parametrize("distributed", [False, True])
def test_gpu_by_domain(request, distributed):
    """CuPy chunks stay on the GPU, reordered as on the CPU."""
    cupy = pytest.importorskip("cupy")
    _check_by_domain(cupy, request.getfixturevalue("client") if distributed else None)


def test_by_domain_refuses_ghosts_and_a_column_named_pos():
    pos = da.zeros((10, 3), chunks=(5, 3))
    grid = domain_grid(8, box_size=BOX)
    with pytest.raises(ParameterError, match="must have no ghosts"):
        decompose(pos, grid, ghost_width=1.0).by_domain()
    with pytest.raises(ParameterError, match="'pos' is the positions' name"):
        decompose(pos, grid).by_domain(pos=pos)
