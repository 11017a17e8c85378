"""The particle <-> mesh-slab layout (cosmo_dask.spatial.slabs): routing against the planes
each assignment kernel touches (a NumPy transcription of the kernels' weights), the way
back against whole-mesh interpolation, graph shape, and the mesh path on a real
two-process cluster."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
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

    out = ex.interpolate([(functools.partial(_interp_piece, box=box, shifts=(shift,)), slabs, 2)],
                         name="test-interp", dtype=np.float64)
    assert out.chunks == (p.chunks[0], (2,))
    np.testing.assert_allclose(out.compute(), ref, rtol=0, atol=1e-13 * np.abs(ref).max())


def test_graph_size_and_names():
    n, n_slabs = 16, 4
    pos = da.from_array(np.random.default_rng(0).random((1000, 3)), chunks=(250, 3))
    from cosmo_dask.density.painting import paint_meshes

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


def _mesh_path(pos, mass, chunks, slabs, *, mesh_scheme="tsc", n=12, box=10.0):
    """Painting, P(k) and PM (interlaced, a split) of the same particles: four arrays."""
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density import paint
    from cosmo_dask.gravity.pm import pm_accelerations

    cpu = isinstance(pos, np.ndarray)  # CuPy arrays: chunks kept as they are
    p = da.from_array(pos, chunks=(chunks, 3), asarray=None if cpu else False)
    m = da.from_array(mass, chunks=chunks, asarray=None if cpu else False)
    mesh = paint(p, m, n_mesh=n, box_size=box, scheme=mesh_scheme, slabs=slabs)
    ds = power_spectrum(p, mass=m, n_mesh=n, box_size=box, slabs=slabs)
    acc, pot = pm_accelerations(p, m, G=1.0, box_size=box, n_mesh=n, r_split=0.5,
                                slabs=slabs)
    return (*dask.compute(mesh, acc, pot), ds["power"].values)


def _kinds(arr) -> set:
    """The task kinds (key names less their tokens) of a collection's graph."""
    return {"-".join(p for p in str(k[0] if isinstance(k, tuple) else k).split("-")
                     if not (len(p) >= 8 and all(c in "0123456789abcdef" for c in p)))
            for k in dict(arr.__dask_graph__())}


def test_mesh_path_on_two_worker_processes(monkeypatch):
    """Painting, P(k) and PM in 3 slabs on a real two-process LocalCluster (graphs and
    pieces pickled between processes) equal the threaded scheduler's, bit for bit, and
    so does the two-stage exchange (forced) on both."""
    from distributed import Client, LocalCluster

    import cosmo_dask.spatial.domains as sd

    rng = np.random.default_rng(4)
    pos = rng.uniform(0, 10.0, (6000, 3))
    mass = rng.uniform(0.5, 2.0, 6000)
    runs, default = {}, sd.TWO_STAGE_PAIRS
    for two_stage in (False, True):
        monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0 if two_stage else default)
        with dask.config.set(scheduler="threads"):
            runs["local", two_stage] = _mesh_path(pos, mass, 1000, 3)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=":0") as cluster, Client(cluster):
            runs["remote", two_stage] = _mesh_path(pos, mass, 1000, 3)
    for key, got in runs.items():
        for a, b in zip(runs["local", False], got, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=str(key))


@pytest.mark.parametrize("n_rows, chunks, n, slabs", [
    (6000, 1500, 12, 3), (6000, 700, 12, 5), (6000, 6000, 12, 4), (6000, 400, 12, 12),
    (5000, 333, 10, 7), (3000, 250, 9, 2)])
def test_two_stage_exchange_is_bit_for_bit_one_stage(monkeypatch, n_rows, chunks, n, slabs):
    """The two-stage exchange (chunks and slabs in groups of about their square roots,
    forced at small sizes) gives the one-stage mesh, P(k) and PM forces bit for bit,
    for even and uneven chunkings and slab counts; both against float64 references."""
    import cosmo_dask.spatial.domains as sd
    from cosmo_dask.density import paint
    from cosmo_dask.density.paint_kernels import paint_numpy

    rng = np.random.default_rng(n_rows + chunks + slabs)
    box = 10.0
    pos = _positions(rng, n_rows, n, box)
    mass = rng.uniform(0.5, 2.0, n_rows)
    with dask.config.set(scheduler="threads"):
        one = _mesh_path(pos, mass, chunks, slabs, n=n, box=box)
        monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
        kinds = _kinds(paint(da.from_array(pos, chunks=(chunks, 3)), 1.0, n_mesh=n,
                             box_size=box, slabs=slabs))
        assert "mesh-regroup" in kinds  # the two-stage graph
        two = _mesh_path(pos, mass, chunks, slabs, n=n, box=box)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    ref = paint_numpy(pos, mass, n, box, "tsc")
    np.testing.assert_allclose(two[0], ref, rtol=0, atol=1e-13 * ref.max())
    assert abs(two[0].sum() - mass.sum()) <= 1e-12 * mass.sum()


