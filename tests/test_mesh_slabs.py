"""The particle <-> mesh-slab layout (cosmo_dask.spatial.slabs): routing against the planes
each assignment kernel touches (a NumPy transcription of the kernels' weights), the way
back against whole-mesh interpolation, graph shape, and the mesh path on a real
two-process cluster."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.errors import ParameterError
from cosmo_dask.spatial.fft import slab_chunks
from cosmo_dask.spatial.slabs import SlabExchange, route_rows, slab_layout

ORDERS = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}


def touched_planes(x, n, box, order, shift):
    """Planes (axis 0) with a nonzero weight: the kernels' leftmost node and order,
    written from paint_kernels' convention (u = x/H - 1/2 + shift, wrapped)."""
    u = np.mod(x * (n / box) - 0.5 + shift, n)
    if order in (1, 3):
        i0 = np.floor(u + 0.5).astype(np.int64) - (order - 1) // 2
    else:
        i0 = np.floor(u).astype(np.int64) - (order - 1) // 2
    return [(i0 + a) % n for a in range(order)]


def _positions(rng, m, n, box):
    """Random positions plus particles exactly on nodes, on cell edges and at the box ends."""
    pos = rng.uniform(0, box, (m, 3))
    h = box / n
    edge = np.arange(n) * h
    node = (np.arange(n) + 0.5) * h
    special = np.concatenate([edge, node, [0.0, np.nextafter(box, 0), box - 1e-12 * box]])
    pos[:special.size, 0] = special
    return pos


@pytest.mark.parametrize("n, n_slabs", [(12, 1), (12, 2), (12, 5), (12, 12), (10, 3), (5, 2)])
@pytest.mark.parametrize("scheme", list(ORDERS))
@pytest.mark.parametrize("shifts", [(0.0,), (0.0, 0.5), (0.5,)])
def test_route_covers_every_touched_plane_once(rng, n, n_slabs, scheme, shifts):
    box = 7.0
    order = ORDERS[scheme]
    pos = _positions(rng, 400, n, box)
    layout = slab_layout(n, n_slabs, box, order=order, shifts=shifts)
    assert layout.chunks == slab_chunks(n, n_slabs)
    rows, bounds = route_rows(pos, layout)
    plane_slab = layout.plane_slab()
    sent = [set() for _ in range(len(pos))]
    for s in range(layout.n_slabs):
        r = rows[bounds[s]:bounds[s + 1]]
        assert np.all(np.diff(r) > 0)  # each particle once per slab, chunk order kept
        for i in r:
            sent[i].add(s)
    for shift in shifts:
        planes = touched_planes(pos[:, 0], n, box, order, shift)
        for p in planes:
            need = plane_slab[p]
            assert all(int(s) in sent[i] for i, s in enumerate(need))
    # with the margin a particle reaches at most the slabs of below + above + 1 planes
    assert max(len(s) for s in sent) <= min(layout.n_slabs, layout.below + layout.above + 1)


def test_route_sends_nonfinite_positions_to_one_slab():
    layout = slab_layout(8, 4, 1.0, order=2)
    pos = np.array([[np.nan, 0.5, 0.5], [0.95, 0.1, 0.1], [np.inf, 0, 0]])
    rows, bounds = route_rows(pos, layout)
    first = rows[bounds[0]:bounds[1]]
    assert 0 in first and 2 in first
    assert np.count_nonzero(rows == 0) == 1 and np.count_nonzero(rows == 2) == 1


def test_layout_bad_input():
    with pytest.raises(ParameterError, match="order"):
        slab_layout(8, 2, 1.0, order=5)
    with pytest.raises(ParameterError, match="shifts"):
        slab_layout(8, 2, 1.0, order=2, shifts=(np.nan,))


@pytest.mark.parametrize("n_slabs", [1, 2, 3, 7])
@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_interpolate_matches_whole_mesh(rng, n_slabs, shift):
    """The way back: slab parts gathered per chunk equal the whole-mesh CIC
    interpolation (pm_kernels, itself the transpose of the deposit: test_pm.py)."""
    from cosmo_dask.gravity.pm import _interp_piece
    from cosmo_dask.gravity.pm_kernels import cic_interpolate_numpy

    n, box = 14, 3.0
    meshes = rng.standard_normal((2, n, n, n))
    pos = _positions(rng, 1000, n, box)
    ref = cic_interpolate_numpy(pos, meshes, box, shift)
    layout = slab_layout(n, n_slabs, box, order=2, shifts=(0.0, 0.5))
    p = da.from_array(pos, chunks=(230, 3))
    ex = SlabExchange(p, 1.0, layout)
    slabs = [da.from_array(m, chunks=(layout.chunks, n, n)) for m in meshes]
    import functools

    out = ex.interpolate([(functools.partial(_interp_piece, box=box, shift=shift), slabs, 2)],
                         name="test-interp", dtype=np.float64)
    assert out.chunks == (p.chunks[0], (2,))
    np.testing.assert_allclose(out.compute(), ref, rtol=0, atol=1e-13 * np.abs(ref).max())


