"""The demo's kernel warm-up: subprocesses beside the stages on a cold cache only."""

from __future__ import annotations

import pytest

from cosmo_dask.cli import demo_stages as demo


class FakeProc:
    started: list = []

    def __init__(self, args, **kwargs):
        self.args, self.killed, self.running = args, False, True
        FakeProc.started.append(self)

    def poll(self):
        return None if self.running else 0

    def kill(self):
        self.killed, self.running = True, False

    def wait(self, timeout=None):
        return 0


@pytest.fixture
def fake(monkeypatch, tmp_path):
    FakeProc.started = []
    monkeypatch.setattr(demo.subprocess, "Popen", FakeProc)
    marker = tmp_path / "marker"
    monkeypatch.setattr(demo, "_warm_marker", lambda: marker)
    monkeypatch.delenv("COSMO_DASK_DEMO_WARM", raising=False)
    return marker


def test_cold_cache_starts_the_warm_up_and_marks_a_finished_demo(fake):
    with demo._warm_up_beside(client=object()):
        assert len(FakeProc.started) == len(demo.WARM_ORDER) == 2  # one per stage list
        parts = [p.args[-1] for p in FakeProc.started]
        assert parts == ["0", "1"]
        assert all("warm_kernels" in " ".join(p.args) for p in FakeProc.started)
    assert all(p.killed for p in FakeProc.started)  # the stages are done: stopped
    assert fake.exists()
    with demo._warm_up_beside(client=object()):  # marked: the kernels are cached
        pass
    assert len(FakeProc.started) == 2


def test_failed_stages_leave_no_mark(fake):
    with pytest.raises(RuntimeError), demo._warm_up_beside(client=object()):
        raise RuntimeError("stage failed")
    assert all(p.killed for p in FakeProc.started)
    assert not fake.exists()


def test_a_failed_start_stops_the_warm_ups_already_started(fake, monkeypatch):
    started = []

    def popen(args, **kwargs):
        if started:
            raise OSError("no more processes")
        started.append(FakeProc(args, **kwargs))
        return started[-1]

    monkeypatch.setattr(demo.subprocess, "Popen", popen)
    with pytest.raises(OSError), demo._warm_up_beside(client=object()):
        pass
    assert len(started) == 1 and started[0].killed
    assert not fake.exists()


def test_no_warm_up_without_a_cluster_or_when_switched_off(fake, monkeypatch):
    with demo._warm_up_beside(client=None):
        pass
    monkeypatch.setenv("COSMO_DASK_DEMO_WARM", "0")
    with demo._warm_up_beside(client=object()):
        pass
    assert FakeProc.started == []
    assert not fake.exists()


def test_warm_halo_box_reaches_the_catalog(tmp_path):
    """The warm-up's halos stage runs on a box with halos of >= 20 members (an evolved
    16^3 box after the warm-up's one step has none, so FOF's catalog and its MBP and MCP
    centres would not compile there), in the dtypes of the demo's evolved box."""
    from cosmo_dask.halos import fof
    from cosmo_dask.store.snapshot import open_snapshot

    ctx = {"dir": tmp_path, "n_side": 16, "box_size": 25.0, "seed": 1}
    demo._warm_halo_box(ctx)
    snap = open_snapshot(ctx["evolved"])
    assert (snap.pos.dtype, snap.vel.dtype, snap.ids.dtype) == ("float64", "float64", "int64")
    result = fof(snap, 0.2, min_members=20, centers=("mbp", "mcp"))
    assert result.n_halos >= 3
    assert demo.WARM_ORDER[0][0] == "halos"


def test_warm_kernels_runs_its_part_only(tmp_path, monkeypatch):
    """Each warm-up process runs the stages of its own list, in order; a list with PSE but
    no simulation gives PSE the ICs (a lattice) as its box."""
    ran = []

    def fake_stage(name):
        def stage(ctx):
            ran.append((name, str(ctx.get("evolved"))))
            if name == "generate":
                ctx["ics"] = tmp_path / "ics.zarr"
        stage.__name__ = f"stage_{name}"
        return stage

    names = ("generate", "inspect", "simulate", "halos", "density", "pse", "expansion",
             "gravity")
    monkeypatch.setattr(demo, "STAGES", [fake_stage(n) for n in names])
    monkeypatch.setattr(demo, "_warm_halo_box",
                        lambda ctx: ctx.__setitem__("evolved", tmp_path / "halos.zarr"))
    monkeypatch.setattr(demo, "WARM_ORDER", (("halos", "generate", "pse"), ("gravity",),
                                             ("generate", "halos", "pse")))
    demo.warm_kernels(tmp_path / "w0", part=0)
    assert [n for n, _ in ran] == ["halos", "generate", "pse"]
    assert ran[0][1].endswith("halos.zarr") and ran[2][1].endswith("ics.zarr")
    ran.clear()
    demo.warm_kernels(tmp_path / "w1", part=1)
    assert ran == [("gravity", "None")]
    ran.clear()  # the halos' box serves their stage only, in any order
    demo.warm_kernels(tmp_path / "w2", part=2)
    assert [n for n, _ in ran] == ["generate", "halos", "pse"]
    assert ran[1][1].endswith("halos.zarr") and ran[2][1].endswith("ics.zarr")


def test_reference_forces_equal_a_plain_pair_sum():
    """The gravity stage's float64 reference (blocked, cache-sized) against an unblocked
    sum over every source for each target, softened, self excluded."""
    import numpy as np

    rng = np.random.default_rng(3)
    pos = rng.standard_normal((600, 3))
    targets = rng.choice(600, 37, replace=False)  # not a multiple of the block
    eps, mass, G = 0.05, 0.25, 2.0
    got = demo._reference_forces(targets, pos, mass, G, eps)
    for row, i in enumerate(targets):
        others = np.delete(np.arange(600), i)
        d = pos[i] - pos[others]
        r = np.sqrt((d**2).sum(axis=1) + eps**2)
        want = -G * mass * (d / r[:, None] ** 3).sum(axis=0)
        np.testing.assert_allclose(got[row], want, rtol=1e-12)