@pytest.mark.parametrize("groups", [2, 3, 4])
def test_two_stage_deposit_in_runs_of_chunks(monkeypatch, groups):
    """A slab's chunks painted in several runs (fewer slabs than threads) whose bounds
    cut a group of chunks: the two-stage deposit gives the one-stage slabs bit for bit."""
    import cosmo_dask.spatial.domains as sd
    from cosmo_dask.density.paint_kernels import paint_numpy
    from cosmo_dask.density.painting import _deposit_block

    rng = np.random.default_rng(groups)
    n, box = 10, 5.0
    pos = _positions(rng, 4000, n, box)
    mass = rng.uniform(0.5, 2.0, 4000)
    p = da.from_array(pos, chunks=(400, 3))  # 10 chunks: groups [0, 2) [2, 5) [5, 7) [7, 10)
    m = da.from_array(mass, chunks=400)
    kw = dict(name="t-paint", dtype=np.float64, groups=groups, n=n, box=box, scheme="cic",
              shift=0.0, mdtype=np.dtype(np.float64), mass_scalar=0.0)
    layout = slab_layout(n, 3, box, order=2)
    one = SlabExchange(p, m, layout).deposit(_deposit_block, **kw).compute(scheduler="threads")
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    ex = SlabExchange(p, m, layout)
    assert ex.two_stage and len(sd._groups(10)) == 4
    two = ex.deposit(_deposit_block, **kw).compute(scheduler="threads")
    np.testing.assert_array_equal(one, two)
    ref = paint_numpy(pos, mass, n, box, "cic")
    np.testing.assert_allclose(two, ref, rtol=0, atol=1e-13 * ref.max())


@pytest.mark.parametrize("n_slabs, chunks", [(2, 230), (7, 230), (7, 1000), (14, 90)])
def test_two_stage_interpolate_matches_whole_mesh(monkeypatch, rng, n_slabs, chunks):
    """The two-stage way back (parts of groups of chunks cut by chunk, gathered over the
    groups of slabs) equals the one-stage one bit for bit and the whole-mesh CIC
    interpolation to rounding, with two groups of meshes and a finish step."""
    import functools

    import cosmo_dask.spatial.domains as sd
    from cosmo_dask.gravity.pm import _interp_piece
    from cosmo_dask.gravity.pm_kernels import cic_interpolate_numpy

    n, box = 14, 3.0
    meshes = rng.standard_normal((3, n, n, n))
    pos = _positions(rng, 1000, n, box)
    scale = rng.uniform(1, 2, 1000)
    ref = np.concatenate([cic_interpolate_numpy(pos, meshes[:2], box, 0.0),
                          cic_interpolate_numpy(pos, meshes[2:], box, 0.5)], axis=1)
    ref *= scale[:, None]
    layout = slab_layout(n, n_slabs, box, order=2, shifts=(0.0, 0.5))
    p = da.from_array(pos, chunks=(chunks, 3))
    w = da.from_array(scale, chunks=chunks)
    slabs = [da.from_array(m, chunks=(layout.chunks, n, n)) for m in meshes]
    groups = [(functools.partial(_interp_piece, box=box, shifts=(0.0,)), slabs[:2], 2),
              (functools.partial(_interp_piece, box=box, shifts=(0.5,)), slabs[2:], 1)]

    def interp():
        out = SlabExchange(p, 1.0, layout).interpolate(
            groups, name="test-interp", dtype=np.float64,
            finish=lambda v, s: v * s[:, None], finish_args=[w])
        assert out.chunks == (p.chunks[0], (3,))
        return out, out.compute(scheduler="threads")

    _, one = interp()
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    arr, two = interp()
    assert "test-interp-merge" in _kinds(arr)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(two, ref, rtol=0, atol=1e-13 * np.abs(ref).max())


