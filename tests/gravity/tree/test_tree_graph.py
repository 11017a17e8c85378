"""Tree gravity as a Dask graph (domains + locally essential trees) against float64
direct summation; independence of chunking, worker count and the domain split."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.gravity.tree.graph import tree_accelerations
from cosmo_dask.models import plummer
from tests.support.gravity import reference, rel_err


@pytest.fixture(scope="module")
def sphere():
    snap = plummer(20000, seed=3)
    x = np.asarray(snap.pos.compute(), np.float64)
    return x, np.full(len(x), 1.0 / len(x))


@pytest.mark.parametrize("n_domains", [1, 8])
def test_plummer_theta05_against_direct(sphere, n_domains):
    x, m = sphere
    acc, pot = tree_accelerations(da.from_array(x, chunks=6000), m[0], G=1.0, theta=0.5,
                                  n_domains=n_domains)
    a, p = dask.compute(acc, pot)
    idx = np.random.default_rng(0).choice(len(x), 600, replace=False)
    ref_a, ref_p = reference(x, m, targets=idx)
    err = rel_err(a[idx], ref_a)
    assert np.median(err) <= 5e-4   # measured 3.2e-4 (1 domain), 3.8e-4 (8 domains)
    assert np.percentile(err, 99) <= 5e-3
    assert np.median(np.abs(p[idx] / ref_p - 1)) <= 1e-4


def test_independent_of_chunking_and_workers(sphere, client):
    x, m = sphere
    x, m = x[:6000], m[:6000] * (1 + np.arange(6000) % 3)  # unequal masses (an array)
    kw = dict(G=2.0, theta=0.6, softening=0.01, n_domains=4)
    with dask.config.set(scheduler="threads"):
        a1, p1 = dask.compute(*tree_accelerations(
            da.from_array(x, chunks=1000), da.from_array(m, chunks=1000), **kw))
    a2, p2 = client.compute(list(tree_accelerations(
        da.from_array(x, chunks=2500), da.from_array(m, chunks=2500), **kw)), sync=True)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(p1, p2)


def test_group_batches_cover_every_group_once_and_balance_particles(sphere):
    from cosmo_dask.gravity.tree.forces import group_batch
    from cosmo_dask.spatial.octree import build_octree

    x, m = sphere
    tree = build_octree(x, m, max_leaf=64, max_group=64)
    counts = tree.count[tree.groups]
    for n_batches in (1, 3, 7, 40):
        runs = [group_batch(tree, b, n_batches) for b in range(n_batches)]
        assert runs[0][0] == 0 and runs[-1][1] == len(tree.groups)
        assert all(a[1] == b[0] for a, b in zip(runs[:-1], runs[1:], strict=True))  # contiguous
        sizes = np.array([counts[g0:g1].sum() for g0, g1 in runs])
        assert sizes.sum() == len(x)
        # a batch overshoots its share by less than one group
        assert sizes.max() <= len(x) / n_batches + counts.max()


def test_independent_of_group_batching(sphere, monkeypatch):
    import cosmo_dask.gravity.tree.graph as tg

    x, m = sphere
    x = da.from_array(x[:6000], chunks=1500)
    kw = dict(G=1.0, theta=0.5, softening=0.01, n_domains=2)
    a1, p1 = dask.compute(*tree_accelerations(x, 1.0 / 6000, **kw))
    monkeypatch.setattr(tg, "GROUP_BATCH_PARTICLES", 400)
    acc, pot = tree_accelerations(x, 1.0 / 6000, **kw)
    names = [k for k in dict(acc.__dask_graph__())
             if str(k[0] if isinstance(k, tuple) else k).startswith("gravity-group")]
    assert len(names) == 2 * 8  # 3000 particles per domain in batches of ~400
    a2, p2 = dask.compute(acc, pot)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(p1, p2)


def test_periodic_short_range_across_domains():
    rng = np.random.default_rng(5)
    box, n = 10.0, 3000
    x = rng.uniform(0, box, (n, 3))
    x[:1000] = (5.0 + 0.8 * rng.standard_normal((1000, 3))) % box  # a clump
    m = rng.uniform(0.5, 1.5, n)
    rs = 0.4
    idx = rng.choice(n, 300, replace=False)
    ref_a, ref_p = reference(x, m, targets=idx, box=box, rs=rs, r_cut=4.5 * rs)
    for nd in (1, 8):
        acc, pot = tree_accelerations(da.from_array(x, chunks=1000),
                                      da.from_array(m, chunks=1000), G=1.0, theta=0.5,
                                      box_size=box, rs=rs, n_domains=nd)
        a, p = dask.compute(acc, pot)
        assert np.median(rel_err(a[idx], ref_a)) <= 1e-3
        assert np.median(np.abs(p[idx] / ref_p - 1)) <= 1e-3


@pytest.mark.parametrize("scalar_mass", [True, False])
def test_one_gpu_domain_graph(sphere, monkeypatch, scalar_mass):
    """The one-GPU-domain graph (all chunks into one gravity-group task, a slice per output
    chunk), run on NumPy chunks with the CPU tree standing in for the GPU tree: the same
    forces as the one-domain CPU graph, in the input's chunks (the GPU tree itself is
    tested in the GPU tests below)."""
    import cosmo_dask.gravity.tree.forces_gpu as tree_gpu
    from cosmo_dask.gravity.tree.forces import tree_forces
    from cosmo_dask.gravity.tree.graph import _whole_gpu

    monkeypatch.setattr(tree_gpu, "tree_forces_gpu", tree_forces)
    x, m = sphere
    x, m = x[:5000], m[:5000] * (1 + np.arange(5000) % 3)
    pos = da.from_array(x, chunks=1300)
    mass = da.from_array(m, chunks=700)
    opts = {"G": 1.0, "theta": 0.5, "softening": 0.01, "softening_kernel": "plummer",
            "precision": "float64", "box_size": None, "rs": None, "r_cut": None,
            "max_leaf": 64, "max_group": 64}
    acc, pot = _whole_gpu(pos, mass, m[0] if scalar_mass else None, opts, "float64", True)
    assert acc.chunks == pos.chunks and pot.chunks == (pos.chunks[0],)
    names = {str(k[0] if isinstance(k, tuple) else k) for k in dict(acc.__dask_graph__())}
    assert sum(k.startswith("gravity-group") for k in names) == 1
    a, p = dask.compute(acc, pot)
    ref_a, ref_p = dask.compute(*tree_accelerations(
        pos, m[0] if scalar_mass else mass, G=1.0, theta=0.5, softening=0.01, n_domains=1))
    np.testing.assert_allclose(a, ref_a, rtol=1e-12, atol=0)
    np.testing.assert_allclose(p, ref_p, rtol=1e-12, atol=0)
    # and against the direct sum
    idx = np.arange(0, 5000, 25)
    mm = np.full(5000, m[0]) if scalar_mass else m
    d = x[idx, None, :] - x[None, :, :]
    r2 = (d * d).sum(-1) + 0.01**2
    ref = -(mm[None, :, None] * d / r2[..., None] ** 1.5).sum(1)
    assert np.median(rel_err(a[idx], ref)) <= 5e-4
    _, none = _whole_gpu(pos, mass, None, opts, "float64", False)
    assert none is None


def test_block_lets_change_nothing(sphere, monkeypatch):
    """64 domains without a cutoff: LETs cut for blocks of target domains from
    well-separated sources (1,384 LET tasks instead of 4,032) give the per-pair LETs'
    forces bit for bit."""
    import cosmo_dask.gravity.tree.graph as tg

    x, m = sphere
    pos, mass = da.from_array(x, chunks=(5000, 3)), da.from_array(m, chunks=5000)
    out = {}
    for blocks in (True, False):
        monkeypatch.setattr(tg, "LET_BLOCKS", blocks)
        acc, pot = tg.tree_accelerations(pos, mass, G=1.0, theta=0.5, n_domains=64)
        names = [k[0] for k in dict(acc.__dask_graph__()) if isinstance(k, tuple)]
        lets = sum(n.startswith(("gravity-let-", "gravity-blocklet-")) for n in names)
        assert lets == (1384 if blocks else 64 * 63), lets
        assert any(n.startswith("gravity-blocklet-") for n in names) == blocks
        out[blocks] = dask.compute(acc, pot)
    np.testing.assert_array_equal(out[True][0], out[False][0])
    np.testing.assert_array_equal(out[True][1], out[False][1])
    idx = np.arange(0, len(x), 97)
    ref_a, _ = reference(x, m, targets=idx)
    assert np.median(rel_err(out[True][0][idx], ref_a)) <= 5e-4


def test_block_lets_periodic_nearest_image(monkeypatch):
    """The same in a periodic box without a cutoff (nearest images; blocks separated the
    short way round): block LETs give the per-pair LETs' forces bit for bit."""
    import cosmo_dask.gravity.tree.graph as tg

    rng = np.random.default_rng(11)
    x = rng.uniform(0, 10.0, (6000, 3))
    pos = da.from_array(x, chunks=(2000, 3))
    out = {}
    for blocks in (True, False):
        monkeypatch.setattr(tg, "LET_BLOCKS", blocks)
        acc, pot = tg.tree_accelerations(pos, 1.0, G=1.0, theta=0.5, box_size=10.0,
                                         n_domains=64)
        names = [k[0] for k in dict(acc.__dask_graph__()) if isinstance(k, tuple)]
        assert any(n.startswith("gravity-blocklet-") for n in names) == blocks
        out[blocks] = dask.compute(acc, pot)
    np.testing.assert_array_equal(out[True][0], out[False][0])
    np.testing.assert_array_equal(out[True][1], out[False][1])


