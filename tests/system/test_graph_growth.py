"""How the domain graphs grow with chunks and domains (issue 19 item 5): the two-stage
exchanges, the cutoff's LET pruning and the FOF way back that reads only the domains
holding a chunk's rows, each giving the same results as the all-pairs graph."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import cosmo_dask.gravity.tree.graph as tg
import cosmo_dask.spatial.domains as sd
from cosmo_dask.spatial import decompose, domain_grid


def _kinds(arr) -> dict:
    """Tasks per kind (the key name before its token) of a collection's graph."""
    out: dict = {}
    for key in dict(arr.__dask_graph__()):
        name = key[0] if isinstance(key, tuple) else key
        kind = "-".join(p for p in str(name).split("-")
                        if not (len(p) >= 8 and all(c in "0123456789abcdef" for c in p)))
        out[kind] = out.get(kind, 0) + 1
    return out


def _pairs_exact(n_chunks, n_dom):
    """Keys of the one-stage split: a split task per chunk, a piece per (chunk, domain)."""
    return n_chunks + n_chunks * n_dom


@pytest.mark.parametrize("n_chunks, n_dom", [(16, 8), (64, 64)])
def test_split_keys_grow_as_sum_not_product(monkeypatch, n_chunks, n_dom):
    box = 10.0
    pos = da.random.default_rng(1).random((n_chunks * 100, 3), chunks=(100, 3)) * box
    grid = domain_grid(n_dom, box_size=box)
    one = _kinds(decompose(pos, grid, ghost_width=0.1, name="t").exchange()[0])
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    two = _kinds(decompose(pos, grid, ghost_width=0.1, name="t").exchange()[0])
    assert one["t-split"] == _pairs_exact(n_chunks, n_dom)
    cg, dg = len(sd._groups(n_chunks)), len(sd._groups(n_dom))
    # chunks -> groups of domains, then (group of chunks, group of domains) -> domains
    assert two["t-split"] == n_chunks + n_chunks * dg
    assert two["t-regroup"] == cg * dg + cg * n_dom
    exchange = two["t-split"] + two["t-regroup"]
    assert exchange < 3 * (n_chunks + n_dom) * max(cg, dg)
    if n_chunks * n_dom >= 4096:
        assert exchange < _pairs_exact(n_chunks, n_dom) / 3  # 1,152 + 64 vs 4,160 keys


@pytest.mark.parametrize("periodic", [True, False])
def test_two_stage_split_gives_the_same_domains(monkeypatch, periodic):
    rng = np.random.default_rng(4)
    box = 10.0
    x = rng.uniform(0, box, (3000, 3)).astype(np.float32)
    ids = rng.permutation(3000).astype(np.int64)
    pos, idarr = da.from_array(x, chunks=(230, 3)), da.from_array(ids, chunks=230)
    grid = (domain_grid(27, box_size=box) if periodic
            else domain_grid(27, bounds=(x.min(0), x.max(0))))
    parts1 = dask.compute(*decompose(pos, grid, ghost_width=0.6).exchange(ids=idarr))
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    parts2 = dask.compute(*decompose(pos, grid, ghost_width=0.6).exchange(ids=idarr))
    owned = np.zeros(3000, int)
    for p1, p2 in zip(parts1, parts2, strict=True):
        assert p1.n_owned == p2.n_owned
        for a, b in ((p1.pos, p2.pos), (p1.index, p2.index), (p1.exported, p2.exported),
                     (p1.extra["ids"], p2.extra["ids"])):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(p2.extra["ids"], ids[p2.index])
        owned[p2.index[:p2.n_owned]] += 1
    assert np.all(owned == 1)


