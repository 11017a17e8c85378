"""The GPU LET cut (:func:`cosmo_dask.gravity.tree.let_gpu.let_cut`, one launch of
``let.cu``'s ``let_mark``) against a level-by-level walk written here in NumPy: the same
nodes in the same order, the same children, particle ranges and particles, array for array.

On the host the kernel text runs through ``tests/support/cuda_host.py`` (serial, reversed
and concurrent thread orders) over a CPU-built octree (the one layout); on a GPU,
``domain_let_gpu`` is compared with the walk over the same tree copied to the host."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cosmo_dask.gravity.tree.let_gpu import LET_MARGIN, let_cut


def _level_walk(tree, box_lo, box_hi, st, m=LET_MARGIN):
    """The LET by levels: test the frontier against the box, keep the children of opened
    inner nodes as the next frontier, copy the particles of opened leaves."""
    box_lo, box_hi = np.asarray(box_lo, np.float64), np.asarray(box_hi, np.float64)
    c, hw = 0.5 * (box_lo + box_hi), 0.5 * (box_hi - box_lo)

    def wrap(d):
        return d - st.box * np.rint(d * (1.0 / st.box)) if st.box > 0 else d

    frontier = np.zeros(1, dtype=np.int64)
    src, first_child, n_child, start, count, parts = [], [], [], [], [], []
    n_off = p_off = 0
    root_dropped = None
    rc = st.r_cut
    while frontier.size:
        f = frontier
        dc = np.abs(wrap(tree.com[f] - c))
        dmin = np.sqrt((np.maximum(dc - hw, 0.0) ** 2).sum(axis=1))
        dmax = np.sqrt(((dc + hw) ** 2).sum(axis=1))
        half = 0.5 * (tree.hi[f] - tree.lo[f])
        bc = np.abs(wrap(0.5 * (tree.lo[f] + tree.hi[f]) - c))
        gap2 = (np.maximum(bc - hw - half, 0.0) ** 2).sum(axis=1)
        far2 = ((bc + hw + half) ** 2).sum(axis=1)
        b = tree.bmax[f]
        if st.trunc:
            drop = (gap2 >= rc * rc * (1 + m)) | (dmin - b >= rc * (1 + m))
        else:
            drop = np.zeros(f.shape, dtype=bool)
        accept = (~drop & (dmin * st.theta > b * (1 + m)) & (b < st.bcap)
                  & (dmin - b > st.h_guard + m * dmin))
        if st.trunc:
            accept &= (far2 < rc * rc * (1 - m)) | (dmax + b < rc * (1 - m))
        if root_dropped is None:
            root_dropped = bool(drop[0])
        opened = ~drop & ~accept
        leaf = tree.first_child[f] < 0
        inner, leaves = opened & ~leaf, opened & leaf
        nch = np.where(inner, tree.n_child[f], 0).astype(np.int64)
        cnt = np.where(leaves, tree.count[f], 0).astype(np.int64)
        nxt = n_off + f.size
        src.append(f)
        first_child.append(np.where(inner, nxt + np.cumsum(nch) - nch, -1))
        n_child.append(nch)
        start.append(np.where(leaves, p_off + np.cumsum(cnt) - cnt, 0))
        count.append(cnt)
        parts += [np.arange(s, s + k) for s, k in zip(tree.start[f][leaves], cnt[leaves],
                                                       strict=True)]
        frontier = np.concatenate([np.arange(a, a + k) for a, k in
                                   zip(tree.first_child[f][inner], nch[inner], strict=True)]
                                  + [np.zeros(0, np.int64)]).astype(np.int64)
        n_off, p_off = nxt, p_off + int(cnt.sum())
    if root_dropped:
        return None
    cat = np.concatenate
    return (cat(src), cat(first_child), cat(n_child), cat(start), cat(count),
            cat(parts + [np.zeros(0, np.int64)]))


def _same(cut, ref):
    assert (cut is None) == (ref is None)
    if ref is None:
        return 0
    names = ("src", "first_child", "n_child", "start", "count", "pidx")
    for name, a, b in zip(names, cut, ref, strict=True):
        a = a.get() if hasattr(a, "get") else np.asarray(a)
        np.testing.assert_array_equal(a.astype(np.int64), b, err_msg=name)
    return len(ref[0])


def _clumpy(n, box, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, box, (n, 3))
    k = n // 3
    x[:k] = (0.3 * box + 0.05 * box * rng.standard_normal((k, 3))) % box
    return x


def _settings(*, box=0.0, theta=0.5, rs=None, r_cut=0.0, softening=0.0):
    """The fields of the walk settings that the cut reads (as ``kernel_settings`` sets
    them: TreePM's ``bcap`` and ``h_guard`` when truncated)."""
    from cosmo_dask.gravity.parameters import TRUNC_OPEN_SPLITS

    trunc = rs is not None
    return SimpleNamespace(box=box, theta=theta, trunc=trunc, r_cut=r_cut,
                           bcap=theta * TRUNC_OPEN_SPLITS * rs if trunc else np.inf,
                           h_guard=2.8 * softening if trunc else 0.0)


CASES = {
    # periodic TreePM short range: boxes inside, across the wrap, far, and the whole box
    "treepm": (dict(box=10.0, rs=0.4, r_cut=1.8, softening=0.01),
               [([0, 0, 0], [5, 10, 10]), ([8.5, 1, 1], [9.9, 3, 3]),
                ([2, 2, 2], [2.5, 2.5, 2.5]), ([0, 0, 0], [10, 10, 10])]),
    # open, Newtonian: a box beside the particles, one far away (only the root survives)
    "open": (dict(theta=0.6),
             [([0, 0, 0], [3, 10, 10]), ([40, 40, 40], [41, 41, 41])]),
}


def _cpu_tree(x, seed):
    from cosmo_dask.spatial.octree import build_octree

    m = np.random.default_rng(seed).uniform(0.5, 1.5, len(x))
    return build_octree(x, m, max_leaf=16, max_group=32)


@pytest.mark.parametrize("order", ["serial", "reversed", "concurrent"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_let_cut_kernel_text_on_host(case, order):
    """The kernel text on the host gives the level walk's LET, whatever the thread order;
    a box beyond ``r_cut`` of everything gives None, as the walk does."""
    from tests.support import cuda_host

    if cuda_host.compiler() is None:
        pytest.skip("needs g++")
    mark = cuda_host.host_kernels("let", (), order)["let_mark"]
    kw, boxes = CASES[case]
    st = _settings(**kw)
    tree = _cpu_tree(_clumpy(6000, 10.0, 3), 3)
    sizes = [_same(let_cut(np, mark, tree, lo, hi, st),
                   _level_walk(tree, lo, hi, st)) for lo, hi in boxes]
    # the cases cut real trees: every LET holds nodes, and most boxes prune some
    total = tree.first_child.shape[0]
    assert min(sizes) > 0 and sum(s < total for s in sizes) >= len(sizes) // 2, sizes
    if case == "treepm":   # a box the cut drops whole: nothing beyond r_cut is shipped
        far = _settings(box=30.0, rs=0.4, r_cut=1.8)
        assert let_cut(np, mark, tree, [20, 20, 20], [21, 21, 21], far) is None
        assert _level_walk(tree, [20, 20, 20], [21, 21, 21], far) is None


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_let_cut_on_the_gpu_equals_the_level_walk(case):
    """``domain_let_gpu`` on a GPU tree ships exactly the nodes, children and particles of
    the level walk over the same tree (copied to the host)."""
    cp = pytest.importorskip("cupy")
    from cosmo_dask.gravity.tree.let_gpu import domain_let_gpu, domain_tree_gpu

    kw, boxes = CASES[case]
    x = _clumpy(50_000, 10.0, 5)
    opts = {"G": 1.0, "theta": kw.get("theta", 0.5), "softening": kw.get("softening", 0.0),
            "softening_kernel": "plummer", "precision": "float32",
            "box_size": kw.get("box"), "rs": kw.get("rs"), "r_cut": kw.get("r_cut"),
            "max_leaf": 16, "max_group": 64}
    if opts["rs"] is None:
        opts["r_cut"] = None
    dt = domain_tree_gpu(cp.asarray(x), cp.full(len(x), 1.0 / len(x)), cp.arange(len(x)), opts)
    host = SimpleNamespace(**{k: cp.asnumpy(getattr(dt.tree, k)) for k in
                              ("com", "lo", "hi", "bmax", "first_child", "n_child", "count",
                               "start")})
    st = _settings(**kw)
    for lo, hi in boxes:
        ref = _level_walk(host, lo, hi, st)
        let = domain_let_gpu(dt, np.asarray(lo, float), np.asarray(hi, float), opts)
        assert (let is None) == (ref is None)
        if ref is None:
            continue
        src, first_child, n_child, start, count, pidx = ref
        for name, want in (("first_child", first_child), ("n_child", n_child),
                           ("start", start), ("count", count)):
            np.testing.assert_array_equal(cp.asnumpy(getattr(let, name)).astype(np.int64),
                                          want, err_msg=name)
        np.testing.assert_array_equal(cp.asnumpy(let.lo), host.lo[src])
        np.testing.assert_array_equal(cp.asnumpy(let.pos), cp.asnumpy(dt.pos64)[pidx])
