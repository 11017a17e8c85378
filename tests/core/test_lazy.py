"""``import cosmo_dask`` is light; subpackages and top-level names load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cosmo_dask

HEAVY = ("dask.array", "xarray", "numba", "zarr", "distributed", "cosmo_dask.store.snapshot")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout


def test_import_loads_no_heavy_module():
    out = _run(f"import sys, cosmo_dask; print(' '.join(m for m in {HEAVY!r} "
               "if m in sys.modules))")
    assert out.strip() == ""


@pytest.mark.parametrize("name", cosmo_dask.SUBPACKAGES)
def test_subpackages_are_attributes(name):
    out = _run(f"import cosmo_dask; m = cosmo_dask.{name}; print(m.__name__)")
    assert out.strip() == f"cosmo_dask.{name}"


def test_lazy_top_level_names():
    from cosmo_dask.core.cluster import connect
    from cosmo_dask.store.snapshot import Snapshot, open_snapshot

    assert cosmo_dask.connect is connect
    assert cosmo_dask.open_snapshot is open_snapshot
    assert cosmo_dask.Snapshot is Snapshot
    assert {"io", "gravity", "connect"} <= set(dir(cosmo_dask))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cosmo_dask.nope  # noqa: B018


def test_cli_help_loads_no_heavy_module():
    # `cosmo-dask --help` builds the whole parser (every subcommand's options) and exits
    out = _run("import sys\nfrom cosmo_dask.cli import main\ntry:\n    main(['--help'])\n"
               "except SystemExit:\n    pass\n"
               f"print('HEAVY', ' '.join(m for m in {HEAVY + ('matplotlib', 'scipy')!r} "
               "if m in sys.modules))")
    assert out.strip().splitlines()[-1] == "HEAVY"


def test_connect_and_compile_lock_leave_import_light():
    # the compile lock (cosmo_dask.core.compile_cache) is imported by connect(), not by the package
    out = _run("import sys, cosmo_dask; print('compile_cache' in ' '.join(sys.modules))")
    assert out.strip() == "False"


@pytest.mark.parametrize("package, name", [
    ("halos", "fof"), ("density", "paint"), ("simulation", "run"), ("halos", "mass_function"),
    ("halos", "spherical_overdensity"), ("models", "zeldovich")])
def test_public_function_survives_importing_every_submodule(package, name):
    # no submodule shares a public function's name (halos/fof_graph.py, density/painting.py,
    # simulation/runner.py, halos/mass_functions.py, halos/overdensity.py,
    # models/zeldovich_ics.py), so importing them all leaves the function in place with no
    # __setattr__ override in lazy_exports
    out = _run(f"import importlib, pkgutil, cosmo_dask.{package} as p\n"
               "for m in pkgutil.iter_modules(p.__path__):\n"
               "    try:\n"
               "        importlib.import_module(f'{p.__name__}.{m.name}')\n"
               "    except ImportError as exc:\n"
               "        if 'cupy' not in str(exc):\n"
               "            raise\n"
               f"f = p.{name}\n"
               "print(type(f).__name__, f.__module__)")
    assert out.split()[0] == "function"
    assert out.split()[1] != f"cosmo_dask.{package}.{name}"
