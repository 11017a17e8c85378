"""DensityOctree (the PSE density's result object) against independent references.

Synthetic octrees carry the exact cell averages of a separable quadratic
density, so total masses are checked against the analytic integral; point
samples against a loop over leaves; uniform resamplings against a brute-force
common-refinement grid (every fine cell inside one leaf cell and one uniform
cell, so plain averaging is the exact reference).
"""

from __future__ import annotations

import math
import os

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.density import open_density_octree
from cosmo_dask.density.octree_model import DensityOctree, Leaf
from tests.support.stores import write_raw_store

# rho(x, y, z) = f0(x) f1(y) f2(z), f_d(t) = c0 + c1 t + c2 t^2 (positive on the test regions)
COEF = [(1.0, 0.7, 0.3), (2.0, -0.5, 0.4), (0.5, 0.2, 0.9)]


def _avg(x0, x1, c):
    """Exact mean of c0 + c1 t + c2 t^2 over [x0, x1]."""
    return c[0] + c[1] * (x0 + x1) / 2 + c[2] * (x0 * x0 + x0 * x1 + x1 * x1) / 3


def _integral(x0, x1, c):
    return c[0] * (x1 - x0) + c[1] * (x1**2 - x0**2) / 2 + c[2] * (x1**3 - x0**3) / 3


def _patch(lo, h, p):
    edges = [lo[d] + np.arange(p + 1) * h for d in range(3)]
    f = [_avg(e[:-1], e[1:], COEF[d]) for d, e in enumerate(edges)]
    return f[0][:, None, None] * f[1][None, :, None] * f[2][None, None, :]


def _build(nodes, *, root_lo, root_size, p, box_size=None, chunks=None, attrs=None):
    level = np.array([lev for lev, _ in nodes], dtype=np.int64)
    origin = np.array([o for _, o in nodes], dtype=np.int64)
    patches = np.stack([_patch(np.asarray(root_lo) + np.asarray(o) * root_size / 2**lev,
                               root_size / 2**lev / p, p) for lev, o in nodes])
    data = da.from_array(patches, chunks=chunks or (1, p, p, p))
    tree = DensityOctree(root_lo, root_size, p, level, origin, data, box_size=box_size,
                         attrs=attrs)
    return tree, patches


def _children(lev, o):
    return [(lev + 1, (2 * o[0] + i, 2 * o[1] + j, 2 * o[2] + k))
            for i in (0, 1) for j in (0, 1) for k in (0, 1)]


def _mixed_nodes():
    """7 level-1 leaves, 7 level-2 (children of (1,0,0)), 8 level-3 (children of (3,0,1))."""
    level1 = _children(0, (0, 0, 0))
    level2 = _children(*level1[4])            # level1[4] is (1, (1, 0, 0))
    level3 = _children(*level2[1])            # level2[1] is (2, (2, 0, 1))
    assert level1[4] == (1, (1, 0, 0)) and level2[1] == (2, (2, 0, 1))
    return level1[:4] + level1[5:] + level2[:1] + level2[2:] + level3


ISO = dict(root_lo=(-1.0, 0.5, 2.0), root_size=2.0, p=2)
PER = dict(root_lo=(0.0, 0.0, 0.0), root_size=1.0, p=2, box_size=1.0)


@pytest.fixture
def mixed():
    return _build(_mixed_nodes(), **ISO)


@pytest.fixture
def mixed_periodic():
    return _build(_mixed_nodes(), **PER)


def _fine_grid(tree, patches, m):
    """The piecewise-constant density on an m^3 grid refining every leaf cell (brute force)."""
    fine = np.full((m, m, m), np.nan)
    for i in range(tree.n_leaves):
        lev, o, p = int(tree.level[i]), tree.origin[i], tree.patch_size
        span, rep = m >> lev, m // (p << lev)
        assert rep * (p << lev) == m
        block = patches[i].repeat(rep, 0).repeat(rep, 1).repeat(rep, 2)
        s = [slice(int(o[d]) * span, (int(o[d]) + 1) * span) for d in range(3)]
        fine[s[0], s[1], s[2]] = block
    assert not np.isnan(fine).any()
    return fine


def _uniform_reference(tree, patches, n):
    m = math.lcm(n, tree.effective_resolution)
    fine = _fine_grid(tree, patches, m)
    k = m // n
    return fine.reshape(n, k, n, k, n, k).mean(axis=(1, 3, 5))


def _sample_reference(tree, patches, pts):
    """Loop over leaves: the patch cell whose half-open box contains each point."""
    out = np.full(len(pts), np.nan)
    lo, size, h = tree.leaf_lo, tree.leaf_size, tree.cell_size
    for i in range(tree.n_leaves):
        inside = np.all((pts >= lo[i]) & (pts < lo[i] + size[i]), axis=1)
        c = np.floor((pts[inside] - lo[i]) / h[i]).astype(int)
        out[inside] = patches[i][c[:, 0], c[:, 1], c[:, 2]]
    return out