# -------------------- on the GPU (formerly tests/test_gravity_tree_graph_gpu.py)
# Tree gravity graph on CuPy chunks: the GPU tree per domain, CuPy out.


@pytest.mark.gpu
@pytest.mark.parametrize("n_domains", [1, 4])
def test_gpu_chunks_against_direct(n_domains):
    cupy = pytest.importorskip("cupy")
    x = np.asarray(plummer(20000, seed=4).pos.compute(), np.float64)
    m = np.full(len(x), 1.0 / len(x))
    pos = da.from_array(cupy.asarray(x), chunks=(5000, 3), asarray=False)
    acc, pot = tree_accelerations(pos, float(m[0]), G=1.0, theta=0.5, precision="float64",
                                  n_domains=n_domains)
    with dask.config.set(scheduler="synchronous"):
        a, p = dask.compute(acc, pot)
    assert isinstance(a, cupy.ndarray) and isinstance(p, cupy.ndarray)
    idx = np.random.default_rng(1).choice(len(x), 500, replace=False)
    ref_a, ref_p = reference(x, m, targets=idx)
    err = rel_err(cupy.asnumpy(a)[idx], ref_a)
    assert np.median(err) <= 5e-4
    assert np.percentile(err, 99) <= 5e-3
    assert np.median(np.abs(cupy.asnumpy(p)[idx] / ref_p - 1)) <= 1e-4


