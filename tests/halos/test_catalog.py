"""Halo catalog and centres against references computed from the scipy partition."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import cKDTree

from cosmo_dask import Snapshot
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos import fof, open_catalog
from tests.support.fof_reference import clustered, reference_labels


def _unwrap(x, ref, box):
    d = x - ref
    return ref + (d - box * np.round(d / box) if box else d)


@pytest.fixture(scope="module")
def halo_data():
    rng = np.random.default_rng(7)
    box = 30.0
    pos = clustered(rng, 3000, box, sigma=0.12)
    n = len(pos)
    vel = rng.normal(size=(n, 3)).astype(np.float32)
    mass = rng.uniform(0.5, 1.5, n)
    ids = rng.permutation(n).astype(np.int64) + 100
    snap = Snapshot.from_arrays(pos, vel, ids, mass, box_size=box, chunks=1500, G=2.0)
    return snap, pos, vel, mass, ids, box


@pytest.mark.parametrize("n_domains", [1, 8, 27])
def test_catalog_matches_reference(halo_data, client, n_domains):
    snap, pos, vel, mass, ids, box = halo_data
    ll, soft = 0.25, 0.03
    result = fof(snap, ll, absolute=True, min_members=5, centers=("mbp", "mcp"),
                 potential_softening=soft, n_domains=n_domains)
    labels, sizes, first = reference_labels(pos, ll, box, 5, ids)
    np.testing.assert_array_equal(result.labels.compute(), labels)
    cat = result.catalog
    np.testing.assert_array_equal(cat["n_members"], sizes)
    np.testing.assert_array_equal(cat["first_member_id"], first)
    friends = np.array([len(f) - 1 for f in cKDTree(pos, boxsize=box).query_ball_point(pos, ll)])
    for h in range(result.n_halos):
        mem = np.flatnonzero(labels == h)
        m = mass[mem]
        x = _unwrap(pos[mem], pos[mem[0]], box)
        com = (m[:, None] * x).sum(0) / m.sum()
        d = np.mod(cat["center_of_mass"].values[h] - com + box / 2, box) - box / 2
        assert np.abs(d).max() < 1e-9
        assert cat["mass"].values[h] == pytest.approx(m.sum(), rel=1e-12)
        np.testing.assert_allclose(cat["velocity"].values[h],
                                   (m[:, None] * vel[mem]).sum(0) / m.sum(), rtol=1e-6)
        r = np.sqrt((((x - com) + 0) ** 2).sum(1))
        assert cat["r_max"].values[h] == pytest.approx(r.max(), rel=1e-9)
        # MCP: most friends, ties by smallest id
        best = mem[np.lexsort((ids[mem], -friends[mem]))[0]]
        assert cat["mcp_index"].values[h] == best
        assert cat["mcp_friends"].values[h] == friends[best]
        # MBP: brute-force float64 potentials with Plummer softening, minimum image
        dx = x[:, None, :] - x[None, :, :]
        r2 = (dx**2).sum(-1) + soft**2
        phi = -2.0 * (m[None, :] / np.sqrt(r2)).sum(1) + 2.0 * m / soft  # drop self term
        i = int(cat["mbp_index"].values[h])
        assert i in set(mem.tolist())
        assert phi[mem.tolist().index(i)] <= phi.min() * (1 - 1e-6) or \
            phi[mem.tolist().index(i)] == pytest.approx(phi.min(), rel=1e-6)
        assert cat["mbp_potential"].values[h] == pytest.approx(phi.min(), rel=1e-6)


def test_store_round_trip(halo_data, tmp_path):
    snap = halo_data[0]
    result = fof(snap, 0.25, absolute=True, min_members=5, centers=("mcp",), n_domains=8)
    result.to_zarr(tmp_path / "h.zarr")
    back = open_catalog(tmp_path / "h.zarr")
    np.testing.assert_array_equal(back.labels.compute(), result.labels.compute())
    for name in result.catalog.data_vars:
        np.testing.assert_array_equal(back.catalog[name].values, result.catalog[name].values)
    assert back.parameters["min_members"] == 5
    with pytest.raises(Exception, match="already exists"):
        result.to_zarr(tmp_path / "h.zarr")


def test_no_centers_and_bad_centers(halo_data):
    snap = halo_data[0]
    result = fof(snap, 0.25, absolute=True, min_members=5, centers=(), n_domains=1)
    assert "mbp_index" not in result.catalog and "mcp_index" not in result.catalog
    with pytest.raises(ParameterError, match="subset of"):
        fof(snap, 0.25, absolute=True, centers=("middle",))


def test_empty_snapshot_gives_an_empty_catalog_with_every_column():
    empty = Snapshot.from_arrays(np.empty((0, 3)), box_size=1.0)
    result = fof(empty, 0.2, centers=("mbp", "mcp"))
    assert result.n_halos == 0 and result.labels.shape == (0,)
    for name in ("n_members", "mass", "center_of_mass", "r_max", "mbp_index", "mbp_position",
                 "mcp_index", "mcp_friends"):
        assert result.catalog[name].sizes["halo"] == 0
