"""The CLI pipeline with ``--gpu``, end to end, on a store whose chunks do not align with
the compute chunks (``cosmo_dask.read_chunk_size`` 5000 over 8192-row store chunks):
every command exits 0 without a traceback, and every product equals the CPU API's result
on the same store (halo partitions exactly, meshes and P(k) to rounding, forces to the
methods' own tolerance)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

READ_CHUNK = 5000  # compute chunks; the store's are 8192 rows


def _cli(tmp, *args, timeout=600):
    env = dict(os.environ, DASK_COSMO_DASK__READ_CHUNK_SIZE=str(READ_CHUNK), MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, "-m", "cosmo_dask", "--gpu", *args], cwd=tmp,
                         env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr
    return out.stdout


def _same_partition(a, b):
    """Labels ``a`` and ``b`` group the particles the same way (-1 = in no halo)."""
    assert np.array_equal(a < 0, b < 0)
    pairs = np.unique(np.stack([a[a >= 0], b[b >= 0]]), axis=1)
    assert len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1]


def _rel(a, b):
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_cli")
    _cli(tmp, "generate", "zeldovich", "s.zarr", "--n-side", "32", "--box-size", "100",
         "--redshift", "0", "--seed", "1", "--chunk-size", "8192")
    _cli(tmp, "generate", "hernquist", "hq.zarr", "--n", "20000", "--seed", "4",
         "--chunk-size", "8192")
    _cli(tmp, "generate", "blobs", "b.zarr", "--n", "32768", "--box-size", "100", "--seed", "2",
         "--n-halos", "40", "--chunk-size", "8192")
    out = {"info": _cli(tmp, "info", "s.zarr")}
    out["halos"] = _cli(tmp, "halos", "b.zarr", "h.zarr", "--min-members", "10",
                        "--centers", "mbp,mcp")
    _cli(tmp, "power", "s.zarr", "--n-mesh", "32", "--out", "pk.csv")
    _cli(tmp, "density", "s.zarr", "m.zarr", "--method", "cic", "--n-mesh", "32")
    _cli(tmp, "density", "s.zarr", "p.zarr", "--method", "pse", "--patch-size", "16")
    for method in ("pm", "treepm"):
        _cli(tmp, "gravity", "s.zarr", f"g_{method}.zarr", "--method", method,
             "--n-mesh", "32", "--precision", "float64")
    # the nearest-image tree on clustered matter (in a near-uniform box the nearest-image
    # sum is a small difference of large terms: CPU and GPU trees are both ~40% off it)
    _cli(tmp, "gravity", "b.zarr", "g_tree.zarr", "--method", "tree", "--softening", "0.05",
         "--precision", "float64")
    _cli(tmp, "expand", "hq.zarr", "scf.zarr", "--method", "scf", "--accelerations")
    _cli(tmp, "expand", "hq.zarr", "mex.zarr", "--method", "mex")
    return tmp, out


def _snap(tmp, name="s.zarr"):
    from cosmo_dask import open_snapshot

    return open_snapshot(tmp / name)


def test_info_and_store_chunks(runs):
    tmp, out = runs
    assert "valid (full check of 32768 particles)" in out["info"]
    assert _snap(tmp).pos.chunks[0] == (8192,) * 4  # the store's; the CLI read 5000-row chunks


def test_halos_match_cpu(runs):
    from cosmo_dask.halos import fof
    from cosmo_dask.halos.result import open_catalog

    tmp, _ = runs
    gpu = open_catalog(tmp / "h.zarr")
    cpu = fof(_snap(tmp, "b.zarr"), 0.2, min_members=10, centers=("mbp", "mcp"))
    assert gpu.n_halos == cpu.n_halos > 0
    _same_partition(gpu.labels.compute(), cpu.labels.compute())
    np.testing.assert_array_equal(gpu.catalog["n_members"], cpu.catalog["n_members"])
    np.testing.assert_allclose(gpu.catalog["mbp_position"], cpu.catalog["mbp_position"],
                               atol=1e-9)


def test_meshes_and_power_match_cpu(runs):
    import pandas as pd

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.density import paint
    from cosmo_dask.density.mesh_store import open_mesh

    tmp, _ = runs
    snap = _snap(tmp)
    mesh, _ = open_mesh(tmp / "m.zarr")
    np.testing.assert_allclose(mesh.compute(), paint(snap, n_mesh=32).compute(),
                               rtol=1e-10, atol=1e-12)
    pk = pd.read_csv(tmp / "pk.csv")
    ref = power_spectrum(snap, n_mesh=32).compute()
    np.testing.assert_allclose(pk["power"].to_numpy(), ref["power"].values.ravel(),
                               rtol=1e-8)


def test_pse_mass(runs):
    from cosmo_dask.density import open_density_octree

    tmp, _ = runs
    octree = open_density_octree(tmp / "p.zarr")
    want = float(_snap(tmp).particle_masses().sum().compute())
    assert abs(octree.total_mass() / want - 1) < 1e-9


@pytest.mark.parametrize("method", ["pm", "treepm"])
def test_mesh_gravity_matches_cpu(runs, method):
    from cosmo_dask.gravity import accelerations, open_gravity

    tmp, _ = runs
    gpu = open_gravity(tmp / f"g_{method}.zarr")["acc"].values
    cpu, _ = accelerations(_snap(tmp), method=method, precision="float64", n_mesh=32)
    err = _rel(gpu, cpu.compute())
    print(f"{method}: GPU vs CPU median {np.median(err):.2e} max {err.max():.2e}")
    assert np.median(err) < (1e-10 if method == "pm" else 2e-3)


def test_tree_gravity_against_direct(runs):
    from cosmo_dask.gravity import accelerations, open_gravity
    from tests.support.gravity import reference

    tmp, _ = runs
    snap = _snap(tmp, "b.zarr")
    pos, mass = snap.pos.compute(), snap.particle_masses().compute()
    idx = np.arange(0, len(pos), 64)
    ref, _ = reference(pos, mass, targets=idx, G=snap.G, eps=0.05, box=snap.box_size)
    gpu = open_gravity(tmp / "g_tree.zarr")["acc"].values
    cpu, _ = accelerations(snap, method="tree", softening=0.05, precision="float64")
    e_gpu, e_cpu = np.median(_rel(gpu[idx], ref)), np.median(_rel(cpu.compute()[idx], ref))
    print(f"tree vs direct: GPU median {e_gpu:.2e}, CPU median {e_cpu:.2e}")
    assert e_gpu <= 5e-3 and e_gpu <= 2 * e_cpu + 1e-4


def test_expansions_match_cpu(runs):
    from cosmo_dask.expansion import SCF
    from cosmo_dask.expansion.output import open_expansion

    tmp, _ = runs
    snap = _snap(tmp, "hq.zarr")
    scf = open_expansion(tmp / "scf.zarr")
    ref = SCF(10, 6, scale_radius=1.0, center="com").fit(snap)
    acc = ref.accelerations(snap.pos).compute()
    assert np.median(_rel(scf["acc"].compute(), acc)) < 1e-8
    mex = open_expansion(tmp / "mex.zarr")
    assert np.all(np.isfinite(mex["acc"].compute()))