@pytest.fixture
def gpu_only_walk(monkeypatch):
    """Fail any CPU tree walk or host tree build; count the GPU domain evaluations (the
    GPU kernels of the contracts ``domain_forces`` and ``domain_let``, wrapped)."""
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.gravity import dispatch
    from cosmo_dask.gravity.tree import forces as tree_cpu

    calls = {"forces": 0, "lets": 0}
    forces = dispatch.domain_forces.gpu_implementation()
    let = dispatch.domain_let.gpu_implementation()

    def count_forces(*args, **kw):
        calls["forces"] += 1
        return forces(*args, **kw)

    def count_let(*args, **kw):
        out = let(*args, **kw)
        if out is not None:
            calls["lets"] += 1
            assert type(out.pos).__module__.startswith("cupy")
        return out

    def no_host(*args, **kw):
        raise AssertionError("a CPU tree kernel ran on CuPy chunks")

    dispatch.domain_forces.register(cupy.ndarray, count_forces)
    dispatch.domain_let.register(cupy.ndarray, count_let)
    monkeypatch.setattr(tree_cpu, "build_octree", no_host)
    monkeypatch.setattr(tree_cpu, "interaction_lists", no_host)
    yield calls
    dispatch.domain_forces.register(cupy.ndarray, forces)
    dispatch.domain_let.register(cupy.ndarray, let)


