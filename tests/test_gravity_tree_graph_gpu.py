"""Tree gravity graph on CuPy chunks: the GPU tree per domain, CuPy out."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from test_gravity_tree_graph import direct_reference, rel_err

from cosmo_dask.gravity.tree.graph import tree_accelerations
from cosmo_dask.models import plummer

pytestmark = pytest.mark.gpu


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
    ref_a, ref_p = direct_reference(x, m, idx)
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
    ref_a, ref_p = direct_reference(x, m, idx)
    for nd in (1, 8):
        err = rel_err(out[nd][0][idx], ref_a)
        assert np.median(err) <= 5e-4 and np.percentile(err, 99) <= 5e-3, nd
    diff = rel_err(out[8][0], out[1][0])
    assert np.median(diff) <= 5e-4 and np.percentile(diff, 99) <= 5e-3
    assert np.median(np.abs(out[8][1] / out[1][1] - 1)) <= 1e-4


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
    ref_a, _ = direct_reference(x, m, idx, box=box, rs=rs, r_cut=4.5 * rs)
    for nd in (1, 8):
        err = rel_err(out[nd][0][idx], ref_a)
        assert np.median(err) <= 2e-3 and np.percentile(err, 99) <= 2e-2, (nd, np.median(err))
    diff = rel_err(out[8][0], out[1][0])
    assert np.median(diff) <= 2e-3 and np.percentile(diff, 99) <= 2e-2


def test_gpu_domain_trees_and_lets_travel_as_device_buffers():
    """A GPU domain tree and a LET tell dask their size and serialize, in the "cuda"
    family (what UCX sends), as device buffers that come back as the same CuPy arrays."""
    cupy = pytest.importorskip("cupy")
    from dask.sizeof import sizeof
    from distributed.protocol import deserialize, serialize

    from cosmo_dask.gravity.tree.let_gpu import gpu_domain_tree, gpu_let

    rng = np.random.default_rng(4)
    n, box = 50_000, 10.0
    pos = cupy.asarray(rng.random((n, 3)) * box)
    mass = cupy.full(n, 1.0 / n)
    opts = {"G": 1.0, "theta": 0.5, "softening": 0.0, "softening_kernel": "plummer",
            "precision": "float64", "box_size": box, "rs": 0.3, "r_cut": 1.35,
            "max_leaf": 32, "max_group": 32}
    dt = gpu_domain_tree(pos, mass, cupy.arange(n), opts)
    assert sizeof(dt) > dt.pos64.nbytes + dt.tree.pos.nbytes + dt.index.nbytes
    let = gpu_let(dt, np.array([0.0, 0.0, 0.0]), np.array([2.0, 10.0, 10.0]), opts)
    assert let is not None and sizeof(let) >= let.pos.nbytes + let.lo.nbytes
    for obj in (dt, let):
        header, frames = serialize(obj, serializers=("cuda",))
        assert header["serializer"] == "cuda"
        back = deserialize(header, frames)
        assert type(back) is type(obj)
    assert isinstance(back.pos, cupy.ndarray)
    cupy.testing.assert_array_equal(back.pos, let.pos)
    cupy.testing.assert_array_equal(back.first_child, let.first_child)


@pytest.mark.slow
def test_gpu_treepm_block_lets_equal_pair_lets(monkeypatch):
    """TreePM's short range on 64 GPU domains: LETs cut for neighbouring 2x2x2 blocks (896
    LET tasks) give the per-pair LETs' forces (1,664 tasks) to float64 rounding (a GPU
    walk sums in a fixed order, so bit for bit is expected but not required), and the
    truncated direct sum to the tree's error. Slow: ~2,600 GPU LET cuts (each syncs
    with the host per level)."""
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
    ref_a, _ = direct_reference(x, m, idx, box=box, rs=rs, r_cut=4.5 * rs)
    assert np.median(rel_err(out[True][0][idx], ref_a)) <= 2e-3
