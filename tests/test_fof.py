"""Distributed friends-of-friends against the scipy reference (identical partitions)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from cosmo_dask import Snapshot
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos.fof_graph import fof_labels


def reference_labels(pos, ll, box, min_members, ids=None, min_friends=1):
    """cKDTree pairs + connected components; halos ordered by size, ties by smallest id."""
    n = len(pos)
    tree = cKDTree(pos, boxsize=box) if box else cKDTree(pos)
    pairs = tree.query_pairs(ll, output_type="ndarray")
    if min_friends > 1:
        friends = np.bincount(pairs.ravel(), minlength=n)
        core = friends >= min_friends
        pairs = pairs[core[pairs[:, 0]] & core[pairs[:, 1]]]
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    ids = np.arange(n) if ids is None else ids
    sizes = np.bincount(comp)
    first = np.full(sizes.size, np.iinfo(np.int64).max)
    np.minimum.at(first, comp, ids)
    keep = np.flatnonzero(sizes >= min_members)
    order = keep[np.lexsort((first[keep], -sizes[keep]))]
    halo = np.full(sizes.size, -1)
    halo[order] = np.arange(order.size)
    return halo[comp], sizes[order], first[order]


def clustered(rng, n_uniform, box, sigma, per_blob=60):
    """Uniform background plus blobs centred on every face, edge and corner of the box
    and of the 2x2x2 and 3x3x3 domain grids."""
    fractions = (0.0, 1 / 3, 0.5, 2 / 3)
    centres = [np.array(c) * box for c in itertools.product(fractions, repeat=3)]
    centres += list(rng.random((20, 3)) * box)
    blobs = [c + rng.normal(scale=sigma, size=(per_blob, 3)) for c in centres]
    pos = np.concatenate([rng.random((n_uniform, 3)) * box] + blobs)
    return np.mod(pos, box)


def _check(snap, result, ll, min_members, ids=None, min_friends=1):
    pos = snap.pos.compute()
    labels, sizes, first = reference_labels(pos, ll, snap.box_size, min_members, ids,
                                            min_friends)
    np.testing.assert_array_equal(result.labels.compute(), labels)
    np.testing.assert_array_equal(result.n_members, sizes)
    np.testing.assert_array_equal(result.first_member_id, first)
    return sizes


def test_uniform_64cubed_matches_scipy(rng, client):
    box, n_side = 64.0, 64
    pos = rng.random((n_side**3, 3)) * box
    snap = Snapshot.from_arrays(pos, box_size=box, chunks=2**16)
    result = fof_labels(snap, 0.2, min_members=2, n_domains=8)
    assert result.linking_length == pytest.approx(0.2)
    sizes = _check(snap, result, 0.2, 2)
    assert sizes.size > 100  # the test has groups to get wrong


@pytest.mark.parametrize("n_domains", [1, 8, 27])
@pytest.mark.parametrize("chunks", [997, 4096])
def test_clustered_straddling_every_face_and_corner(rng, client, n_domains, chunks):
    box = 30.0
    pos = clustered(rng, 4000, box, sigma=0.12)
    ids = rng.permutation(len(pos)).astype(np.int64) * 3 + 11
    snap = Snapshot.from_arrays(pos, ids=ids, box_size=box, chunks=chunks)
    ll = 0.25
    result = fof_labels(snap, ll, absolute=True, min_members=5, n_domains=n_domains)
    sizes = _check(snap, result, ll, 5, ids=ids)
    assert sizes.max() > 60  # blobs across faces/corners came out whole


def test_result_does_not_depend_on_worker_count(rng):
    from distributed import Client, LocalCluster

    box = 20.0
    pos = clustered(rng, 3000, box, sigma=0.3)
    snap = Snapshot.from_arrays(pos, box_size=box, chunks=1500)
    results = []
    for workers in (1, 2):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster):
            results.append(fof_labels(snap, 0.3, absolute=True, min_members=3, n_domains=8)
                           .labels.compute())
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("k", [3, 6])
def test_min_friends_variant(rng, client, k):
    box = 25.0
    pos = clustered(rng, 3000, box, sigma=0.4)
    snap = Snapshot.from_arrays(pos, box_size=box, chunks=2000)
    result = fof_labels(snap, 0.3, absolute=True, min_members=3, min_friends=k, n_domains=8)
    _check(snap, result, 0.3, 3, min_friends=k)


def test_isolated_snapshot(rng):
    pos = np.concatenate([rng.normal(size=(3000, 3)) * 3, rng.normal(size=(800, 3)) * 0.2 + 5])
    snap = Snapshot.from_arrays(pos, chunks=1000)
    result = fof_labels(snap, 0.15, absolute=True, min_members=10, n_domains=8)
    _check(snap, result, 0.15, 10)


def test_bad_parameters_and_empty(rng):
    snap = Snapshot.from_arrays(rng.random((1000, 3)), box_size=1.0)
    with pytest.raises(ParameterError, match="linking_length must be a finite number > 0"):
        fof_labels(snap, 0.0)
    with pytest.raises(ParameterError, match="min_members must be an integer >= 2"):
        fof_labels(snap, 0.2, min_members=1)
    with pytest.raises(ParameterError, match="not smaller than the domain side"):
        fof_labels(snap, 0.4, absolute=True, n_domains=27)
    isolated = Snapshot.from_arrays(rng.random((100, 3)))
    with pytest.raises(ParameterError, match="pass absolute=True"):
        fof_labels(isolated, 0.2)
    empty = fof_labels(Snapshot.from_arrays(np.empty((0, 3)), box_size=1.0), 0.2)
    assert empty.n_halos == 0 and empty.labels.shape == (0,)


def test_friend_counts_only_for_an_mcp_centre(rng, client, monkeypatch):
    """``fof`` counts friends only when a result needs them (the MCP): catalogs without
    it never run the counting pass, and runs with and without counts in one session keep
    apart (the need is part of the task keys); catalogs and labels are unchanged."""
    from scipy.spatial import cKDTree

    from cosmo_dask.halos import fof, fof_kernels

    calls = []
    counts = fof_kernels._friend_counts
    monkeypatch.setattr(fof_kernels, "_friend_counts",
                        lambda *a: calls.append(len(a[0])) or counts(*a))
    box, ll = 30.0, 0.25
    pos = clustered(rng, 3000, box, sigma=0.12)
    snap = Snapshot.from_arrays(pos, box_size=box, chunks=1500)
    kw = dict(absolute=True, min_members=5, n_domains=8)
    plain = fof(snap, ll, centers=(), **kw)
    mbp = fof(snap, ll, centers=("mbp",), **kw)
    assert calls == []
    assert "mcp_index" not in plain.catalog and "mcp_index" not in mbp.catalog
    mcp = fof(snap, ll, centers=("mcp",), **kw)
    assert len(calls) == 8  # once per domain
    labels, sizes, _ = reference_labels(pos, ll, box, 5)
    for res in (plain, mbp, mcp):
        np.testing.assert_array_equal(res.labels.compute(), labels)
        np.testing.assert_array_equal(res.catalog["n_members"], sizes)
    for key in ("mass", "center_of_mass", "r_max", "first_member_id"):
        np.testing.assert_array_equal(plain.catalog[key], mcp.catalog[key])
    np.testing.assert_array_equal(mbp.catalog["mbp_index"],
                                  fof(snap, ll, centers=("mbp", "mcp"), **kw)
                                  .catalog["mbp_index"])
    friends = np.array([len(f) - 1 for f in cKDTree(pos, boxsize=box).query_ball_point(pos, ll)])
    cat = mcp.catalog
    for h in range(mcp.n_halos):
        mem = np.flatnonzero(labels == h)
        best = mem[np.lexsort((mem, -friends[mem]))[0]]
        assert cat["mcp_index"].values[h] == best
        assert cat["mcp_friends"].values[h] == friends[best]


@pytest.mark.gpu
@pytest.mark.parametrize("centers", [(), ("mbp",), ("mcp",)])
def test_gpu_catalog_with_and_without_friend_counts(rng, centers):
    """On a GPU snapshot the catalog asks the kernel for friend counts only with the MCP
    (members tables without counts otherwise) and equals the CPU catalog."""
    pytest.importorskip("cupy")
    from cosmo_dask.halos import fof

    box = 30.0
    pos = clustered(rng, 3000, box, sigma=0.12)
    snap = Snapshot.from_arrays(pos, box_size=box, chunks=2000)
    kw = dict(absolute=True, min_members=5, centers=centers, n_domains=8)
    cpu = fof(snap, 0.25, **kw)
    gpu = fof(snap.to_device("gpu"), 0.25, **kw)
    np.testing.assert_array_equal(gpu.labels.compute().get(), cpu.labels.compute())
    assert set(gpu.catalog.data_vars) == set(cpu.catalog.data_vars)
    assert ("mcp_index" in gpu.catalog) == ("mcp" in centers)
    for name in cpu.catalog.data_vars:
        np.testing.assert_allclose(gpu.catalog[name].values, cpu.catalog[name].values,
                                   rtol=1e-10, atol=1e-12, err_msg=name)