@pytest.mark.gpu
def test_eight_gpu_domains_equal_one_gpu_domain(gpu_only_walk):
    """Issue 19 item 3: with 8 domains on one GPU every tree, LET and walk runs on the GPU
    (the CPU kernels are patched to fail) and the result equals the single-domain GPU tree
    to the tree's error level, both checked against the float64 direct sum."""
    cupy = pytest.importorskip("cupy")
    x = np.asarray(plummer(30000, seed=5).pos.compute(), np.float64)
    m = np.full(len(x), 1.0 / len(x))
    pos = da.from_array(cupy.asarray(x), chunks=(7000, 3), asarray=False)
    out = {}
    for nd in (1, 8):
        acc, pot = tree_accelerations(pos, float(m[0]), G=1.0, theta=0.5,
                                      precision="float64", n_domains=nd)
        with dask.config.set(scheduler="synchronous"):
            a, p = dask.compute(acc, pot)
        assert isinstance(a, cupy.ndarray)
        out[nd] = cupy.asnumpy(a), cupy.asnumpy(p)
    # every domain evaluated on the GPU; a LET for each pair of non-empty domains (the
    # grid over the bounding box leaves the outer domains of a Plummer sphere sparse)
    assert gpu_only_walk["forces"] == 8 and gpu_only_walk["lets"] >= 8
    idx = np.random.default_rng(2).choice(len(x), 500, replace=False)
    ref_a, ref_p = reference(x, m, targets=idx)
    for nd in (1, 8):
        err = rel_err(out[nd][0][idx], ref_a)
        assert np.median(err) <= 5e-4 and np.percentile(err, 99) <= 5e-3, nd
    diff = rel_err(out[8][0], out[1][0])
    assert np.median(diff) <= 5e-4 and np.percentile(diff, 99) <= 5e-3
    assert np.median(np.abs(out[8][1] / out[1][1] - 1)) <= 1e-4


@pytest.mark.gpu
def test_eight_gpu_domains_treepm_short_range(gpu_only_walk):
    """The truncated short range in a periodic box (TreePM's tree part) over 8 GPU domains
    against the float64 direct sum with the same kernel and cut, and against one domain."""
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(7)
    box, rs = 50.0, 1.5
    centres = rng.uniform(0, box, (40, 3))
    x = np.mod(centres[rng.integers(0, 40, 40000)] + rng.normal(0, 2.0, (40000, 3)), box)
    m = rng.uniform(0.5, 1.5, len(x)) / len(x)  # per-particle masses, CuPy chunks
    pos = da.from_array(cupy.asarray(x), chunks=(10000, 3), asarray=False)
    mass = da.from_array(cupy.asarray(m), chunks=10000, asarray=False)
    out = {}
    for nd in (1, 8):
        acc, pot = tree_accelerations(pos, mass, G=1.0, theta=0.5, precision="float64",
                                      box_size=box, rs=rs, n_domains=nd)
        with dask.config.set(scheduler="synchronous"):
            a, p = dask.compute(acc, pot)
        out[nd] = cupy.asnumpy(a), cupy.asnumpy(p)
    assert gpu_only_walk["forces"] == 8 and gpu_only_walk["lets"] >= 8
    idx = np.random.default_rng(3).choice(len(x), 400, replace=False)
    ref_a, _ = reference(x, m, targets=idx, box=box, rs=rs, r_cut=4.5 * rs)
    for nd in (1, 8):
        err = rel_err(out[nd][0][idx], ref_a)
        assert np.median(err) <= 2e-3 and np.percentile(err, 99) <= 2e-2, (nd, np.median(err))
    diff = rel_err(out[8][0], out[1][0])
    assert np.median(diff) <= 2e-3 and np.percentile(diff, 99) <= 2e-2


