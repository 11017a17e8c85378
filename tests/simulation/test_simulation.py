"""cosmo_dask.simulation: KDK PM/TreePM runs from Zel'dovich ICs, outputs, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cosmo_dask import open_snapshot
from cosmo_dask.analysis import power_spectrum
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.models import lpt_ics, zeldovich
from cosmo_dask.models.cosmology import Cosmology
from cosmo_dask.simulation import SimulationInterrupted, open_simulation, run
from cosmo_dask.simulation.integrator import Factors, to_momentum, to_velocity
from cosmo_dask.simulation.schedule import step_schedule
from cosmo_dask.store.snapshot import Snapshot


def _ics(n_side=16, box=1000.0, z=19.0, seed=3, **cosmo):
    return zeldovich(n_side, box_size=box, redshift=z, seed=seed, precision="float64",
                     chunks=n_side**3 // 4, cosmology=cosmo or None)


def _growth_ratio(ics, final, n_mesh, z_final=0.0):
    """P_final / (P_ics (D(z_final)/D(z_ics))^2) per k bin, and the bins' k."""
    c = Cosmology.coerce(ics.cosmology)
    g = float(c.growth_factor(1 / (1 + z_final)) / c.growth_factor(ics.scale_factor))
    p0 = power_spectrum(ics, n_mesh=n_mesh)
    p1 = power_spectrum(final, n_mesh=n_mesh)
    return p0.k.values, p1.power.values / (p0.power.values * g * g)


# ----------------------------------------------------------------------------- linear growth
def test_linear_growth_pm_fastpm_10_steps():
    """64^3 in 2000 Mpc/h from z = 19 to 0 in 10 PM steps (mesh 128): the same-seed
    growth ratio of the four lowest k bins (k < 0.015 h/Mpc) is 1 within 1 %.
    Measured: 1.0021, 0.9962, 0.9997, 1.0027 (and 1.0021, 1.0005, 1.0016, 1.0104,
    1.0035 up to k = 0.03)."""
    ics = _ics(64, box=2000.0)
    res = run(ics, z_final=0.0, n_steps=10, n_mesh=128)
    k, ratio = _growth_ratio(ics, res.snapshot, 128)
    low = ratio[k < 0.015]
    assert low.size == 4
    np.testing.assert_allclose(low, 1.0, atol=0.01)


def test_fastpm_factors_exact_in_linear_regime():
    """sigma8 = 0.01 (linear throughout), 3 steps from z = 19: FastPM factors give the
    linear growth of the lowest mode to 0.5 % (measured 1.0016); the standard
    integrals with the same 3 steps miss it by 25 % (measured 0.7485)."""
    ics = _ics(32, box=1000.0, sigma8=0.01)
    fast = run(ics, n_steps=3, n_mesh=64)
    std = run(ics, n_steps=3, n_mesh=64, factors="standard")
    _, r_fast = _growth_ratio(ics, fast.snapshot, 64)
    _, r_std = _growth_ratio(ics, std.snapshot, 64)
    assert abs(r_fast[0] - 1) < 5e-3
    assert abs(r_std[0] - 1) > 0.1


@pytest.mark.slow
def test_linear_growth_treepm():
    """TreePM (mesh 32, default softening, FastPM factors), 32^3 in 1000 Mpc/h, 10 steps:
    lowest-k growth ratio 1 within 2 % (measured 0.9891, 0.9864, 0.9921, 0.9888)."""
    ics = _ics(32, box=1000.0)
    res = run(ics, n_steps=10, n_mesh=32, method="treepm", factors="fastpm")
    k, ratio = _growth_ratio(ics, res.snapshot, 32)
    np.testing.assert_allclose(ratio[k < 0.03], 1.0, atol=0.02)