@pytest.mark.gpu
def test_gpu_two_stage_mesh_path_equals_one_stage(monkeypatch):
    """CuPy chunks through the forced two-stage exchange: mesh, P(k) and PM forces equal
    the one-stage CuPy graph's to float64 rounding (atomicAdd deposits sum in no fixed
    order) and the CPU graph's."""
    cupy = pytest.importorskip("cupy")
    import cosmo_dask.spatial.domains as sd

    rng = np.random.default_rng(9)
    pos = rng.uniform(0, 10.0, (20000, 3))
    mass = rng.uniform(0.5, 2.0, 20000)
    gpos, gmass = cupy.asarray(pos), cupy.asarray(mass)

    def host(v):
        return v.get() if isinstance(v, cupy.ndarray) else np.asarray(v)

    cpu = _mesh_path(pos, mass, 1500, 5, n=16)
    one = [host(v) for v in _mesh_path(gpos, gmass, 1500, 5, n=16)]
    monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0)
    two = [host(v) for v in _mesh_path(gpos, gmass, 1500, 5, n=16)]
    for a, b, c in zip(cpu, one, two, strict=True):
        scale = np.abs(a).max()
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(c, b, rtol=0, atol=1e-12 * scale)


def test_gpu_memory_check_counts_interlaced_meshes_and_transpose(monkeypatch):
    """One 80 GiB GPU: a 2048^3 float32 mesh (32 GiB) fits with its transpose copy (1.7
    meshes, measured 1.69 on an H100), two interlaced ones do not (they ran out of its
    memory): refused before any work, naming what fits. CPU workers spill, so there
    interlaced meshes count as one."""
    import importlib

    paint = importlib.import_module("cosmo_dask.density.painting")

    monkeypatch.setattr(paint, "memory_per_worker", lambda gpu: (80 * 2**30, "GPU"))
    monkeypatch.setattr(paint, "worker_count", lambda: 1)
    assert paint.mesh_slabs(2048, np.float32, gpu=True, what="P(k)", meshes=1) >= 1
    with pytest.raises(ParameterError, match=r"n_mesh=2048 needs at least 86\.4 GiB.*"
                                             r"the largest n_mesh that fits is about 1[0-9]{3}"):
        paint.mesh_slabs(2048, np.float32, gpu=True, what="P(k)", meshes=2)
    monkeypatch.setattr(paint, "memory_per_worker", lambda gpu: (40 * 2**30, "worker"))
    monkeypatch.setattr(paint, "worker_count", lambda: 2)
    assert paint.mesh_slabs(2048, np.float32, gpu=False, what="P(k)", meshes=2) >= 1


def test_gpu_pm_force_whose_one_slab_pipeline_does_not_fit_is_cut_in_slabs(monkeypatch):
    """An interlaced 1024^3 float32 PM force held 19 meshes (76 GiB) as one slab on an
    H200 and ran out of an 80 GB H100's memory: on a GPU of 74 GiB it takes slabs, on
    one of 131 GiB (an H200) it stays one slab; a PM force without a split (real-space
    gradients) and a P(k) mesh (about 8 meshes in their one slab) stay one slab on the
    smaller GPU."""
    import importlib

    from cosmo_dask.gravity.pm import gpu_one_slab_meshes

    paint = importlib.import_module("cosmo_dask.density.painting")
    monkeypatch.setattr(paint, "worker_count", lambda: 1)
    pm_meshes = 2 * gpu_one_slab_meshes(3)
    assert pm_meshes >= 19  # the measured peak
    # without a split the gradients are differenced from the real potential: the same
    # force peaked at 8.0 meshes (32.05 GiB on an H100, 2026-12-07), and it stays one slab
    fd4_meshes = 2 * gpu_one_slab_meshes(3, spectral=False)
    assert 8 <= fd4_meshes < pm_meshes
    for gib, pm_slabs in ((74, 2), (131, 1)):
        monkeypatch.setattr(paint, "memory_per_worker", lambda gpu, g=gib: (g * 2**30, "GPU"))
        assert paint.mesh_slabs(1024, np.float32, gpu=True, what="PM",
                                one_slab_meshes=pm_meshes) == pm_slabs
        assert paint.mesh_slabs(1024, np.float32, gpu=True, what="PM",
                                one_slab_meshes=fd4_meshes) == 1
        assert paint.mesh_slabs(1024, np.float32, gpu=True, what="P(k)") == 1


