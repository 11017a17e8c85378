"""cosmo_dask.gravity public API: input handling, bad input, dispatch, the gravity store."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask import ParameterError, Snapshot, SnapshotError
from cosmo_dask.gravity import (
    accelerations,
    api,
    check_parameters,
    default_n_mesh,
    open_gravity,
    to_zarr,
)
from tests.support.gravity import reference


def _points(n, seed=0, box=None):
    rng = np.random.default_rng(seed)
    if box is not None:
        return rng.random((n, 3)) * box
    return rng.normal(size=(n, 3))


def _exploding(n):
    """(n, 3) positions whose computation fails: proves no data was computed."""
    def boom():
        raise RuntimeError("the positions were computed")

    return da.from_delayed(dask.delayed(boom)(), shape=(n, 3), dtype=np.float64)


# ----------------------------------------------------------------------------- bad input
BAD = [
    (dict(theta=0.0), "theta"),
    (dict(theta=-0.3), "theta"),
    (dict(theta=1.5), "theta"),
    (dict(theta=float("nan")), "theta"),
    (dict(softening=-0.01), "softening"),
    (dict(softening=float("inf")), "softening"),
    (dict(softening_kernel="gaussian"), "softening_kernel"),
    (dict(method="fmm"), "method"),
    (dict(method="pm"), "isolated"),
    (dict(method="treepm"), "isolated"),
    (dict(method="pm", box_size=10.0, n_mesh=0), "n_mesh"),
    (dict(method="treepm", box_size=10.0, n_mesh=-8), "n_mesh"),
    (dict(method="pm", box_size=10.0, n_mesh=32.5), "n_mesh"),
    (dict(method="pm", box_size=10.0, n_mesh="64"), "n_mesh"),
    (dict(method="pm", box_size=10.0, n_mesh=True), "n_mesh"),
    (dict(precision="float16"), "precision"),
    (dict(precision="int32"), "precision"),
    (dict(precision=None), "precision"),
    (dict(G=0.0), "G"),
    (dict(G=-1.0), "G"),
    (dict(box_size=-1.0), "box_size"),
    (dict(max_leaf=0), "max_leaf"),
    (dict(max_group=2.5), "max_group"),
    (dict(method="treepm", box_size=10.0, r_split=-1.0), "r_split"),
    (dict(method="treepm", box_size=10.0, n_mesh=16, r_cut=6.0), "r_cut"),
    (dict(method="treepm", box_size=10.0, n_mesh=4), "r_cut"),  # default r_cut > box/2
    (dict(method="pm", box_size=10.0, softening=0.1), "softening"),
]


@pytest.mark.parametrize("kwargs, word", BAD)
def test_bad_parameters_raise_before_any_computation(tmp_path, kwargs, word):
    out = tmp_path / "g.zarr"
    with pytest.raises(ParameterError, match=word):
        accelerations(_exploding(100), 1.0, out=out, **kwargs)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, word", BAD)
def test_check_parameters_alone(kwargs, word):
    kwargs = dict(kwargs)
    with pytest.raises(ParameterError, match=word):
        check_parameters(100, **kwargs)


def _fake_methods(monkeypatch, calls):
    """Replace every method by one that records its call and returns the float64 reference."""
    def fake(method):
        def run(pos, mass, **kw):
            p = pos.compute()
            m = mass.compute() if isinstance(mass, da.Array) else mass
            calls.append((method, dict(kw, mass=m)))
            acc, pot = reference(p, m, G=kw["G"], eps=kw.get("softening", 0.0),
                                 box=kw.get("box_size"))
            dt = np.dtype(kw["precision"])
            acc = da.from_array(acc.astype(dt), chunks=(pos.chunks[0], 3))
            pot = da.from_array(pot.astype(dt), chunks=(pos.chunks[0],))
            return acc, (pot if kw["potential"] else None)
        return run

    monkeypatch.setattr(api, "_implementation", fake)


@pytest.mark.parametrize("make, word", [
    (lambda box: np.full((50, 3), 0.5 * box) + np.eye(50, 3) * box, "outside the periodic box"),
    (lambda box: np.full((50, 3), 0.5 * box) - np.eye(50, 3) * box, "outside the periodic box"),
    (lambda box: np.where(np.eye(50, 3) > 0, np.nan, 1.0), "finite"),
])
def test_bad_positions_raise_and_write_nothing(tmp_path, monkeypatch, make, word):
    calls = []
    _fake_methods(monkeypatch, calls)
    out = tmp_path / "g.zarr"
    pos = da.from_array(make(10.0), chunks=20)
    with pytest.raises(ParameterError, match=word) as info:
        accelerations(pos, 1.0, method="direct", box_size=10.0, out=out)
    assert "pos" in str(info.value)
    assert calls == [] and not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("masses", [
    np.r_[np.ones(49), -1.0], np.r_[np.ones(49), 0.0], np.r_[np.ones(49), np.nan],
])
def test_bad_masses(tmp_path, monkeypatch, masses):
    calls = []
    _fake_methods(monkeypatch, calls)
    with pytest.raises(ParameterError, match="mass"):
        accelerations(_points(50), da.from_array(masses, chunks=20), method="direct",
                      out=tmp_path / "g.zarr")
    with pytest.raises(ParameterError, match="mass"):
        accelerations(_points(50), -2.0, method="direct")
    assert calls == [] and list(tmp_path.iterdir()) == []


def test_missing_inputs():
    with pytest.raises(ParameterError, match="mass is required"):
        accelerations(_points(10))
    with pytest.raises(ParameterError, match=r"shape \(N, 3\)"):
        accelerations(np.zeros((10, 2)), 1.0)
    with pytest.raises(ParameterError, match=r"mass must have shape \(10,\)"):
        accelerations(_points(10), np.ones(9))
    no_g = Snapshot.from_arrays(_points(10), particle_mass=1.0)
    with pytest.raises(ParameterError, match="no 'G' attribute"):
        accelerations(no_g)
    no_mass = Snapshot.from_arrays(_points(10), G=1.0)
    with pytest.raises(ParameterError, match="particle_mass"):
        accelerations(no_mass)
    boxed = Snapshot.from_arrays(_points(10, box=5.0), particle_mass=1.0, G=1.0, box_size=5.0)
    with pytest.raises(ParameterError, match="differs from the snapshot's box_size"):
        accelerations(boxed, box_size=6.0)


def test_missing_method_module_is_not_implemented(monkeypatch):
    monkeypatch.setitem(api._IMPLEMENTATIONS, "direct", ("no_such_module", "f"))
    with pytest.raises(NotImplementedError, match="no_such_module"):
        accelerations(_exploding(10), 1.0, method="direct")


# ----------------------------------------------------------------------------- defaults
def test_default_mesh_rule():
    assert [default_n_mesh(n) for n in (1, 16**3, 16**3 + 1, 64**3, 100**3, 128**3)] == \
        [16, 16, 32, 64, 128, 128]


def test_defaults_forwarded_to_each_method(monkeypatch):
    calls = []
    _fake_methods(monkeypatch, calls)
    box = 20.0
    pos = _points(200, seed=3, box=box)
    accelerations(pos, 1.0, method="treepm", box_size=box)
    accelerations(pos, 1.0, method="pm", box_size=box, n_mesh=8, potential=False)
    accelerations(pos, 1.0, method="tree", theta=0.7, softening=0.05, softening_kernel="spline",
                  precision="float64", max_leaf=16, max_group=32)
    accelerations(pos, 2.0, method="direct", G=3.0)
    (m1, k1), (m2, k2), (m3, k3), (m4, k4) = calls
    assert m1 == "treepm" and k1["n_mesh"] == 16  # 200 particles: the 16^3 minimum
    assert k1["r_split"] == pytest.approx(1.2 * box / 16, rel=1e-15)
    assert k1["r_cut"] == pytest.approx(4.5 * 1.2 * box / 16, rel=1e-15)
    assert k1["theta"] == 0.5 and k1["precision"] == "float32" and k1["G"] == 1.0
    assert m2 == "pm" and k2["n_mesh"] == 8 and k2["r_split"] == 0.0
    assert k2["potential"] is False and "softening" not in k2
    assert m3 == "tree" and k3["theta"] == 0.7 and k3["softening"] == 0.05
    assert k3["softening_kernel"] == "spline" and k3["max_leaf"] == 16 and k3["max_group"] == 32
    assert k3["box_size"] is None and k3["precision"] == "float64"
    assert m4 == "direct" and k4["G"] == 3.0


def test_snapshot_attrs_and_raw_arrays(monkeypatch):
    """G, box_size and particle_mass come from the snapshot; raw arrays use G=1 by default."""
    calls = []
    _fake_methods(monkeypatch, calls)
    box, n = 7.0, 120
    pos = _points(n, seed=5, box=box)
    snap = Snapshot.from_arrays(pos, particle_mass=0.25, G=4.0, box_size=box, chunks=50)
    acc, pot = accelerations(snap, method="direct", precision="float64", softening=0.1)
    ref_acc, ref_pot = reference(pos, 0.25, G=4.0, eps=0.1, box=box)
    np.testing.assert_allclose(acc.compute(), ref_acc, rtol=1e-12, atol=0)
    np.testing.assert_allclose(pot.compute(), ref_pot, rtol=1e-12, atol=0)
    assert calls[-1][1]["box_size"] == box and calls[-1][1]["G"] == 4.0
    assert acc.chunks[0] == (50, 50, 20) and pot.chunks[0] == (50, 50, 20)
    # an explicit G overrides the snapshot's; masses array given instead of particle_mass
    masses = np.linspace(0.5, 1.5, n)
    accelerations(snap, masses, G=2.0, method="direct")
    assert calls[-1][1]["G"] == 2.0
    np.testing.assert_array_equal(calls[-1][1]["mass"], masses)
    assert calls[0][1]["mass"] == 0.25  # particle_mass forwarded as one number
    # raw positions: isolated, G = 1, chunks of the dask input kept
    raw = da.from_array(_points(n, seed=6), chunks=40)
    acc, pot = accelerations(raw, masses, method="direct", precision="float64")
    ref_acc, ref_pot = reference(raw.compute(), masses)
    np.testing.assert_allclose(acc.compute(), ref_acc, rtol=1e-12, atol=0)
    np.testing.assert_allclose(pot.compute(), ref_pot, rtol=1e-12, atol=0)
    assert calls[-1][1]["G"] == 1.0 and calls[-1][1]["box_size"] is None
    assert acc.chunks[0] == (40, 40, 40)


# ----------------------------------------------------------------------------- the store
def test_to_zarr_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    acc = rng.normal(size=(1000, 3)).astype(np.float32)
    pot = rng.normal(size=1000)
    acc_d = da.from_array(acc, chunks=((300, 200, 500), 3))  # irregular: rechunked on write
    path = to_zarr(acc_d, pot, tmp_path / "g.zarr",
                   attrs={"method": "tree", "theta": np.float64(0.5), "box_size": None})
    ds = open_gravity(path)
    np.testing.assert_array_equal(ds["acc"].values, acc)
    np.testing.assert_array_equal(ds["pot"].values, pot)
    assert ds["acc"].dtype == np.float32 and ds["pot"].dtype == np.float64
    assert ds["acc"].dims == ("particle", "axis") and list(ds["axis"].values) == ["x", "y", "z"]
    assert isinstance(ds["acc"].data, da.Array)
    assert ds.attrs["format"] == "cosmo_dask.gravity" and ds.attrs["format_version"] == 1
    assert ds.attrs["method"] == "tree" and ds.attrs["theta"] == 0.5
    assert ds.attrs["n_particles"] == 1000
    # without potentials
    to_zarr(acc, None, tmp_path / "a.zarr")
    assert "pot" not in open_gravity(tmp_path / "a.zarr")
    with pytest.raises(SnapshotError, match="already exists"):
        to_zarr(acc, pot, tmp_path / "g.zarr")
    with pytest.raises(SnapshotError, match="not a cosmo_dask gravity store"):
        from cosmo_dask.models import plummer

        plummer(10).to_zarr(tmp_path / "s.zarr")
        open_gravity(tmp_path / "s.zarr")


@pytest.mark.parametrize("acc, pot, word", [
    (np.zeros((10, 2)), None, r"acc must have shape \(N, 3\)"),
    (np.zeros((10, 3)), np.zeros(9), r"pot must have shape \(10,\)"),
    (np.zeros((10, 3), np.int64), None, "float32 or float64"),
])
def test_to_zarr_bad_arrays(tmp_path, acc, pot, word):
    with pytest.raises(ParameterError, match=word):
        to_zarr(acc, pot, tmp_path / "g.zarr")
    assert list(tmp_path.iterdir()) == []


def _failing_rows(n, rows, bad_chunk):
    def block(block_info=None):
        i = block_info[None]["chunk-location"][0]
        if i == bad_chunk:
            raise RuntimeError("chunk failed")
        size = block_info[None]["chunk-shape"][0]
        return np.full((size, 3), float(i))

    return da.map_blocks(block, chunks=((rows,) * (n // rows), (3,)), dtype=np.float64,
                         meta=np.empty((0, 0)))


def test_to_zarr_is_atomic(tmp_path, client):
    """A failing chunk leaves no store (and an existing one untouched), on a real cluster."""
    out = tmp_path / "g.zarr"
    with pytest.raises(RuntimeError, match="chunk failed"):
        to_zarr(_failing_rows(400, 50, 5), None, out)
    assert list(tmp_path.iterdir()) == []
    to_zarr(np.ones((400, 3)), np.ones(400), out)
    with pytest.raises(RuntimeError, match="chunk failed"):
        to_zarr(_failing_rows(400, 50, 3), None, out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["g.zarr"]
    np.testing.assert_array_equal(open_gravity(out)["acc"].values, 1.0)
    to_zarr(_failing_rows(400, 50, -1), None, out, overwrite=True)
    back = open_gravity(out)["acc"].values
    np.testing.assert_array_equal(back[:, 0], np.repeat(np.arange(8.0), 50))


def test_out_writes_the_store(tmp_path, monkeypatch):
    calls = []
    _fake_methods(monkeypatch, calls)
    box = 9.0
    pos = _points(150, seed=8, box=box)
    snap = Snapshot.from_arrays(pos, particle_mass=0.5, G=2.0, box_size=box, chunks=64)
    out = tmp_path / "g.zarr"
    acc, pot = accelerations(snap, method="treepm", n_mesh=16, out=out, precision="float64")
    ref_acc, ref_pot = reference(pos, 0.5, G=2.0, eps=0.0, box=box)
    np.testing.assert_allclose(acc.compute(), ref_acc, rtol=1e-12, atol=0)
    np.testing.assert_allclose(pot.compute(), ref_pot, rtol=1e-12, atol=0)
    attrs = open_gravity(out).attrs
    assert attrs["method"] == "treepm" and attrs["n_mesh"] == 16 and attrs["G"] == 2.0
    assert attrs["r_split"] == pytest.approx(1.2 * box / 16) and attrs["box_size"] == box
    assert attrs["precision"] == "float64" and attrs["n_particles"] == 150
    assert acc.chunks[0] == (64, 64, 22)
    # an existing store is refused before any computation
    n_calls = len(calls)
    with pytest.raises(SnapshotError, match="already exists"):
        accelerations(snap, method="treepm", n_mesh=16, out=out)
    assert len(calls) == n_calls


# ----------------------------------------------------------------------------- real methods
def test_direct_method_against_reference(tmp_path):
    box, n = 5.0, 300
    pos = _points(n, seed=11, box=box)
    masses = np.random.default_rng(2).uniform(0.5, 1.5, n)
    snap = Snapshot.from_arrays(pos, mass=masses, G=1.5, box_size=box, chunks=128)
    for precision, tol in (("float64", 1e-10), ("float32", 2e-4)):
        acc, pot = accelerations(snap, method="direct", softening=0.02, precision=precision)
        ref_acc, ref_pot = reference(pos, masses, G=1.5, eps=0.02, box=box)
        got = acc.compute()
        assert got.dtype == np.dtype(precision) and acc.chunks[0] == (128, 128, 44)
        err = np.linalg.norm(got - ref_acc, axis=1) / np.linalg.norm(ref_acc, axis=1)
        assert np.median(err) < tol
        np.testing.assert_allclose(pot.compute(), ref_pot, rtol=10 * tol)


@pytest.mark.parametrize("method, n_mesh", [("pm", None), ("pm", 16), ("treepm", None)])
def test_periodic_methods_on_a_perfect_lattice(method, n_mesh):
    """Every site of a perfect periodic lattice feels zero force (by symmetry)."""
    n, box = 8, 8.0
    g = (np.arange(n) + 0.5) * box / n
    pos = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
    pos = da.from_array(pos, chunks=128)
    acc, pot = accelerations(pos, 1.0, method=method, box_size=box, n_mesh=n_mesh,
                             precision="float64")
    a, p = dask.compute(acc, pot)
    # one neighbour at the lattice spacing pulls with G m / d^2 = 1
    assert np.abs(a).max() < 1e-10 and acc.chunks[0] == (128,) * 4
    assert np.ptp(p) < 1e-10  # every site is equivalent


@pytest.mark.gpu
def test_cupy_chunks_in_cupy_out(tmp_path):
    cupy = pytest.importorskip("cupy")
    box = 5.0
    pos = _points(300, seed=4, box=box)
    snap = Snapshot.from_arrays(pos, particle_mass=0.5, G=1.0, box_size=box,
                                chunks=128).to_device("gpu")
    acc, pot = accelerations(snap, method="direct", precision="float64", softening=0.01)
    assert isinstance(acc._meta, cupy.ndarray) and isinstance(pot._meta, cupy.ndarray)
    a, p = dask.compute(acc, pot)
    assert isinstance(a, cupy.ndarray) and acc.chunks[0] == (128, 128, 44)
    ref_acc, ref_pot = reference(pos, 0.5, G=1.0, eps=0.01, box=box)
    np.testing.assert_allclose(cupy.asnumpy(a), ref_acc, rtol=1e-9, atol=0)
    np.testing.assert_allclose(cupy.asnumpy(p), ref_pot, rtol=1e-9, atol=0)
    to_zarr(acc, pot, tmp_path / "g.zarr")  # copied to the host chunk by chunk
    ds = open_gravity(tmp_path / "g.zarr")
    np.testing.assert_array_equal(ds["acc"].values, cupy.asnumpy(a))


def test_prepared_input_is_used_as_is():
    """accelerations(prepare(...)) computes what accelerations(...) computes, checking
    the parameters once (in prepare)."""
    from cosmo_dask.gravity.api import prepare

    rng = np.random.default_rng(11)
    pos = rng.random((300, 3))
    kw = dict(method="direct", softening=0.01, G=1.0, precision="float64")
    prepared = prepare(pos, 1.0 / 300, **kw)
    acc_p, pot_p = accelerations(prepared)
    acc, pot = accelerations(pos, 1.0 / 300, **kw)
    np.testing.assert_array_equal(acc_p.compute(), acc.compute())
    np.testing.assert_array_equal(pot_p.compute(), pot.compute())
    # a direct sum reference for one particle
    d = pos - pos[0]
    r2 = (d * d).sum(axis=1) + 0.01**2
    ref = (d[1:] / r2[1:, None] ** 1.5).sum(axis=0) / 300
    np.testing.assert_allclose(acc.compute()[0], ref, rtol=1e-12)


def test_value_check_is_one_task_per_chunk(rng):
    """check=True reads the input once: one round whose tasks are the input chunks and one
    min/max task per chunk (not a tree reduction per quantity), and still refuses a NaN."""
    from dask.callbacks import Callback

    from cosmo_dask.gravity.api import prepare

    x = rng.random((400, 3))
    pos = da.from_array(x, chunks=(100, 3))
    mass = da.from_array(rng.random(400) + 1.0, chunks=100)
    rounds = []
    with Callback(start=lambda dsk: rounds.append(len(dsk))):
        prepare(pos, mass, method="direct")
    assert len(rounds) == 1 and rounds[0] <= 3 * 4 + 1  # pos, mass and ranges per chunk
    x[237, 2] = np.nan
    with pytest.raises(ParameterError, match="finite"):
        prepare(da.from_array(x, chunks=(100, 3)), mass, method="direct")