# ---------------------------------------------------------------------- structure
def test_properties_and_leaves(mixed):
    tree, patches = mixed
    assert tree.n_leaves == 22
    assert tree.max_level == 3
    assert tree.effective_resolution == 16
    assert tree.levels == {1: 7, 2: 7, 3: 8}
    np.testing.assert_array_equal(tree.leaf_size, 2.0 / 2.0**tree.level)
    np.testing.assert_array_equal(tree.cell_size, tree.leaf_size / 2)
    np.testing.assert_array_equal(tree.leaf_lo[0], [-1.0, 0.5, 2.0])
    leaf = tree.leaf(21)
    assert isinstance(leaf, Leaf)
    assert leaf.level == 3 and leaf.origin == (5, 1, 3)
    assert leaf.lo == (-1.0 + 5 * 0.25, 0.5 + 0.25, 2.0 + 3 * 0.25)
    assert leaf.cell_size == 0.125
    np.testing.assert_array_equal(leaf.patch.compute(), patches[21])
    assert [lf.level for lf in tree.leaves] == tree.level.tolist()
    text = repr(tree)
    assert "22 leaves" in text and "{1: 7, 2: 7, 3: 8}" in text and "16^3" in text


def test_total_mass_is_analytic_integral(mixed, mixed_periodic):
    for tree, _ in (mixed, mixed_periodic):
        lo, size = tree.root_lo, tree.root_size
        exact = math.prod(_integral(lo[d], lo[d] + size, COEF[d]) for d in range(3))
        assert tree.total_mass() == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("bad, match", [
    (dict(patch_size=3), "power of two"),
    (dict(patch_size=2.0), "int"),
    (dict(root_size=0.0), "root_size"),
    (dict(root_lo=(0, 0)), "root_lo"),
    (dict(box_size=0.5), "inside the periodic box"),
])
def test_constructor_rejects_bad_parameters(bad, match):
    nodes = _children(0, (0, 0, 0))
    kw = dict(root_lo=(0.0, 0.0, 0.0), root_size=1.0, patch_size=2,
              level=[1] * 8, origin=[o for _, o in nodes], patches=np.ones((8, 2, 2, 2)))
    kw.update(bad)
    with pytest.raises(ParameterError, match=match):
        DensityOctree(kw.pop("root_lo"), kw.pop("root_size"), kw.pop("patch_size"),
                      kw.pop("level"), kw.pop("origin"), kw.pop("patches"), **kw)


def test_constructor_rejects_bad_tilings():
    nodes = _children(0, (0, 0, 0))
    origin = np.array([o for _, o in nodes])
    ones = np.ones((9, 2, 2, 2))

    def make(level, origin, patches):
        return DensityOctree((0, 0, 0), 1.0, 2, level, origin, patches)

    with pytest.raises(ParameterError, match="shape"):
        make([1] * 8, origin, ones)
    with pytest.raises(ParameterError, match="outside"):
        make([1] * 8, np.vstack([origin[:7], [[2, 0, 0]]]), ones[:8])
    with pytest.raises(ParameterError, match="gaps"):
        make([1] * 7, origin[:7], ones[:7])
    with pytest.raises(ParameterError, match="same node"):
        make([1] * 8, np.vstack([origin[:7], origin[:1]]), ones[:8])
    with pytest.raises(ParameterError, match="inside leaf"):  # a leaf and its own child
        make([1] * 8 + [2], np.vstack([origin, [[1, 1, 1]]]), ones)
    with pytest.raises(ParameterError, match="no leaves"):
        make([], np.zeros((0, 3), int), np.zeros((0, 2, 2, 2)))


# ---------------------------------------------------------------------- sample
def test_sample_matches_loop_reference(mixed, rng):
    tree, patches = mixed
    pts = tree.root_lo + rng.random((3000, 3)) * tree.root_size
    np.testing.assert_array_equal(tree.sample(pts), _sample_reference(tree, patches, pts))
    # known points: the centre of cell (1, 0, 1) of the level-3 leaf (5, 1, 3), a dask input
    leaf = tree.leaf(21)
    centre = np.array(leaf.lo) + (np.array([1, 0, 1]) + 0.5) * leaf.cell_size
    assert tree.sample(da.from_array(centre[None, :]))[0] == patches[21][1, 0, 1]
    assert tree.sample(centre).shape == (1,)


