"""The `ics` and `simulate` commands end to end on a local cluster (small sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask import open_snapshot
from cosmo_dask.cli import main
from cosmo_dask.models import lpt_ics
from cosmo_dask.simulation import open_simulation


def test_ics_then_simulate_with_outputs_and_analyses(tmp_path, capsys):
    ics = tmp_path / "ics.zarr"
    assert main(["--cpu", "--workers", "1", "ics", str(ics), "--n-side", "16",
                 "--box-size", "64", "--redshift", "19", "--seed", "3",
                 "--precision", "float64"]) == 0
    out = capsys.readouterr().out
    assert "wrote 2LPT ICs at z = 19: 16^3 particles in 64 Mpc/h" in out
    # the store holds exactly the library's 2LPT particles
    ref = lpt_ics(16, box_size=64.0, redshift=19.0, seed=3, precision="float64")
    np.testing.assert_array_equal(open_snapshot(ics).pos.compute(), ref.pos.compute())

    sim = tmp_path / "sim"
    assert main(["--cpu", "--workers", "1", "simulate", str(ics), str(sim), "--steps", "4",
                 "--outputs", "3,1", "--analyses", "power,halos"]) == 0
    captured = capsys.readouterr()
    assert "simulated 4096 particles from z = 19 to 0" in captured.out
    assert "outputs z = 3, 1, 0" in captured.out
    assert captured.err.count("[simulation] step ") == 6  # 4 steps split at z = 3 and 1
    series = open_simulation(sim)
    assert [round(z, 6) for z in series.redshifts] == [3.0, 1.0, 0.0]
    final = series.snapshot(0.0)
    assert final.scale_factor == 1.0 and final.n_particles == 4096
    # clustering grew: the z = 0 power on the largest scale is far above the ICs'
    pk0, pk3 = series.power(0.0), series.power(3.0)
    assert float(pk0["power"][0]) > 2.0 * float(pk3["power"][0])


@pytest.mark.parametrize("argv, flag", [
    (["--z-final", "30"], "z_final"),
    (["--outputs", "25"], "outputs"),
])
def test_simulate_bad_input_is_a_clear_error_before_work(tmp_path, capsys, argv, flag):
    ics = tmp_path / "ics.zarr"
    lpt_ics(8, box_size=64.0, redshift=19.0, seed=1).to_zarr(ics)
    sim = tmp_path / "sim"
    assert main(["--cpu", "--workers", "1", "simulate", str(ics), str(sim), "--steps", "2",
                 *argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert f"--{flag.replace('_', '-')}" in err
    assert not sim.exists()


def test_ics_power_errors_name_the_flag(tmp_path, capsys):
    assert main(["ics", str(tmp_path / "i.zarr"), "--n-side", "8", "--box-size", "64",
                 "--redshift", "19", "--power", str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err
    assert "--power: no such file" in err and "Traceback" not in err
    assert not (tmp_path / "i.zarr").exists()


def test_ics_fixed_and_paired_then_treepm_schedule(tmp_path, capsys):
    """--fixed-amplitude --paired write the library's fields (the pair's first-order
    displacements cancel); simulate --schedule is recorded and TreePM defaults to steps in a
    with the FastPM factors."""
    kw = ["--n-side", "8", "--box-size", "64", "--redshift", "19", "--seed", "4",
          "--order", "1", "--precision", "float64", "--fixed-amplitude"]
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    assert main(["--cpu", "--workers", "1", "ics", str(a), *kw]) == 0
    assert main(["--cpu", "--workers", "1", "ics", str(b), *kw, "--paired"]) == 0
    assert "(fixed amplitudes, paired)" in capsys.readouterr().out
    ref = lpt_ics(8, box_size=64.0, redshift=19.0, seed=4, order=1, precision="float64",
                  fixed_amplitude=True)
    pa, pb = open_snapshot(a).pos.compute(), open_snapshot(b).pos.compute()
    np.testing.assert_array_equal(pa, ref.pos.compute())
    q = (np.indices((8, 8, 8)).reshape(3, -1).T + 0.5) * 8.0
    da, db = ((p - q + 32.0) % 64.0 - 32.0 for p in (pa, pb))
    assert np.abs(da).max() > 1e-3 and np.abs(da + db).max() < 1e-12
    for schedule, expect in ((None, "a"), ("loga", "loga")):
        sim = tmp_path / f"sim-{schedule}"
        extra = [] if schedule is None else ["--schedule", schedule]
        assert main(["--cpu", "--workers", "1", "simulate", str(a), str(sim), "--steps", "2",
                     "--method", "treepm", "--no-particles", *extra]) == 0
        params = open_simulation(sim).parameters
        assert params["steps"] == expect and params["factors"] == "fastpm"
        sched = np.asarray(params["schedule"])
        mid = sched[1] if expect == "a" else np.sqrt(sched[0] * sched[2])
        assert sched[1] == pytest.approx(0.5 * (sched[0] + sched[2]) if expect == "a" else mid)