@pytest.mark.gpu
def test_gpu_domain_trees_and_lets_travel_as_device_buffers():
    """A GPU domain tree and a LET tell dask their size and serialize, in the "cuda"
    family (what UCX sends), as device buffers that come back as the same CuPy arrays."""
    cupy = pytest.importorskip("cupy")
    from dask.sizeof import sizeof
    from distributed.protocol import deserialize, serialize

    from cosmo_dask.gravity.tree.let_gpu import domain_let_gpu, domain_tree_gpu

    rng = np.random.default_rng(4)
    n, box = 50_000, 10.0
    pos = cupy.asarray(rng.random((n, 3)) * box)
    mass = cupy.full(n, 1.0 / n)
    opts = {"G": 1.0, "theta": 0.5, "softening": 0.0, "softening_kernel": "plummer",
            "precision": "float64", "box_size": box, "rs": 0.3, "r_cut": 1.35,
            "max_leaf": 32, "max_group": 32}
    dt = domain_tree_gpu(pos, mass, cupy.arange(n), opts)
    assert sizeof(dt) > dt.pos64.nbytes + dt.tree.pos.nbytes + dt.index.nbytes
    let = domain_let_gpu(dt, np.array([0.0, 0.0, 0.0]), np.array([2.0, 10.0, 10.0]), opts)
    assert let is not None and sizeof(let) >= let.pos.nbytes + let.lo.nbytes
    for obj in (dt, let):
        header, frames = serialize(obj, serializers=("cuda",))
        assert header["serializer"] == "cuda"
        back = deserialize(header, frames)
        assert type(back) is type(obj)
    assert isinstance(back.pos, cupy.ndarray)
    cupy.testing.assert_array_equal(back.pos, let.pos)
    cupy.testing.assert_array_equal(back.first_child, let.first_child)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_treepm_block_lets_equal_pair_lets(monkeypatch):
    """TreePM's short range on 64 GPU domains: LETs cut for neighbouring 2x2x2 blocks (896
    LET tasks) give the per-pair LETs' forces (1,664 tasks) to float64 rounding (a GPU
    walk sums in a fixed order, so bit for bit is expected but not required), and the
    truncated direct sum to the tree's error. Slow: ~2,600 GPU LET cuts and 64 domains'
    walks."""
    cupy = pytest.importorskip("cupy")
    import cosmo_dask.gravity.tree.graph as tg

    rng = np.random.default_rng(12)
    box, n, rs = 10.0, 8000, 0.4
    x = rng.uniform(0, box, (n, 3))
    x[:2500] = (2.5 + 0.6 * rng.standard_normal((2500, 3))) % box
    m = rng.uniform(0.5, 1.5, n)
    pos = da.from_array(cupy.asarray(x), chunks=(2000, 3), asarray=False)
    mass = da.from_array(cupy.asarray(m), chunks=2000, asarray=False)
    out = {}
    for blocks in (True, False):
        monkeypatch.setattr(tg, "LET_BLOCKS", blocks)
        acc, pot = tg.tree_accelerations(pos, mass, G=1.0, theta=0.5, precision="float64",
                                         box_size=box, rs=rs, n_domains=64)
        names = [k[0] for k in dict(acc.__dask_graph__()) if isinstance(k, tuple)]
        assert sum(n.startswith("gravity-blocklet-") for n in names) == (448 if blocks else 0)
        with dask.config.set(scheduler="synchronous"):
            a, p = dask.compute(acc, pot)
        out[blocks] = cupy.asnumpy(a), cupy.asnumpy(p)
    for q in (0, 1):
        scale = np.abs(out[False][q]).max()
        np.testing.assert_allclose(out[True][q], out[False][q], rtol=0, atol=1e-12 * scale)
    idx = rng.choice(n, 300, replace=False)
    ref_a, _ = reference(x, m, targets=idx, box=box, rs=rs, r_cut=4.5 * rs)
    assert np.median(rel_err(out[True][0][idx], ref_a)) <= 2e-3
