"""Tree gravity as a Dask graph (domains + locally essential trees) against float64
direct summation; independence of chunking, worker count and the domain split."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.gravity.tree.graph import tree_accelerations
from cosmo_dask.models import plummer


def direct_reference(x, m, idx, *, box=None, rs=None, r_cut=None):
    """float64 direct sum (minimum image and truncated kernel when asked) at rows idx."""
    from scipy.special import erfc

    d = x[idx, None, :] - x[None, :, :]
    if box is not None:
        d -= box * np.round(d / box)
    r = np.sqrt((d**2).sum(-1))
    self_pair = r == 0
    r[self_pair] = 1.0
    f = 1.0 / r**3
    p = 1.0 / r
    if rs is not None:
        u = r / (2 * rs)
        f = f * (erfc(u) + 2 * u / np.sqrt(np.pi) * np.exp(-u * u))
        p = p * erfc(u)
        f[r >= r_cut] = 0
        p[r >= r_cut] = 0
    f[self_pair] = 0
    p[self_pair] = 0
    acc = -(m[None, :, None] * d * f[..., None]).sum(1)
    return acc, -(m[None, :] * p).sum(1)


def rel_err(a, ref):
    return np.linalg.norm(a - ref, axis=1) / np.linalg.norm(ref, axis=1)


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
    ref_a, ref_p = direct_reference(x, m, idx)
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
    ref_a, ref_p = direct_reference(x, m, idx, box=box, rs=rs, r_cut=4.5 * rs)
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
    tested in test_gravity_tree_graph_gpu.py)."""
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
    ref_a, _ = direct_reference(x, m, idx)
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
