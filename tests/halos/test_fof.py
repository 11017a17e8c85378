"""Distributed friends-of-friends against the scipy reference (identical partitions)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import cKDTree

from cosmo_dask import Snapshot, open_snapshot
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos import fof, fof_labels
from tests.support.devices import DEVICES, array_module, to_host
from tests.support.fof_reference import clustered, reference_labels


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


@pytest.mark.parametrize("n_domains", [8, (2, 1, 1)])
def test_groups_at_a_face_whose_ghost_copies_link_nothing_new(rng, n_domains):
    """Chains at the face x = 5 of a 10-box: one crossing it (6 members on each side, 12
    in all, min_members 12), one wholly in the lower domain whose last members are ghost
    copies in the upper one (10 members, min_members 10: those copies form a group of
    ghosts there, which links nothing new), one crossing the periodic face x = 0, and a
    uniform background in a bar clear of them; the partition equals scipy's."""
    box, ll = 10.0, 0.15
    chains = [np.c_[4.45 + 0.1 * np.arange(12), np.full(12, 2.5), np.full(12, 2.5)],
              np.c_[3.97 + 0.1 * np.arange(10), np.full(10, 7.5), np.full(10, 2.5)],
              np.c_[(9.55 + 0.1 * np.arange(10)) % box, np.full(10, 2.5), np.full(10, 7.5)]]
    background = rng.random((400, 3)) * [box, 2.0, 2.0] + [0.0, 4.0, 4.0]  # clear of them
    pos = np.concatenate(chains + [background])
    snap = Snapshot.from_arrays(pos, box_size=box, chunks=1000)
    for min_members in (10, 12):
        result = fof_labels(snap, ll, absolute=True, min_members=min_members,
                            n_domains=n_domains)
        sizes = _check(snap, result, ll, min_members)
        assert sizes.tolist() == ([12, 10, 10] if min_members == 10 else [12])


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


# -------------------- on the GPU (formerly tests/test_gpu_halos.py)
# Friends-of-friends and the halo catalog on CuPy-backed snapshots (H100/H200).


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_domains", [1, 8])
def test_fof_from_zarr_equals_reference(tmp_path, device, n_domains):
    xp = array_module(device)
    rng = np.random.default_rng(3)
    box = 40.0
    pos = clustered(rng, 20000, box, sigma=0.12)
    ids = rng.permutation(len(pos)).astype(np.int64)
    Snapshot.from_arrays(pos, ids=ids, box_size=box, chunks=5000).to_zarr(tmp_path / "s.zarr")
    snap = open_snapshot(tmp_path / "s.zarr", device=device)
    res = fof_labels(snap, 0.25, absolute=True, min_members=5, n_domains=n_domains)
    got = res.labels.compute()
    assert isinstance(got, xp.ndarray)
    labels, sizes, first = reference_labels(pos, 0.25, box, 5, ids)
    np.testing.assert_array_equal(to_host(got), labels)
    np.testing.assert_array_equal(res.n_members, sizes)
    np.testing.assert_array_equal(res.first_member_id, first)


@pytest.mark.gpu
def test_gpu_catalog_equals_cpu_catalog(tmp_path, cupy):
    rng = np.random.default_rng(5)
    box = 30.0
    pos = clustered(rng, 3000, box, sigma=0.12)
    n = len(pos)
    snap = Snapshot.from_arrays(pos, rng.normal(size=(n, 3)), np.arange(n),
                                rng.uniform(0.5, 1.5, n), box_size=box, chunks=2000)
    cpu = fof(snap, 0.25, absolute=True, min_members=5, centers=("mbp", "mcp"), n_domains=8)
    gpu = fof(snap.to_device("gpu"), 0.25, absolute=True, min_members=5, centers=("mbp", "mcp"),
              n_domains=8)
    np.testing.assert_array_equal(gpu.labels.compute().get(), cpu.labels.compute())
    for name in cpu.catalog.data_vars:
        np.testing.assert_allclose(gpu.catalog[name].values, cpu.catalog[name].values,
                                   rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("n_domains", [1, 8])
@pytest.mark.parametrize("min_friends", [1, 3])
def test_gpu_fof_dense_spheres_across_faces(cupy, n_domains, min_friends):
    """Dense Plummer spheres (fine cells of dozens of points) cut by the periodic faces
    and by the domain faces at box/2: the GPU graph (dense-cell kernel, per-group rows)
    equals the scipy reference."""
    rng = np.random.default_rng(11)
    box = 16.0
    parts = [rng.random((20_000, 3)) * box]
    for centre, n, a in (((0.0, 5.0, 5.0), 3000, 0.15), ((8.0, 8.0, 3.0), 3000, 0.1),
                         ((0.0, 8.0, 0.0), 2000, 0.1), ((11.0, 4.0, 12.0), 2000, 0.3)):
        u = rng.uniform(0.0, 0.98, n)
        r = a / np.sqrt(u ** (-2 / 3) - 1)
        v = rng.normal(size=(n, 3))
        parts.append(np.asarray(centre) + v * (r / np.linalg.norm(v, axis=1))[:, None])
    pos = np.mod(np.concatenate(parts), box).astype(np.float32)
    pos[pos >= box] = 0.0
    ids = rng.permutation(len(pos)).astype(np.int64)
    snap = Snapshot.from_arrays(pos, ids=ids, box_size=box, chunks=7000).to_device("gpu")
    res = fof_labels(snap, 0.2, absolute=True, min_members=5, min_friends=min_friends,
                     n_domains=n_domains)
    labels, sizes, first = reference_labels(pos.astype(np.float64), 0.2, box, 5, ids,
                                            min_friends)
    assert sizes[0] > 1000
    np.testing.assert_array_equal(res.labels.compute().get(), labels)
    np.testing.assert_array_equal(res.n_members, sizes)
    np.testing.assert_array_equal(res.first_member_id, first)