@pytest.mark.parametrize("n_chunks, n_slabs", [(16, 9), (64, 64), (130, 127)])
def test_slab_exchange_keys_grow_as_sum_not_product(monkeypatch, n_chunks, n_slabs):
    """The particle -> mesh-slab exchange (deposit) and the way back (interpolation):
    about ``C sqrt(S) + S sqrt(C)`` keys in two stages instead of ``C S``; the one-stage
    graph below the threshold."""
    import functools

    from cosmo_dask.gravity.pm import _interp_piece
    from cosmo_dask.spatial.slabs import SlabExchange, slab_layout

    n, box = max(n_slabs, 16), 1.0
    pos = da.random.default_rng(2).random((n_chunks * 50, 3), chunks=(50, 3))
    layout = slab_layout(n, n_slabs, box, order=2, shifts=(0.0, 0.5))
    mesh = da.zeros((n, n, n), chunks=(layout.chunks, n, n))

    def graphs():
        ex = SlabExchange(pos, 1.0, layout)
        painted = ex.deposit(lambda pieces, lo, hi: np.zeros((hi - lo, n, n)), name="t-paint",
                             dtype=np.float64)
        values = ex.interpolate([(functools.partial(_interp_piece, box=box, shift=0.0),
                                  [mesh], 1)], name="t-interp", dtype=np.float64)
        return ex.two_stage, _kinds(painted), _kinds(values)

    c, s = n_chunks, n_slabs
    assert graphs()[0] == (c * s > sd.TWO_STAGE_PAIRS)  # the default (130 x 127: above)
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", c * s)
    staged, dep1, int1 = graphs()
    assert not staged
    assert dep1["mesh-split"] == c and dep1["mesh-piece"] == c * s and dep1["t-paint"] == s
    assert int1["t-interp-slab"] == c * s and int1["t-interp"] == c
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    staged, dep2, int2 = graphs()
    cg, sg = len(sd._groups(c)), len(sd._groups(s))
    assert staged and dep2["t-paint"] == s
    # chunks -> groups of slabs, then (group of chunks, group of slabs) -> slabs
    assert dep2["mesh-split"] == c + c * sg
    assert dep2["mesh-regroup"] == cg * sg and dep2["mesh-piece"] == cg * s
    # one interpolation per (slab, group of chunks), a merge per (group, group) cut by
    # chunk, one gather per chunk reading a cut of each group of slabs
    assert int2["t-interp-slab"] == cg * s
    assert int2["t-interp-merge"] == cg * sg + c * sg and int2["t-interp"] == c
    exchange = dep2["mesh-split"] + dep2["mesh-regroup"] + dep2["mesh-piece"]
    assert exchange < 3 * (c + s) * max(cg, sg)
    if c * s >= 4096:
        assert exchange < (c + c * s) / 3  # 64 x 64: 1,160 + 64 vs 4,160 keys
        assert int2["t-interp-slab"] + int2["t-interp-merge"] < c * s / 3


@pytest.fixture(scope="module")
def cloud():
    rng = np.random.default_rng(7)
    box = 10.0
    x = rng.uniform(0, box, (2500, 3))
    x[:800] = (3.0 + 0.7 * rng.standard_normal((800, 3))) % box  # a clump
    return x, rng.uniform(0.5, 1.5, 2500), box


def test_tree_way_back_and_let_pruning_change_nothing(monkeypatch, cloud):
    """TreePM's short range on 64 domains: pruned LETs (26 neighbours each), cut for the
    neighbouring level-1 blocks (2 domains a side: 7 block LETs and 7 own-block LETs per
    source, 896 instead of 64 x 26 = 1,664), and the two-stage way back give the
    all-pairs, per-pair, one-stage results bit for bit."""
    x, m, box = cloud
    pos, mass = da.from_array(x, chunks=(300, 3)), da.from_array(m, chunks=300)
    kw = dict(G=1.0, theta=0.5, box_size=box, rs=0.3, n_domains=64)  # r_cut 1.35 < side 2.5
    acc, pot = tg.tree_accelerations(pos, mass, **kw)
    kinds = _kinds(acc)
    assert (kinds["gravity-let"], kinds["gravity-blocklet"]) == (448, 448)
    a1, p1 = dask.compute(acc, pot)
    pruned = tg.let_sources
    monkeypatch.setattr(tg, "let_sources", lambda grid, r_cut: pruned(grid, None))
    monkeypatch.setattr(tg, "LET_BLOCKS", False)
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    acc2, pot2 = tg.tree_accelerations(pos, mass, **kw)
    kinds2 = _kinds(acc2)
    assert kinds2["gravity-let"] == 64 * 63 and "gravity-piece-merge" in kinds2
    a2, p2 = dask.compute(acc2, pot2)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(p1, p2)
    # and both against the float64 direct sum of the truncated kernel (tree error level)
    from tests.support.gravity import reference, rel_err

    idx = np.arange(0, 2500, 25)
    ref_a, _ = reference(x, m, targets=idx, box=box, rs=0.3, r_cut=tg.default_r_cut(0.3))
    assert np.median(rel_err(a1[idx], ref_a)) < 2e-3


def test_default_domains_and_batches_are_capped():
    n = 2048**3
    nd = tg.default_n_domains(n, False)
    assert nd == tg.MAX_DOMAINS
    assert nd * tg.batches_per_domain(n, nd) <= tg.MAX_GROUP_TASKS
    assert tg.default_n_domains(2**22, False) == 2  # small inputs: unchanged
    assert tg.batches_per_domain(2**22, 2) == 2**22 // (2 * tg.GROUP_BATCH_PARTICLES)