def test_graph_size_and_names():
    n, n_slabs = 16, 4
    pos = da.from_array(np.random.default_rng(0).random((1000, 3)), chunks=(250, 3))
    from cosmo_dask.density.paint import paint_meshes

    meshes, ex = paint_meshes(pos, 1.0, n_mesh=n, box_size=1.0, scheme="cic", shifts=(0.0,),
                              dtype=np.float64, slabs=n_slabs)
    mesh = meshes[0]
    assert mesh.chunks == (slab_chunks(n, n_slabs), (n,), (n,))
    keys = dict(mesh.__dask_graph__())
    kinds = {str(k[0]).rsplit("-", 1)[0] for k in keys if isinstance(k, tuple)}
    assert {"mesh-split", "mesh-piece", "mesh-paint"} <= kinds
    n_split = sum(1 for k in keys if isinstance(k, tuple) and str(k[0]).startswith("mesh-split"))
    n_paint = sum(1 for k in keys if isinstance(k, tuple) and str(k[0]).startswith("mesh-paint"))
    assert n_split == 4  # one per chunk
    assert n_paint >= n_slabs  # one per slab (a few per slab when threads outnumber slabs)


def test_mesh_path_on_two_worker_processes():
    """Painting, P(k) and PM in 3 slabs on a real two-process LocalCluster (graphs and
    pieces pickled between processes) equal the threaded scheduler's, bit for bit."""
    from distributed import Client, LocalCluster

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density import paint
    from cosmo_dask.gravity.pm import pm_accelerations

    rng = np.random.default_rng(4)
    pos = rng.uniform(0, 10.0, (6000, 3))
    mass = rng.uniform(0.5, 2.0, 6000)

    def run():
        p = da.from_array(pos, chunks=(1500, 3))
        m = da.from_array(mass, chunks=1500)
        mesh = paint(p, m, n_mesh=12, box_size=10.0, scheme="tsc", slabs=3)
        ds = power_spectrum(p, mass=m, n_mesh=12, box_size=10.0, slabs=3)
        acc, pot = pm_accelerations(p, m, G=1.0, box_size=10.0, n_mesh=12, r_split=0.5,
                                    slabs=3)
        return (*dask.compute(mesh, acc, pot), ds["power"].values)

    with dask.config.set(scheduler="threads"):
        local = run()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster):
        remote = run()
    for a, b in zip(local, remote, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gpu_memory_check_counts_interlaced_meshes_and_transpose(monkeypatch):
    """One 80 GiB GPU: a 2048^3 float32 mesh (32 GiB) fits with its transpose copy (1.7
    meshes, measured 1.69 on an H100), two interlaced ones do not (they ran out of its
    memory): refused before any work, naming what fits. CPU workers spill, so there
    interlaced meshes count as one."""
    import importlib

    paint = importlib.import_module("cosmo_dask.density.paint")

    monkeypatch.setattr(paint, "memory_per_worker", lambda gpu: (80 * 2**30, "GPU"))
    monkeypatch.setattr(paint, "worker_count", lambda: 1)
    assert paint.mesh_slabs(2048, np.float32, gpu=True, what="P(k)", meshes=1) >= 1
    with pytest.raises(ParameterError, match=r"n_mesh=2048 needs at least 86\.4 GiB.*"
                                             r"the largest n_mesh that fits is about 1[0-9]{3}"):
        paint.mesh_slabs(2048, np.float32, gpu=True, what="P(k)", meshes=2)
    monkeypatch.setattr(paint, "memory_per_worker", lambda gpu: (40 * 2**30, "worker"))
    monkeypatch.setattr(paint, "worker_count", lambda: 2)
    assert paint.mesh_slabs(2048, np.float32, gpu=False, what="P(k)", meshes=2) >= 1
