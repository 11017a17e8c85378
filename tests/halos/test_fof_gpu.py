"""Friends-of-friends and the halo catalog on CuPy-backed snapshots (H100/H200)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask import Snapshot, open_snapshot
from cosmo_dask.halos import fof, fof_labels
from tests.support.fof_reference import clustered, reference_labels

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("n_domains", [1, 8])
def test_gpu_fof_from_zarr_equals_reference(tmp_path, cupy, n_domains):
    rng = np.random.default_rng(3)
    box = 40.0
    pos = clustered(rng, 20000, box, sigma=0.12)
    ids = rng.permutation(len(pos)).astype(np.int64)
    Snapshot.from_arrays(pos, ids=ids, box_size=box, chunks=5000).to_zarr(tmp_path / "s.zarr")
    snap = open_snapshot(tmp_path / "s.zarr", device="gpu")
    res = fof_labels(snap, 0.25, absolute=True, min_members=5, n_domains=n_domains)
    got = res.labels.compute()
    assert isinstance(got, cupy.ndarray)
    labels, sizes, first = reference_labels(pos, 0.25, box, 5, ids)
    np.testing.assert_array_equal(got.get(), labels)
    np.testing.assert_array_equal(res.n_members, sizes)
    np.testing.assert_array_equal(res.first_member_id, first)


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