def test_fof_way_back_reads_only_the_domains_holding_a_chunk():
    """A snapshot in Lagrangian order: each chunk is an x-slab of the lattice, so it meets
    only the domains of one or two x-columns; the labels graph has one piece per
    (domain, chunk) that share rows (counted here from the positions), not per pair."""
    from cosmo_dask import Snapshot
    from cosmo_dask.halos.fof_graph import fof_labels

    n_side, box = 32, 32.0
    q = (np.stack(np.meshgrid(*[np.arange(n_side)] * 3, indexing="ij"), -1)
         .reshape(-1, 3) + 0.5) * (box / n_side)
    rng = np.random.default_rng(2)
    x = (q + 0.05 * rng.standard_normal(q.shape)) % box
    chunk = n_side * n_side * 2  # two x-planes per chunk: 16 chunks
    snap = Snapshot.from_arrays(x, box_size=box, chunks=chunk)
    # 1.2 spacings: every particle links its 6 lattice neighbours, not the diagonals
    res = fof_labels(snap, 1.2, n_domains=(4, 2, 2), min_members=2)
    kinds = _kinds(res.labels)
    grid = domain_grid((4, 2, 2), box_size=box)
    owner = grid.owner_of(x)
    pairs = {(int(o), i // chunk) for i, o in enumerate(owner)}
    assert len(pairs) == 16 * 4  # a chunk lies in one x-column of 2 x 2 domains
    assert kinds["fof-piece"] == len(pairs) < 16 * 16
    assert kinds["fof-labels"] == 16
    labels = res.labels.compute()  # one group: the whole lattice
    assert np.all(labels == 0) and res.n_members.tolist() == [n_side**3]


def test_default_read_chunks_of_very_large_stores(tmp_path):
    """At most MAX_READ_CHUNKS whole store chunks by default; small stores unchanged."""
    import zarr

    from cosmo_dask.core.backend import MAX_READ_CHUNKS, large_store_rows

    assert large_store_rows(2**20, 2048**3) == 2**24  # 512 chunks of 16 store chunks
    assert large_store_rows(2**20, 2**29) == 2**20  # 512 store chunks: as stored
    assert large_store_rows(3000, 10**7) == 21000  # whole store chunks: 477 chunks
    assert -(-10**7 // 21000) <= MAX_READ_CHUNKS < -(-10**7 // 18000)
    # an opened store: the dask chunks follow (metadata only, no chunk written)
    from cosmo_dask import open_snapshot
    from cosmo_dask.store.validation import FORMAT, FORMAT_VERSION

    n = 600 * 1000
    attrs = {"format": FORMAT, "format_version": FORMAT_VERSION, "box_size": 10.0,
             "particle_mass": 1.0, "n_particles": n}
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3,
                            attributes=attrs)
    group.create_array("pos", shape=(n, 3), chunks=(1000, 3), dtype="float32",
                       fill_value=0, dimension_names=("particle", "component"))
    snap = open_snapshot(tmp_path / "s.zarr", allow_missing_chunks=True)
    assert set(snap.pos.chunks[0][:-1]) == {2000} and len(snap.pos.chunks[0]) == 300
    snap = open_snapshot(tmp_path / "s.zarr", allow_missing_chunks=True, chunks=1000)
    assert len(snap.pos.chunks[0]) == 600


@pytest.mark.gpu
def test_gpu_two_stage_exchanges_equal_the_reference(tmp_path, monkeypatch):
    """CuPy chunks through the two-stage split and way back (forced): FOF labels equal the
    scipy reference, and multi-domain tree forces equal the one-stage graph's."""
    cupy = pytest.importorskip("cupy")
    from cosmo_dask import Snapshot, open_snapshot
    from cosmo_dask.halos import fof_labels
    from tests.support.fof_reference import clustered, reference_labels

    rng = np.random.default_rng(3)
    box = 40.0
    pos = clustered(rng, 20000, box, sigma=0.12)
    ids = rng.permutation(len(pos)).astype(np.int64)
    Snapshot.from_arrays(pos, ids=ids, box_size=box, chunks=2000).to_zarr(tmp_path / "s.zarr")
    snap = open_snapshot(tmp_path / "s.zarr", device="gpu")
    x = snap.pos.astype(np.float64)
    acc1, pot1 = dask.compute(*tg.tree_accelerations(x, 1.0, G=1.0, box_size=box, rs=1.0,
                                                     n_domains=27))
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    res = fof_labels(snap, 0.25, absolute=True, min_members=5, n_domains=27)
    got = res.labels.compute()
    assert isinstance(got, cupy.ndarray)
    labels, sizes, _ = reference_labels(pos, 0.25, box, 5, ids)
    np.testing.assert_array_equal(got.get(), labels)
    np.testing.assert_array_equal(res.n_members, sizes)
    acc2, pot2 = dask.compute(*tg.tree_accelerations(x, 1.0, G=1.0, box_size=box, rs=1.0,
                                                     n_domains=27))
    assert isinstance(acc2, cupy.ndarray)
    np.testing.assert_array_equal(acc1.get(), acc2.get())
    np.testing.assert_array_equal(pot1.get(), pot2.get())