def test_sample_isolated_outside_is_nan(mixed):
    tree, patches = mixed
    hi = tree.root_lo + tree.root_size
    pts = np.array([tree.root_lo - 1e-9, hi + [1e-9, 0, 0], [np.nan, 1.0, 2.5], hi])
    values = tree.sample(pts)
    assert np.isnan(values[:3]).all()
    last = int(np.flatnonzero((tree.level == 1) & np.all(tree.origin == 1, axis=1))[0])
    assert values[3] == patches[last][1, 1, 1]  # the root's upper corner belongs to the root
    with pytest.raises(ParameterError, match="shape"):
        tree.sample(np.zeros((4, 2)))


def test_sample_periodic_wraps(mixed_periodic, rng):
    tree, patches = mixed_periodic
    pts = rng.random((2000, 3))
    expected = _sample_reference(tree, patches, pts)
    shifts = rng.integers(-3, 4, size=pts.shape).astype(float)
    np.testing.assert_array_equal(tree.sample(pts + shifts), expected)
    first = int(np.flatnonzero(np.all(tree.origin == 0, axis=1) & (tree.level == 1))[0])
    assert tree.sample(np.array([[-1e-20, 1.0, 2.0]]))[0] == patches[first][0, 0, 0]
    assert np.isnan(tree.sample(np.array([[np.nan, 0.5, 0.5], [np.inf, 0.5, 0.5]]))).all()


def test_sample_computes_only_hit_patches():
    p = 2
    nodes = _children(0, (0, 0, 0))
    good = np.ones((p, p, p))

    def boom():
        raise RuntimeError("this patch must not be computed")

    parts = [da.from_array(good * (i + 1)) if i != 7 else
             da.from_delayed(dask.delayed(boom)(), shape=(p, p, p), dtype=float)
             for i in range(8)]
    tree = DensityOctree((0, 0, 0), 1.0, p, [1] * 8, [o for _, o in nodes], da.stack(parts))
    assert tree.sample(np.array([[0.1, 0.1, 0.1], [0.6, 0.1, 0.1]])).tolist() == [1.0, 5.0]
    with pytest.raises(RuntimeError, match="must not"):
        tree.sample(np.array([[0.9, 0.9, 0.9]]))


# ---------------------------------------------------------------------- to_uniform
def test_to_uniform_uniform_level_tree_is_exact():
    nodes = _children(0, (0, 0, 0))
    tree, patches = _build(nodes, root_lo=(0.5, -2.0, 1.0), root_size=3.0, p=4)
    out = tree.to_uniform(8)
    assert isinstance(out.data, da.Array) and out.dims == ("x", "y", "z")
    reference = _fine_grid(tree, patches, 8)
    np.testing.assert_array_equal(out.values, reference)
    np.testing.assert_allclose(out["x"].values, 0.5 + (np.arange(8) + 0.5) * 3.0 / 8, rtol=1e-15)
    np.testing.assert_allclose(out["y"].values, -2.0 + (np.arange(8) + 0.5) * 3.0 / 8,
                               rtol=1e-15)


@pytest.mark.parametrize("n", [1, 5, 7, 40])
def test_to_uniform_matches_brute_force_and_conserves_mass(mixed, n):
    tree, patches = mixed
    out = tree.to_uniform(n).values
    np.testing.assert_allclose(out, _uniform_reference(tree, patches, n), rtol=1e-12, atol=0)
    mass = out.sum() * (tree.root_size / n) ** 3
    assert mass == pytest.approx(tree.total_mass(), rel=1e-12)


def test_to_uniform_chunking_and_input_chunks_do_not_matter(mixed_periodic):
    tree, patches = mixed_periodic
    reference = _uniform_reference(tree, patches, 7)
    one_chunk = _build(_mixed_nodes(), chunks=(22, 2, 2, 2), **PER)[0]
    odd_chunks = DensityOctree(tree.root_lo, tree.root_size, 2, tree.level, tree.origin,
                               tree.patches.rechunk((5, 1, 2, 1)), box_size=1.0)
    for t, chunks in ((tree, 3), (one_chunk, (2, 7, 4)), (odd_chunks, None)):
        out = t.to_uniform(7, chunks=chunks)
        if chunks is not None:
            assert out.data.chunks == da.core.normalize_chunks(chunks, (7, 7, 7))
        np.testing.assert_allclose(out.values, reference, rtol=1e-12, atol=0)
        assert out.values.sum() * (1 / 7) ** 3 == pytest.approx(t.total_mass(), rel=1e-12)
    pts = np.random.default_rng(3).random((500, 3))
    np.testing.assert_array_equal(odd_chunks.sample(pts), tree.sample(pts))
    np.testing.assert_array_equal(one_chunk.sample(pts), tree.sample(pts))


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_to_uniform_rejects_bad_n(mixed, n):
    with pytest.raises(ParameterError, match="positive integer"):
        mixed[0].to_uniform(n)


