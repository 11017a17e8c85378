"""Bad input to the `cosmo-dask` command: one line, exit status 2, before any work.

The rule: every bad-input exit prints exactly one line on stderr, ``cosmo-dask[
COMMAND]: error: ...`` (argparse's errors end with ``(see 'cosmo-dask COMMAND
--help')`` on that same line instead of the 10-13 lines of usage), exits with
status 2, and happens before a cluster starts: here ``cosmo_dask.core.cluster.connect``
is replaced by a function that fails the test, so a check that runs only once a
cluster is up is caught (on a 2-core VM under load the checks took 0.4-2 s of CPU
each, against 6-10 s of wall time before a cluster start; see the issue 36 report).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cosmo_dask.cli import main
from cosmo_dask.models import lpt_ics, perturbed_lattice, plummer


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_input")
    perturbed_lattice(8, box_size=10.0, seed=1).to_zarr(d / "snap.zarr")
    lpt_ics(8, box_size=64.0, redshift=19.0, seed=1).to_zarr(d / "ics.zarr")
    plummer(200, seed=1).to_zarr(d / "iso.zarr")
    return d


@pytest.fixture
def no_cluster(monkeypatch):
    """``connect`` fails the test: a bad-input run must end before a cluster starts."""
    import cosmo_dask.core.cluster

    def connect(*args, **kwargs):
        raise AssertionError("a cluster was started before the bad input was refused")

    monkeypatch.setattr(cosmo_dask.core.cluster, "connect", connect)


def _run(argv, capsys) -> tuple[int, list[str]]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    return rc, capsys.readouterr().err.splitlines()


SIM = ["simulate", "{d}/ics.zarr", "{d}/out/sim", "--steps", "2"]
#: (argv, a piece of the one line); every row failed on the code before issue 36: several
#: lines of argparse usage, an exception's exit status 1, or a check after a cluster start
BAD = [
    # argparse: one line with the --help hint
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["generate"], "the following arguments are required: model, OUT.zarr"),
    (["generate", "plummer", "{d}/out/g.zarr", "--n", "x"], "expected a positive integer"),
    (["power", "{d}/snap.zarr", "--scheme", "xyz"], "invalid choice: 'xyz'"),
    (["power", "{d}/snap.zarr", "--poles", "nan"], "expected integers like 0,2,4"),
    (["halos", "{d}/snap.zarr", "{d}/out/h.zarr", "--sigma8", "nan", "--plot",
      "{d}/out/h.png"], "--sigma8: expected a finite number"),
    (["ics", "{d}/out/i.zarr", "--n-side", "8", "--box-size", "64", "--redshift", "19",
      "--cosmology", "Omega_m=inf"], "Omega_m: expected a finite number"),
    # simulate: every check before the cluster
    (SIM + ["--z-final", "-1"], "--z-final = -1 must be below"),
    (SIM + ["--outputs", "nan"], "--outputs: z = nan"),
    (SIM + ["--method", "treepm", "--theta", "0"], "--theta (the opening angle)"),
    (SIM + ["--analyses", "foo"], "--analyses must be a subset"),
    (SIM + ["--resume"], "is not a simulation store"),
    (SIM + ["--n-mesh", "100000"], "larger than 4096"),
    (["simulate", "{d}/ics.zarr", "{d}/out/sim", "--steps", "1000000000"],
     "--steps must be at most 65536"),
    # power: the multipoles and the mesh before the cluster
    (["power", "{d}/snap.zarr", "--poles", "2"], "need a line of sight"),
    (["power", "{d}/snap.zarr", "--n-mesh", "100000"], "larger than 4096"),
    (["power", "{d}/iso.zarr", "--n-mesh", "16"], "is not periodic"),
    # bispectrum: the bins against the mesh, the output, before the cluster
    (["bispectrum", "{d}/snap.zarr", "{d}/out/b.zarr", "--n-mesh", "16", "--k-bins", "9"],
     "past the Nyquist wavenumber"),
    (["bispectrum", "{d}/snap.zarr", "{d}/out/b.zarr", "--k-bins", "0.5,0.2"],
     "strictly increasing"),
    (["bispectrum", "{d}/snap.zarr", "{d}/out/b.zarr", "--n-mesh", "16", "--k-bins",
      "0.01,0.02,0.7"], "holds no mode"),
    (["bispectrum", "{d}/snap.zarr", "{d}/out/b.zarr", "--k-bins", "x"],
     "expected a number of bins"),
    (["bispectrum", "{d}/iso.zarr", "{d}/out/b.zarr", "--n-mesh", "16"], "is not periodic"),
    # halos: domains bounded by the particles
    (["halos", "{d}/snap.zarr", "{d}/out/h.zarr", "--domains", "100000"],
     "--domains = 100000 is more than the 512 particles"),
    # generate / ics: sizes bounded by the machine, overflowing boxes refused
    (["generate", "zeldovich", "{d}/out/g.zarr", "--n-side", "8", "--box-size", "1e308",
      "--redshift", "0"], "--box-size must lie between"),
    (["ics", "{d}/out/i.zarr", "--n-side", "8", "--box-size", "1e200", "--redshift", "19"],
     "--box-size must lie between"),
    (["generate", "plummer", "{d}/out/g.zarr", "--n", "1000000000000000"],
     "more than this machine's memory"),
    (["generate", "lattice", "{d}/out/g.zarr", "--n-side", "100000", "--box-size", "10"],
     "more than this machine's memory"),
    (["generate", "plummer", "{d}/out/g.zarr", "--n", "1000000", "--chunk-size", "1"],
     "more than 65536"),
    (["ics", "{d}/out/i.zarr", "--n-side", "8", "--box-size", "64", "--redshift", "19",
      "--slabs", "100"], "--slabs must be at most 8"),
    # demo: its ICs and run checked before the cluster
    (["demo", "--n-side", "100000"], "--n-side must be at most 4096"),
    (["demo", "--steps", "1000000000"], "--steps must be at most 65536"),
    (["demo", "--box-size", "nan"], "--box-size must be a finite number > 0"),
    # expand, density, halos, gravity: metadata checks and bounds before the cluster
    (["expand", "{d}/snap.zarr", "{d}/out/e.zarr"], "is a periodic box"),
    (["density", "{d}/snap.zarr", "{d}/out/d.zarr", "--method", "pse", "--block", "100000"],
     "--block must be at most 8"),
    (["halos", "{d}/snap.zarr", "{d}/out/h.zarr", "--linking-length", "1e300"],
     "not below half the box"),
    (["halos", "{d}/snap.zarr", "{d}/out/h.zarr", "--min-members", "1000000000000"],
     "--min-members must be at most the 512 particles"),
    # hod: the HOD parameters before the catalog is read, then the catalog
    (["hod", "{d}/snap.zarr", "{d}/out/g.zarr", "--sigma-logM", "0"],
     "--sigma-logM must be > 0"),
    (["hod", "{d}/snap.zarr", "{d}/out/g.zarr", "--alpha", "-1"], "--alpha must be >= 0"),
    (["hod", "{d}/snap.zarr", "{d}/out/g.zarr", "--logM1", "nan"],
     "--logM1 must be a finite number"),
    (["hod", "{d}/snap.zarr", "{d}/out/g.zarr"], "not a cosmo_dask halo store"),
    (["gravity", "{d}/iso.zarr", "{d}/out/gr.zarr", "--max-leaf", "1000000000000"],
     "--max-leaf must be at most 65536"),
    (["gravity", "{d}/snap.zarr", "{d}/out/gr.zarr", "--method", "pm", "--n-mesh", "100000",
      "--G", "1"], "larger than 4096"),
    # xi: bins, line of sight and box before the cluster
    (["xi", "{d}/snap.zarr", "{d}/out/x.zarr", "--r-max", "6"], "is above half the box"),
    (["xi", "{d}/snap.zarr", "{d}/out/x.zarr", "--r-max", "2", "--r-min", "3"],
     "--r-min 3 must be below --r-max 2"),
    (["xi", "{d}/snap.zarr", "{d}/out/x.zarr", "--r-max", "2", "--los", "z"],
     "need --mu-bins"),
    (["xi", "{d}/snap.zarr", "{d}/out/x.zarr", "--r-max", "2", "--mu-bins", "4", "--poles",
      "6"], "poles must be distinct values of 0, 2, 4"),
    (["xi", "{d}/snap.zarr", "{d}/out/x.zarr", "--r-max", "2", "--domains", "1000"],
     "not smaller than the domain side"),
    (["xi", "{d}/iso.zarr", "{d}/out/x.zarr", "--r-max", "2"], "need a periodic box"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_bad_input_is_one_line_before_any_cluster(stores, capsys, no_cluster, argv, message):
    (stores / "out").mkdir(exist_ok=True)
    rc, lines = _run(["--cpu", "--workers", "1"] + [a.format(d=stores) for a in argv], capsys)
    assert rc == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("cosmo-dask") and ": error: " in lines[0]
    assert message in lines[0], lines[0]
    assert "Traceback" not in lines[0]
    assert not any((stores / "out").iterdir())  # nothing written


def test_argparse_error_names_the_help_of_its_command(capsys):
    rc, lines = _run(["halos", "a.zarr", "b.zarr", "--min-members", "x"], capsys)
    assert rc == 2 and lines == [
        "cosmo-dask halos: error: argument --min-members: invalid int value: 'x' "
        "(see 'cosmo-dask halos --help')"]


def test_bad_input_subprocess_starts_no_cluster(stores, tmp_path):
    """The installed path end to end: one stderr line, no "connected to" line (the
    cluster's), exit status 2; an argparse error and a check that needs the ICs."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    for argv in (["simulate", str(stores / "ics.zarr"), str(tmp_path / "sim"), "--steps",
                  "2", "--z-final", "-1"],
                 ["generate", "plummer", str(tmp_path / "g.zarr")] + ["--n", "0"]):
        p = subprocess.run([sys.executable, "-m", "cosmo_dask", "--cpu", *argv],
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and "error:" in lines[0], lines
        assert "connected to" not in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_no_particles_run_names_its_output_redshifts(stores, tmp_path, capsys, monkeypatch):
    """``simulate --no-particles`` ended with "outputs z = ;": the outputs hold analyses
    only, and the line names their redshifts (run on dask's local scheduler)."""
    from cosmo_dask.cli import common

    monkeypatch.setattr(common, "_cluster", lambda args, needed=True: _nothing())
    out = tmp_path / "sim"
    assert main(["simulate", str(stores / "ics.zarr"), str(out), "--steps", "1",
                 "--outputs", "9", "--no-particles", "--analyses", "power"]) == 0
    said = capsys.readouterr().out
    assert "outputs z = 9, 0 (analyses only, no particles);" in said, said
    from cosmo_dask.simulation import open_simulation

    sim = open_simulation(out)
    assert [round(e["redshift"], 6) for e in sim.outputs] == [9.0, 0.0]
    assert float(sim.power(0.0)["power"][0]) > 0


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False