# ----------------------------------------------------------------------------- sanity
def test_uniform_lattice_does_not_move():
    """An unperturbed lattice at rest has no force: after 5 steps every particle is
    where it started, to 1e-10 of the box (measured 0 to rounding)."""
    n_side, box = 16, 500.0
    i = np.arange(n_side**3)
    grid = np.stack([i // n_side**2, (i // n_side) % n_side, i % n_side], axis=1)
    pos = (grid + 0.5) * (box / n_side)
    cosmo = Cosmology()
    mass = cosmo.Omega_m * 3 * 100.0**2 / (8 * math.pi * 43.00917) * (box / n_side) ** 3
    snap = Snapshot.from_arrays(pos, np.zeros_like(pos), i.astype(np.int64), box_size=box,
                                particle_mass=mass, scale_factor=0.1,
                                cosmology=cosmo.as_dict(), G=43.00917, chunks=1024,
                                units={"length": "Mpc/h", "velocity": "km/s (peculiar)",
                                       "mass": "1e10 Msun/h"})
    res = run(snap, n_steps=5, n_mesh=32)
    d = res.snapshot.pos.compute() - pos
    d -= box * np.round(d / box)
    assert np.abs(d).max() < 1e-10 * box


def test_momentum_round_trip_and_factors():
    """p = a v and back is exact to rounding; for a tiny step both factor kinds equal
    the integrals da/(a^3 H) and da/(a^2 H) (midpoint rule, 1e-8)."""
    v = np.random.default_rng(1).normal(size=(100, 3)) * 300
    a = 0.123
    np.testing.assert_allclose(to_velocity(to_momentum(v, a), a), v, rtol=1e-15)
    cosmo = Cosmology()
    a0, a1 = 0.5, 0.5 + 1e-5
    am = 0.5 * (a0 + a1)
    hm = 100.0 * float(cosmo.E(am))
    for kind in ("fastpm", "standard"):
        f = Factors(cosmo, 100.0, kind)
        assert f.drift(a0, a1, am) == pytest.approx((a1 - a0) / (am**3 * hm), rel=1e-8)
        assert f.kick(a0, a1, am) == pytest.approx((a1 - a0) / (am**2 * hm), rel=1e-8)


def test_schedule_lands_on_outputs():
    """Outputs split the schedule: 8 loga steps + 2 outputs strictly inside -> 10 steps,
    each output's a present exactly; an output on a base point does not add a step."""
    a0, a1 = 0.05, 1.0
    base = step_schedule(a0, a1, 8, "loga")
    assert len(base) == 9 and base[0] == a0 and base[-1] == a1
    np.testing.assert_allclose(np.diff(np.log(base)), math.log(a1 / a0) / 8, rtol=1e-12)
    outs = [1 / (1 + 3.0), 1 / (1 + 0.5), float(base[4])]
    sched = step_schedule(a0, a1, 8, "loga", outs)
    assert len(sched) == 11
    for a in outs:
        assert a in sched
    lin = step_schedule(a0, a1, 4, "a")
    np.testing.assert_allclose(np.diff(lin), (a1 - a0) / 4, rtol=1e-12)


# ----------------------------------------------------------------------------- checkpoints
def test_kill_and_resume_bit_identical(tmp_path):
    """6 steps straight vs checkpoint every 2 steps, killed after step 3, resumed from the
    step-2 checkpoint: positions and velocities equal bit for bit (float64)."""
    ics = _ics(16, box=500.0)
    ref = run(ics, n_steps=6, n_mesh=32)
    out = tmp_path / "sim"
    with pytest.raises(SimulationInterrupted):
        run(ics, n_steps=6, n_mesh=32, out=out, checkpoint_every=2, _stop_after=3)
    sim = open_simulation(out)
    assert len(sim.log) == 3
    res = run(ics, n_steps=6, n_mesh=32, out=out, checkpoint_every=2, resume=True)
    assert res.snapshot.pos.dtype == np.float64
    assert np.array_equal(res.snapshot.pos.compute(), ref.snapshot.pos.compute())
    assert np.array_equal(res.snapshot.vel.compute(), ref.snapshot.vel.compute())
    assert [r["step"] for r in res.log] == list(range(1, 7))
    final = open_simulation(out).snapshot(0.0)
    assert np.array_equal(final.pos.compute(), ref.snapshot.pos.compute())
    with pytest.raises(ParameterError, match="n_mesh"):
        run(ics, n_steps=6, n_mesh=16, out=out, checkpoint_every=2, resume=True)


def test_resume_from_a_damaged_checkpoint_is_a_clear_error(tmp_path):
    """A deleted chunk of the checkpoint is an error naming it, not a resume from zeros."""
    from cosmo_dask.core.errors import SnapshotError

    ics = _ics(16, box=500.0)
    out = tmp_path / "sim"
    with pytest.raises(SimulationInterrupted):
        run(ics, n_steps=6, n_mesh=32, out=out, checkpoint_every=2, _stop_after=3)
    chunk = next((out / "checkpoint" / "mom" / "c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    chunk.unlink()
    with pytest.raises(SnapshotError, match="array 'mom'.*missing"):
        run(ics, n_steps=6, n_mesh=32, out=out, checkpoint_every=2, resume=True)


# ----------------------------------------------------------------------------- outputs
def test_outputs_store_and_analyses(tmp_path):
    """Outputs at z = 3 and 1 (and the final z = 0) open with open_snapshot with
    a = 1/(1+z) exactly; their stored P(k) equals power_spectrum of the stored particles;
    the stored halo table equals the FOF catalog (32 halos of >= 5 members at z = 0)."""
    ics = _ics(16, box=100.0)
    out = tmp_path / "sim"
    res = run(ics, z_final=0.0, n_steps=4, n_mesh=32, outputs=(3.0, 1.0), out=out,
              analyses=("power", "halos"),
              analysis_options={"halos": {"min_members": 5, "centers": ()}})
    sim = open_simulation(out)
    assert sim.redshifts == [3.0, 1.0, 0.0]
    assert len(sim.log) == 6 and sim.parameters["method"] == "pm"
    for z, snap in sim.series():
        direct = open_snapshot(out / "outputs" / sim._entry(z)["name"] / "snapshot")
        assert direct.scale_factor == 1 / (1 + z)
        assert snap.n_particles == 16**3
        p = sim.power(z)
        ref = power_spectrum(direct, n_mesh=32)
        np.testing.assert_allclose(p.power.values, ref.power.values, rtol=1e-12)
        halos, mem = sim.halos(z), res.analyses[z]["halos"]
        assert halos.sizes.get("halo", 0) == mem.sizes.get("halo", 0)
        np.testing.assert_array_equal(halos.mass.values, mem.mass.values)
    assert sim.halos(0.0).sizes["halo"] > 10
    assert res.redshifts == [3.0, 1.0, 0.0]
    np.testing.assert_array_equal(sim.snapshot(0.0).pos.compute(), res.snapshot.pos.compute())


def test_analyses_only_outputs(tmp_path):
    """write_particles=False stores the tables but no particles."""
    ics = _ics(8, box=200.0)
    out = tmp_path / "sim"
    run(ics, z_final=1.0, n_steps=2, n_mesh=16, out=out, analyses=("power",),
        write_particles=False)
    sim = open_simulation(out)
    assert sim.power(1.0).power.sizes["k"] == 8
    assert sim.series() == []
    with pytest.raises(ParameterError, match="no particles"):
        sim.snapshot(1.0)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, match", [
    ({"z_final": 30.0, "n_steps": 2}, "below the ICs"),
    ({"n_steps": 0}, "n_steps"),
    ({"n_steps": 2, "outputs": (25.0,)}, "outside"),
    ({"n_steps": 2, "z_final": 1.0, "outputs": (0.5,)}, "outside"),
    ({"n_steps": 2, "method": "treepm", "n_mesh": 16, "softening": 40.0}, "mesh cell"),
    ({"n_steps": 2, "method": "tree"}, "method"),
    ({"n_steps": 2, "analyses": ("bispectrum",)}, "analyses"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        run(_ics(8, box=500.0), **kwargs)


def test_bad_snapshots_and_existing_out(tmp_path):
    ics = _ics(8, box=500.0)
    iso = Snapshot.from_arrays(ics.pos, ics.vel, scale_factor=0.1, cosmology=ics.cosmology,
                               G=ics.G, particle_mass=1.0)
    with pytest.raises(ParameterError, match="periodic"):
        run(iso, n_steps=2)
    no_a = Snapshot.from_arrays(ics.pos, ics.vel, box_size=500.0, cosmology=ics.cosmology,
                                G=ics.G, particle_mass=ics.particle_mass)
    with pytest.raises(ParameterError, match="scale_factor"):
        run(no_a, n_steps=2)
    no_c = Snapshot.from_arrays(ics.pos, ics.vel, box_size=500.0, scale_factor=0.1, G=ics.G,
                                particle_mass=ics.particle_mass)
    with pytest.raises(ParameterError, match="cosmology"):
        run(no_c, n_steps=2)
    out = tmp_path / "existing"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ParameterError, match="already exists"):
        run(ics, n_steps=2, out=out)
    with pytest.raises(ParameterError, match="neither"):
        run(ics, n_steps=2, out=out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    with pytest.raises(ParameterError, match="no checkpoint|not a simulation"):
        run(ics, n_steps=2, out=out, resume=True)


def test_overwrite_never_deletes_the_ics(tmp_path):
    """ICs taken from an output of a simulation store: overwriting that store with a new
    run would delete them; refused before any work, the store left as it was."""
    from cosmo_dask import open_snapshot

    ics = _ics(8, box=500.0)
    out = tmp_path / "sim"
    run(ics, n_steps=2, n_mesh=16, out=out, outputs=(5.0,))
    inner = open_simulation(out).snapshot(5.0).source
    before = sorted(p.name for p in (out / "outputs").iterdir())
    with pytest.raises(ParameterError, match="holds the ICs"):
        run(open_snapshot(inner), n_steps=2, n_mesh=16, out=out, overwrite=True)
    assert sorted(p.name for p in (out / "outputs").iterdir()) == before
    assert open_snapshot(inner).n_particles == 512


# -------------------- on the GPU (formerly tests/test_simulation_gpu.py)
# The simulation on CuPy chunks (one GPU) against the same run on NumPy chunks.


def _periodic_max_diff(a, b, box):
    d = np.abs(a - b)
    return float(np.minimum(d, box - d).max())


@pytest.mark.gpu
# PM: the GPU and CPU PM forces agree to ~1e-10 (tests/gravity/test_pm.py), so positions to
# far below 1e-6 Mpc/h (passed on an H100, 2026-11-25). TreePM: the GPU and CPU trees
# differ at their own error level (~1e-3 of the force) and close pairs amplify it; on an
# H100 (2026-11-25) the largest position difference after 3 steps was 0.022 Mpc/h (1/180
# of the 4 Mpc/h mean spacing): the bound is 1/80 of the spacing
@pytest.mark.parametrize("method, steps, dx, dv", [("pm", 4, 1e-6, 1e-8),
                                                   ("treepm", 3, 0.05, 0.05)])
def test_gpu_run_matches_cpu_run(method, steps, dx, dv):
    cupy = pytest.importorskip("cupy")
    ics = lpt_ics(16, box_size=64.0, redshift=19.0, seed=5, precision="float64", chunks=1024)
    kw = dict(z_final=0.0, n_steps=steps, method=method, precision="float64")
    cpu = run(ics, **kw).snapshot
    gpu = run(ics.to_device("gpu"), **kw).snapshot
    pos_gpu = gpu.pos.compute()
    assert isinstance(pos_gpu, cupy.ndarray)  # the state stayed on the device
    pos_cpu = cpu.pos.compute()
    moved = _periodic_max_diff(pos_cpu, ics.pos.compute(), 64.0)
    assert moved > 0.5  # the particles moved (Mpc/h)
    # float64 on both; FFT and tree summation orders differ between the devices
    assert _periodic_max_diff(pos_gpu.get(), pos_cpu, 64.0) < dx
    v_cpu, v_gpu = cpu.vel.compute(), gpu.vel.compute().get()
    assert np.abs(v_gpu - v_cpu).max() <= dv * np.abs(v_cpu).max()


@pytest.mark.parametrize("method, masses", [("treepm", False), ("pm", False),
                                            ("treepm", True)])
def test_run_kept_by_domain_matches_the_ics_order(client, monkeypatch, tmp_path, method,
                                                  masses):
    """On two workers with eight domains, a run that keeps its particles by domain
    (runner.KEEP_BY_DOMAIN) gives the ICs-order run's particles, matched by id, within
    rounding; its state's chunks are the domains; killed and resumed from its checkpoint
    it ends where the straight run does. With a mass array (masses differing by up to
    20%, total kept) the masses follow their particles, through the checkpoint too."""
    import cosmo_dask.gravity.tree.graph as tree_graph
    import cosmo_dask.simulation.runner as runner

    monkeypatch.setattr(tree_graph, "DOMAIN_PARTICLES", 512)  # 16^3 -> 8 domains
    ics = _ics(16, box=500.0)
    if masses:
        n = ics.n_particles
        m = np.random.default_rng(5).uniform(0.8, 1.2, n)
        m *= ics.particle_mass * n / m.sum()
        arrays = {k: v for k, v in ics.arrays.items() if k in ("pos", "vel", "ids")}
        attrs = {k: ics.attrs[k] for k in ("box_size", "lagrangian_shape", "scale_factor",
                                           "cosmology", "units", "G")}
        ics = Snapshot.from_arrays(**{k: v.compute() for k, v in arrays.items()}, mass=m,
                                   chunks=n // 4, **attrs)
        assert ics.mass is not None
    kw = dict(n_steps=4, n_mesh=32, method=method)

    def by_id(snap):
        order = np.argsort(snap.ids.compute(), kind="stable")
        return snap.pos.compute()[order], snap.vel.compute()[order]

    monkeypatch.setattr(runner, "KEEP_BY_DOMAIN", False)
    ref = run(ics, **kw).snapshot
    assert ref.pos.chunks[0] == ics.pos.chunks[0]
    monkeypatch.setattr(runner, "KEEP_BY_DOMAIN", True)
    kept = run(ics, **kw).snapshot
    assert len(kept.pos.chunks[0]) == 8
    assert not np.array_equal(kept.ids.compute(), ref.ids.compute())  # reordered
    (p0, v0), (p1, v1) = by_id(ref), by_id(kept)
    d = p1 - p0
    d -= 500.0 * np.rint(d / 500.0)
    assert np.abs(d).max() < 1e-9 * 500.0
    np.testing.assert_allclose(v1, v0, rtol=0, atol=1e-9 * np.abs(v0).max())
    out = tmp_path / "sim"
    with pytest.raises(SimulationInterrupted):
        run(ics, **kw, out=out, checkpoint_every=2, _stop_after=3)
    res = run(ics, **kw, out=out, checkpoint_every=2, resume=True).snapshot
    (p2, v2) = by_id(res)
    assert np.array_equal(p2, p1) and np.array_equal(v2, v1)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["treepm", "pm"])
def test_gpu_run_kept_by_domain_matches_the_ics_order(client, monkeypatch, method):
    """CuPy ICs on the two-worker cluster (one domain per GPU worker: two): kept by
    domain, the state stays on the device, in two chunks, and the particles match the
    ICs-order run's by id (float64; the GPU's atomic deposits differ in rounding)."""
    cupy = pytest.importorskip("cupy")
    import cosmo_dask.simulation.runner as runner

    ics = lpt_ics(16, box_size=64.0, redshift=19.0, seed=5, precision="float64",
                  chunks=1024).to_device("gpu")
    kw = dict(z_final=9.0, n_steps=3, method=method, precision="float64")
    out = {}
    for keep in (False, True):
        monkeypatch.setattr(runner, "KEEP_BY_DOMAIN", keep)
        snap = run(ics, **kw).snapshot
        pos = snap.pos.compute()
        assert isinstance(pos, cupy.ndarray)
        order = np.argsort(snap.ids.compute().get(), kind="stable")
        out[keep] = pos.get()[order], len(snap.pos.chunks[0])
    assert out[True][1] == 2
    assert _periodic_max_diff(out[True][0], out[False][0], 64.0) < 1e-8 * 64.0