# ---------------------------------------------------------------------- store
def test_zarr_round_trip_is_exact(tmp_path, mixed_periodic):
    tree, patches = mixed_periodic
    tree.attrs.update({"strategy": "gather", "n_tets": np.int64(12), "ratio": np.float32(0.5)})
    path = tree.to_zarr(tmp_path / "oct.zarr")
    assert path == str(tmp_path / "oct.zarr")
    back = open_density_octree(path)
    assert isinstance(back.patches, da.Array)
    assert back.patches.chunks[1:] == ((2,), (2,), (2,))
    np.testing.assert_array_equal(back.level, tree.level)
    np.testing.assert_array_equal(back.origin, tree.origin)
    np.testing.assert_array_equal(back.patches.compute(), patches)
    np.testing.assert_array_equal(back.root_lo, tree.root_lo)
    assert (back.root_size, back.patch_size, back.box_size) == (1.0, 2, 1.0)
    assert back.attrs == {"strategy": "gather", "n_tets": 12, "ratio": 0.5}
    assert sorted(os.listdir(path)) == ["level_1", "level_2", "level_3", "zarr.json"]


def test_zarr_round_trip_isolated_unsorted_levels(tmp_path):
    nodes = _mixed_nodes()[::-1]  # finest first: the store regroups by level
    tree, _ = _build(nodes, **ISO)
    back = open_density_octree(tree.to_zarr(tmp_path / "oct.zarr"))
    assert back.box_size is None and back.levels == tree.levels
    order = np.argsort(tree.level, kind="stable")
    np.testing.assert_array_equal(back.origin, tree.origin[order])
    np.testing.assert_array_equal(back.patches.compute(), tree.patches.compute()[order])
    pts = tree.root_lo + np.random.default_rng(1).random((400, 3)) * tree.root_size
    np.testing.assert_array_equal(back.sample(pts), tree.sample(pts))


def test_zarr_write_is_atomic(tmp_path, mixed):
    tree, _ = mixed
    target = tmp_path / "oct.zarr"
    tree.to_zarr(target)
    with pytest.raises(SnapshotError, match="already exists"):
        tree.to_zarr(target)
    tree.to_zarr(target, overwrite=True)

    def fail(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 17:
            raise RuntimeError("disk on fire")
        return block

    broken = DensityOctree(tree.root_lo, tree.root_size, 2, tree.level, tree.origin,
                           tree.patches.map_blocks(fail, dtype=float))
    with pytest.raises(RuntimeError, match="disk on fire"):
        broken.to_zarr(tmp_path / "new.zarr")
    with pytest.raises(RuntimeError, match="disk on fire"):
        broken.to_zarr(target, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["oct.zarr"]  # no partial store, no temporaries
    np.testing.assert_array_equal(open_density_octree(target).patches.compute(),
                                  tree.patches.compute())


def test_open_rejects_other_stores(tmp_path):
    with pytest.raises(SnapshotError, match="no density octree store"):
        open_density_octree(tmp_path / "missing.zarr")
    write_raw_store(tmp_path / "mesh.zarr", {"mass": np.zeros((4, 4, 4))},
                    {"format": "cosmo_dask.mesh", "format_version": 1})
    with pytest.raises(SnapshotError, match="not a cosmo_dask density octree"):
        open_density_octree(tmp_path / "mesh.zarr")
    write_raw_store(tmp_path / "v9.zarr", {}, {"format": "cosmo_dask.density_octree",
                                               "format_version": 9})
    with pytest.raises(SnapshotError, match="format_version"):
        open_density_octree(tmp_path / "v9.zarr")
    write_raw_store(tmp_path / "bad.zarr", {}, {"format": "cosmo_dask.density_octree",
                                                "format_version": 1, "levels": [1]})
    with pytest.raises(SnapshotError, match="malformed"):
        open_density_octree(tmp_path / "bad.zarr")


# ---------------------------------------------------------------------- plot
def test_plot_slice_writes_png(tmp_path, mixed, mixed_periodic):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tree, _ = mixed
    fig = tree.plot_slice(path=tmp_path / "slice.png")
    with open(tmp_path / "slice.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (16, 16)  # the finest leaf-cell resolution
    assert fig.axes[0].get_xlabel() == "x" and fig.axes[0].get_ylabel() == "y"
    plt.close(fig)
    fig, ax = plt.subplots()
    assert mixed_periodic[0].plot_slice(axis=0, position=1.3, resolution=8, ax=ax) is fig
    assert ax.images[0].get_array().shape == (8, 8)
    plt.close(fig)
    with pytest.raises(ParameterError, match="axis"):
        tree.plot_slice(axis=3)
    with pytest.raises(ParameterError, match="outside"):
        tree.plot_slice(position=100.0)
