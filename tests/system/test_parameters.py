"""Each capability's parameters are declared once (``<capability>/parameters.py``): the
command line's choices and defaults and the Python functions' defaults are those, and a
bad value gives one error, the same from the Python API and from the command line."""

from __future__ import annotations

import argparse
import inspect

import numpy as np
import pytest

from cosmo_dask.analysis import parameters as ap
from cosmo_dask.cli import main
from cosmo_dask.cli.messages import cli_message
from cosmo_dask.cli.parser import build_parser
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.density import parameters as dp
from cosmo_dask.expansion import parameters as ep
from cosmo_dask.gravity import parameters as gp
from cosmo_dask.halos import parameters as hp
from cosmo_dask.simulation import parameters as sp


def _command(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(name: str) -> dict[str, argparse.Action]:
    return {a.dest: a for a in _command(name)._actions if a.option_strings}


def _defaults(func) -> dict:
    return {k: p.default for k, p in inspect.signature(func).parameters.items()
            if p.default is not inspect.Parameter.empty}


# ----------------------------------------------------------------- no drift
def test_cli_choices_and_defaults_are_the_parameters_modules():
    g = _options("gravity")
    assert tuple(g["method"].choices) == gp.METHODS
    assert tuple(g["softening_kernel"].choices) == gp.KERNELS
    assert g["method"].default == gp.METHODS[0]
    assert g["softening_kernel"].default == gp.KERNELS[0]
    assert g["theta"].default == gp.THETA_DEFAULT
    assert g["softening"].default == gp.SOFTENING_DEFAULT
    assert g["precision"].default == gp.PRECISION_DEFAULT
    assert (g["max_leaf"].default, g["max_group"].default) == (gp.MAX_LEAF_DEFAULT,
                                                              gp.MAX_GROUP_DEFAULT)

    h = _options("halos")
    assert h["linking_length"].default == hp.LINKING_LENGTH_DEFAULT
    assert h["min_members"].default == hp.MIN_MEMBERS_DEFAULT
    assert h["min_friends"].default == hp.MIN_FRIENDS_DEFAULT
    assert tuple(h["centers"].default.split(",")) == hp.CLI_CENTERS_DEFAULT
    assert set(hp.CLI_CENTERS_DEFAULT) <= set(hp.CENTERS)
    assert h["so"].metavar == ",".join(hp.DELTAS)

    hd = _options("hod")
    assert tuple(hd["model"].choices) == hp.HOD_MODELS and hd["model"].default == "zheng07"
    assert tuple(hd["satellites"].choices) == hp.HOD_SATELLITES
    assert hd["satellites"].default == hp.HOD_SATELLITES[0]
    assert tuple(hd["mass"].choices) == hp.HOD_MASSES
    assert {k: hd[k].default for k in hp.HOD_DEFAULTS["zheng07"]} == dict.fromkeys(
        hp.HOD_DEFAULTS["zheng07"])  # unset: the model's defaults, named in the help

    d = _options("density")
    assert tuple(d["method"].choices) == (*dp.SCHEMES, "pse")
    assert d["method"].default == dp.SCHEME_DEFAULT
    assert d["n_mesh"].default == dp.CLI_N_MESH_DEFAULT
    assert tuple(d["strategy"].choices) == dp.STRATEGIES
    assert d["strategy"].default == dp.STRATEGIES[0]
    assert d["patch_size"].default == dp.PATCH_SIZE_DEFAULT
    assert d["block"].default == dp.BLOCK_DEFAULT

    p = _options("power")
    assert tuple(p["scheme"].choices) == tuple(dp.SCHEMES)
    assert p["scheme"].default == dp.SCHEME_DEFAULT
    assert p["n_mesh"].default == dp.CLI_N_MESH_DEFAULT
    assert tuple(p["los"].choices) == tuple(ap.LOS_AXES.values())
    assert tuple(int(x) for x in p["poles"].default.split(",")) == ap.POLES_DEFAULT
    assert p["no_interlace"].default is (not ap.INTERLACE_DEFAULT)

    e = _options("expand")
    assert tuple(e["method"].choices) == ep.METHODS
    assert (e["nmax"].default, e["lmax"].default) == (ep.NMAX_DEFAULT, ep.LMAX_DEFAULT)
    assert e["scale_radius"].default == ep.SCALE_RADIUS_DEFAULT
    assert e["softening"].default == ep.SOFTENING_DEFAULT
    assert e["center"].default == ep.CENTER_DEFAULT
    assert e["precision"].default == ep.PRECISION_DEFAULT

    s = _options("simulate")
    assert tuple(s["method"].choices) == sp.METHODS
    assert s["method"].default == sp.METHOD_DEFAULT
    assert tuple(s["schedule"].choices) == sp.STEP_KINDS
    assert set(sp.DEFAULT_STEPS) == set(sp.METHODS)
    assert set(sp.DEFAULT_STEPS.values()) <= set(sp.STEP_KINDS)
    assert s["theta"].default == gp.THETA_DEFAULT
    assert s["z_final"].default == sp.Z_FINAL_DEFAULT
    assert tuple(s["analyses"].metavar.split(",")) == sp.ANALYSES


def test_python_defaults_are_the_parameters_modules():
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density import paint, pse_density
    from cosmo_dask.expansion import MEX, SCF
    from cosmo_dask.gravity import accelerations, check_parameters
    from cosmo_dask.halos import fof, fof_labels, populate_hod, spherical_overdensity
    from cosmo_dask.simulation import run

    for func in (accelerations, check_parameters):
        d = _defaults(func)
        assert (d["method"], d["theta"], d["softening"], d["softening_kernel"]) == (
            gp.METHODS[0], gp.THETA_DEFAULT, gp.SOFTENING_DEFAULT, gp.KERNELS[0])
        assert (d["precision"], d["max_leaf"], d["max_group"]) == (
            gp.PRECISION_DEFAULT, gp.MAX_LEAF_DEFAULT, gp.MAX_GROUP_DEFAULT)
    for func in (fof, fof_labels):
        d = _defaults(func)
        assert (d["linking_length"], d["min_members"], d["min_friends"]) == (
            hp.LINKING_LENGTH_DEFAULT, hp.MIN_MEMBERS_DEFAULT, hp.MIN_FRIENDS_DEFAULT)
    assert _defaults(fof)["centers"] == hp.CENTERS_DEFAULT
    d = _defaults(spherical_overdensity)
    assert (d["deltas"], d["n_bins"], d["r_min_factor"]) == (
        hp.DELTAS, hp.SO_N_BINS_DEFAULT, hp.SO_R_MIN_FACTOR_DEFAULT)
    d = _defaults(populate_hod)
    assert (d["model"], d["satellites"], d["params"]) == (
        hp.HOD_MODELS[0], hp.HOD_SATELLITES[0], None)  # None: HOD_DEFAULTS
    assert _defaults(paint)["scheme"] == dp.SCHEME_DEFAULT
    d = _defaults(pse_density)
    assert (d["patch_size"], d["strategy"], d["block"]) == (
        dp.PATCH_SIZE_DEFAULT, dp.STRATEGIES[0], dp.BLOCK_DEFAULT)
    d = _defaults(power_spectrum)
    assert (d["scheme"], d["interlace"], d["poles"]) == (
        dp.SCHEME_DEFAULT, ap.INTERLACE_DEFAULT, ap.POLES_DEFAULT)
    d = _defaults(SCF.__init__)
    assert (d["nmax"], d["lmax"], d["scale_radius"], d["center"]) == (
        ep.NMAX_DEFAULT, ep.LMAX_DEFAULT, ep.SCALE_RADIUS_DEFAULT, ep.CENTER_DEFAULT)
    d = _defaults(MEX.__init__)
    assert (d["lmax"], d["softening"], d["center"]) == (
        ep.LMAX_DEFAULT, ep.SOFTENING_DEFAULT, ep.CENTER_DEFAULT)
    d = _defaults(run)
    assert (d["method"], d["theta"], d["z_final"]) == (
        sp.METHOD_DEFAULT, gp.THETA_DEFAULT, sp.Z_FINAL_DEFAULT)


def test_choice_tuples_are_written_once_in_the_package():
    """A parameter's choices are one tuple in its ``parameters`` module (or
    ``core.checks``): the literal appears once in the package, and everyone imports it."""
    from pathlib import Path

    import cosmo_dask

    root = Path(cosmo_dask.__file__).parent
    text = {p: p.read_text() for p in root.rglob("*.py")}
    for literal in ('("plummer", "spline")', '("float32", "float64")'):
        where = [str(p.relative_to(root)) for p, t in text.items() if literal in t]
        assert len(where) == 1, (literal, where)
    assert gp.KERNELS == ("plummer", "spline")


def test_lazy_packages_keep_public_names_over_submodules():
    """``halos.fof`` and ``density.paint`` name the functions even after their modules
    (``halos/fof_graph.py``, ``density/painting.py``) are imported, as eager imports did."""
    import importlib

    import cosmo_dask.density as density
    import cosmo_dask.halos as halos

    importlib.import_module("cosmo_dask.halos.fof_graph")
    importlib.import_module("cosmo_dask.density.painting")
    assert inspect.isfunction(halos.fof) and halos.fof.__module__ == "cosmo_dask.halos.api"
    assert inspect.isfunction(density.paint)
    assert density.paint.__module__ == "cosmo_dask.density.painting"


# ----------------------------------------------------------------- one error, two doors
@pytest.fixture(scope="module")
def lattice(tmp_path_factory):
    from cosmo_dask import Snapshot

    n = 8
    grid = (np.indices((n, n, n)).reshape(3, -1).T + 0.5).astype(np.float64)
    path = tmp_path_factory.mktemp("params") / "lat.zarr"
    Snapshot.from_arrays(grid, np.zeros_like(grid), ids=np.arange(n**3), box_size=float(n),
                         particle_mass=1.0, lagrangian_shape=(n, n, n)).to_zarr(path)
    return str(path)


def _api_error(call) -> str:
    with pytest.raises(ParameterError) as err:
        call()
    return str(err.value)


@pytest.mark.parametrize("command, argv, api", [
    ("halos", ["--min-members", "1"], lambda s: __import__("cosmo_dask.halos").halos.fof(
        s, min_members=1)),
    ("halos", ["--linking-length", "-0.5"], lambda s: __import__("cosmo_dask.halos").halos.fof(
        s, -0.5)),
    ("halos", ["--centers", "mbp,mbp_grid"],
     lambda s: __import__("cosmo_dask.halos").halos.fof(s, centers=("mbp", "mbp_grid"))),
    ("density", ["--method", "pse", "--patch-size", "6"],
     lambda s: __import__("cosmo_dask.density").density.pse_density(s, patch_size=6)),
    ("density", ["--method", "pse", "--max-level", "21"],
     lambda s: __import__("cosmo_dask.density").density.pse_density(s, max_level=21)),
    ("density", ["--n-mesh", "11"],
     lambda s: __import__("cosmo_dask.density").density.paint(s, n_mesh=11)),
    ("hod", ["--sigma-logM", "0"], lambda s: __import__("cosmo_dask.halos").halos.populate_hod(
        s, params={"sigma_logM": 0})),
    ("hod", ["--logMmin", "25"], lambda s: __import__("cosmo_dask.halos").halos.populate_hod(
        s, params={"logMmin": 25})),
    ("expand", ["--lmax", "33", "--center", "1,1,1"],
     lambda s: __import__("cosmo_dask.expansion").expansion.SCF(lmax=33, center=(1, 1, 1))),
])
def test_bad_value_same_error_from_api_and_cli(command, argv, api, lattice, tmp_path, capsys):
    from cosmo_dask import open_snapshot

    message = _api_error(lambda: api(open_snapshot(lattice)))
    out = tmp_path / "out.zarr"
    code = main(["--cpu", "--workers", "1", command, lattice, str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == f"cosmo-dask: error: {cli_message(message, _command(command))}"
    assert not out.exists()


def test_mass_function_models_are_the_multiplicity_functions():
    """halos.parameters names the fits; mass_function implements exactly those."""
    from cosmo_dask.halos.mass_functions import MULTIPLICITY_FUNCTIONS
    from cosmo_dask.halos.parameters import MASS_FUNCTION_MODELS

    assert tuple(MULTIPLICITY_FUNCTIONS) == MASS_FUNCTION_MODELS