def _pm_by_passes(monkeypatch, pos, mass, *, meshes_fit: float, chunks=1000, slabs=3, n=12,
                  box=10.0):
    """PM accelerations and potentials (float64, interlaced, a split) with workers holding
    ``meshes_fit`` meshes in all, and the interpolation passes' names of the graph."""
    import importlib

    from cosmo_dask.gravity.pm import pm_accelerations

    paint = importlib.import_module("cosmo_dask.density.painting")
    monkeypatch.setattr(paint, "memory_per_worker",
                        lambda gpu: (int(meshes_fit * n**3 * 8), "worker"))
    monkeypatch.setattr(paint, "worker_count", lambda: 1)
    cpu = isinstance(pos, np.ndarray)  # CuPy arrays: chunks kept as they are
    p = da.from_array(pos, chunks=(chunks, 3), asarray=None if cpu else False)
    m = da.from_array(mass, chunks=chunks, asarray=None if cpu else False)
    acc, pot = pm_accelerations(p, m, G=1.0, box_size=box, n_mesh=n, r_split=0.5,
                                slabs=slabs)
    passes = {str(k[0]) for k in dict(acc.__dask_graph__())
              if isinstance(k, tuple) and str(k[0]).startswith("gravity-pm-interp")
              and "-slab-" in str(k[0])}
    return acc, pot, passes


def test_pm_force_passes_are_bit_for_bit(monkeypatch):
    """A mesh in slabs interpolates all its force and potential components in one pass
    per interlaced mesh when ``c + 2`` meshes fit the workers (``force_passes`` "shift":
    2 passes), else one pass per mesh and component ("component": 8 passes). Forced by
    the workers' memory, one- and two-stage exchanges, threaded and on a two-process
    cluster: the same forces and potentials bit for bit, and the one-slab mesh's to
    rounding."""
    from distributed import Client, LocalCluster

    import cosmo_dask.spatial.domains as sd
    from cosmo_dask.gravity.pm import force_passes, pm_accelerations

    rng = np.random.default_rng(19)
    box = 10.0
    pos = _positions(rng, 5000, 12, box)
    mass = rng.uniform(0.5, 2.0, 5000)
    with dask.config.set(scheduler="threads"):
        ref = dask.compute(*pm_accelerations(da.from_array(pos, chunks=(1000, 3)), mass,
                                             G=1.0, box_size=box, n_mesh=12, r_split=0.5,
                                             slabs=1))
    runs, graphs, default = {}, {}, sd.TWO_STAGE_PAIRS
    for two_stage in (False, True):
        monkeypatch.setattr(sd, "TWO_STAGE_PAIRS", 0 if two_stage else default)
        for fit, kind, n_passes in ((5.9, "component", 8), (6.0, "shift", 2)):
            acc, pot, passes = _pm_by_passes(monkeypatch, pos, mass, meshes_fit=fit)
            assert force_passes(12, np.float64, 4, n_slabs=3, gpu=False) == kind
            assert len(passes) == n_passes, passes
            graphs[two_stage, kind] = (acc, pot)
            with dask.config.set(scheduler="threads"):
                runs[two_stage, kind, "local"] = dask.compute(acc, pot)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster):
        for two_stage in (False, True):
            runs[two_stage, "shift", "remote"] = dask.compute(*graphs[two_stage, "shift"])
    first = runs[False, "component", "local"]
    for key, got in runs.items():
        for a, b in zip(first, got, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=str(key))
    for a, b in zip(ref, first, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12 * np.abs(a).max())
    assert np.abs(first[0]).max() > 0 and np.abs(first[1]).max() > 0


@pytest.mark.gpu
def test_gpu_pm_force_passes(monkeypatch):
    """CuPy chunks: one interpolation pass per interlaced mesh and one per mesh and
    component (forced by the workers' memory) equal the CPU graph's forces and
    potentials to float64 rounding (atomicAdd deposits sum in no fixed order)."""
    cupy = pytest.importorskip("cupy")

    rng = np.random.default_rng(21)
    pos = _positions(rng, 20000, 12, 10.0)
    mass = rng.uniform(0.5, 2.0, 20000)
    acc, pot, _ = _pm_by_passes(monkeypatch, pos, mass, meshes_fit=6.0, chunks=3000)
    with dask.config.set(scheduler="threads"):
        cpu = dask.compute(acc, pot)
    # on a GPU the check adds 0.7 meshes for the transposes: 6 + 0.7 must fit
    for fit, n_passes in ((6.75, 2), (6.65, 8)):
        acc, pot, passes = _pm_by_passes(monkeypatch, cupy.asarray(pos), cupy.asarray(mass),
                                         meshes_fit=fit, chunks=3000)
        assert len(passes) == n_passes, passes
        got = [v.get() for v in dask.compute(acc, pot)]
        for a, b in zip(cpu, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-12 * np.abs(a).max())
