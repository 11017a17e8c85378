"""Bad outputs never touch an input: every case is refused with one line (exit 2) before
any work, and the input stores hash the same, byte for byte, before and after."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.cli import main
from cosmo_dask.core.errors import SnapshotError
from cosmo_dask.halos.result import FORMAT as HALOS
from cosmo_dask.store.atomic import WRITER_FILE, atomic_directory, leftovers


def tree_hash(path: Path) -> str:
    """sha256 over every file's relative path and bytes below ``path`` (or of one file)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path.parent)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A directory with a snapshot store ``p/s.zarr`` and an ordinary folder ``victim``."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    (tmp_path / "p").mkdir()
    Snapshot.from_arrays(rng.random((4000, 3)) * 10.0, rng.normal(size=(4000, 3)),
                         ids=np.arange(4000), box_size=10.0, particle_mass=1.0,
                         chunks=1000).to_zarr(tmp_path / "p" / "s.zarr")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "notes.txt").write_text("keep me")
    (tmp_path / "pk.csv").write_text("k,power\n")
    (tmp_path / "pk.png").write_bytes(b"\x89PNG")
    return tmp_path


CASES = {
    "halos onto its input": (["halos", "p/s.zarr", "p/s.zarr", "--overwrite"], "is the input"),
    "halos onto the input's folder": (["halos", "p/s.zarr", "p", "--overwrite"],
                                      "contains the input"),
    "halos into an input array": (["halos", "p/s.zarr", "p/s.zarr/pos", "--overwrite"],
                                  "inside the input"),
    "gravity onto the velocities": (["gravity", "p/s.zarr", "p/s.zarr/vel", "--G", "1",
                                     "--overwrite"], "inside the input"),
    "density onto an ordinary folder": (["density", "p/s.zarr", "victim", "--overwrite"],
                                        "not a cosmo_dask store"),
    "pse onto an ordinary folder": (["density", "p/s.zarr", "victim", "--method", "pse",
                                     "--overwrite"], "not a cosmo_dask store"),
    "expand onto its input": (["expand", "p/s.zarr", "p/s.zarr", "--center", "5,5,5",
                               "--overwrite"], "is the input"),
    "power table onto the store's metadata": (
        ["power", "p/s.zarr", "--out", "p/s.zarr/zarr.json", "--overwrite"], ".csv or .nc"),
    "power table into the store": (
        ["power", "p/s.zarr", "--out", "p/s.zarr/pk.csv", "--overwrite"], "inside the Zarr"),
    "power table onto an existing file": (["power", "p/s.zarr", "--out", "pk.csv"],
                                          "already exists; pass --overwrite"),
    "power table in an unknown format": (["power", "p/s.zarr", "--out", "pk.json"], ".csv or .nc"),
    "plot in an unknown format": (["density", "p/s.zarr", "m.zarr", "--plot", "x.json"],
                                  "matplotlib cannot write '.json'"),
    "plot onto an existing file": (["power", "p/s.zarr", "--plot", "pk.png"],
                                   "already exists; pass --overwrite"),
    "generate into a store": (["generate", "plummer", "p/s.zarr/new.zarr", "--n", "100"],
                              "inside the Zarr store"),
    # a directory nobody may create entries in (root too): found before any work
    "halos into an unwritable directory": (["halos", "p/s.zarr", "/proc/h.zarr"],
                                           "cannot create the halo store in /proc"),
    "power table into an unwritable directory": (["power", "p/s.zarr", "--out", "/proc/pk.csv"],
                                                 "cannot create the file in /proc"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_output_is_refused_and_inputs_are_untouched(work, capsys, case):
    argv, message = CASES[case]
    before = {name: tree_hash(work / name) for name in ("p", "victim", "pk.csv", "pk.png")}
    t0 = time.perf_counter()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert "Traceback" not in err[0] and "overwrite=True" not in err[0]
    assert time.perf_counter() - t0 < 30  # refused before any work (no cluster started)
    assert {name: tree_hash(work / name) for name in before} == before
    assert not [p for p in work.rglob(".*.tmp-*")]


def test_overwrite_replaces_a_store_of_the_same_kind_or_an_empty_folder(tmp_path):
    with atomic_directory(tmp_path / "h.zarr", what="halo store", fmt=HALOS) as tmp:
        (tmp / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", '
                                       f'"attributes": {{"format": "{HALOS}"}}}}')
    with atomic_directory(tmp_path / "h.zarr", overwrite=True, what="halo store",
                          fmt=HALOS) as tmp:
        (tmp / "zarr.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    with atomic_directory(tmp_path / "empty", overwrite=True, fmt=HALOS):
        pass
    with pytest.raises(SnapshotError, match="format 'cosmo_dask.mesh'"), atomic_directory(
            tmp_path / "h.zarr", overwrite=True, fmt="cosmo_dask.mesh"):
        pass  # h.zarr now holds a zarr.json without the format: refused as well
    assert (tmp_path / "h.zarr" / "zarr.json").read_text() == "{}"


def test_killed_write_leftovers_are_removed_by_the_next_write_and_by_clean(tmp_path, capsys):
    dead = tmp_path / ".h.zarr.tmp-0123456789ab"
    dead.mkdir()
    (dead / "junk").write_bytes(b"x" * 1000)
    (dead / WRITER_FILE).write_text(f"{os.uname().nodename} 999999999\n")  # no such process
    alive = tmp_path / ".h.zarr.tmp-ba9876543210"
    alive.mkdir()
    (alive / WRITER_FILE).write_text(f"{os.uname().nodename} {os.getpid()}\n")
    other = tmp_path / ".other.zarr.tmp-0123456789ab"
    other.mkdir()
    assert [(p.name, a) for p, a in leftovers(tmp_path / "h.zarr")] == [
        (dead.name, False), (alive.name, True)]
    assert main(["clean", str(tmp_path / "h.zarr")]) == 0
    out = capsys.readouterr().out
    assert f"{dead}: removed" in out and f"{alive}: kept" in out
    assert not dead.exists() and alive.exists() and other.exists()
    (alive / WRITER_FILE).write_text(f"{os.uname().nodename} 999999999\n")  # now dead
    with atomic_directory(tmp_path / "h.zarr"):
        pass
    assert not alive.exists() and other.exists()
    assert not (tmp_path / "h.zarr" / WRITER_FILE).exists()  # not left in the store


# ------------------------------------------------------------------ missing and altered chunks
def _store(tmp_path, **kw):
    rng = np.random.default_rng(2)
    path = tmp_path / "s.zarr"
    Snapshot.from_arrays(rng.random((4000, 3)) * 10.0, np.zeros((4000, 3)),
                         ids=np.arange(4000), box_size=10.0, particle_mass=1.0,
                         chunks=1000).to_zarr(path)
    return path


def test_every_chunk_is_written_and_recorded(tmp_path):
    import zarr

    from cosmo_dask.store.chunk_manifest import MANIFEST

    path = _store(tmp_path)
    vel = zarr.open_group(str(path), mode="r")["vel"]  # all zeros = the fill value
    assert sorted(p.name for p in (path / "vel" / "c").iterdir()) == ["0", "1", "2", "3"]
    assert vel.attrs[MANIFEST]["n_chunks"] == 4


@pytest.mark.parametrize("array", ["pos", "vel"])
def test_a_deleted_chunk_is_an_error_on_every_path(tmp_path, capsys, array):
    from cosmo_dask import open_snapshot
    from cosmo_dask.core.errors import SnapshotError

    path = _store(tmp_path)
    (path / array / "c" / "1" / "0").unlink()
    before = tree_hash(path)
    with pytest.raises(SnapshotError, match=f"array '{array}': chunk c/1/0 is missing"):
        open_snapshot(path)
    for argv in (["info", str(path)], ["halos", str(path), str(tmp_path / "h.zarr")],
                 ["power", str(path), "--n-mesh", "16"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"array '{array}': chunk c/1/0 is missing" in err and "Traceback" not in err
    assert tree_hash(path) == before and not (tmp_path / "h.zarr").exists()


def test_an_altered_chunk_is_an_error(tmp_path):
    from cosmo_dask import open_snapshot
    from cosmo_dask.core.errors import SnapshotError

    path = _store(tmp_path)
    chunk = path / "pos" / "c" / "2" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-8])
    with pytest.raises(SnapshotError, match="chunk c/2/0 has 23992 bytes, 24000 when"):
        open_snapshot(path)


def test_a_chunk_altered_in_place_fails_the_full_check(tmp_path, capsys):
    """Same size, other bytes: the size manifest cannot see it, the CRC-32 does."""
    import zlib

    import zarr

    from cosmo_dask import open_snapshot
    from cosmo_dask.store.chunk_manifest import MANIFEST

    path = _store(tmp_path)
    chunk = path / "pos" / "c" / "2" / "0"
    manifest = zarr.open_group(str(path), mode="r")["pos"].attrs[MANIFEST]
    assert manifest["crc32"][2] == zlib.crc32(chunk.read_bytes())  # recorded as written
    assert open_snapshot(path).validate(full=True).ok
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0x01  # one bit of one coordinate, still a valid value inside the box
    chunk.write_bytes(bytes(data))
    snap = open_snapshot(path)  # sizes agree: opening reads no data
    report = snap.validate(full=True, raise_errors=False)
    assert not report.ok and len(report.problems) == 1
    assert "array 'pos': chunk c/2/0 does not match the CRC-32" in report.problems[0]
    assert main(["info", str(path)]) == 1
    out = capsys.readouterr().out
    assert "chunk c/2/0 does not match the CRC-32" in out


def test_foreign_store_missing_chunk_needs_explicit_permission(tmp_path):
    from cosmo_dask import open_snapshot
    from cosmo_dask.core.errors import SnapshotError
    from tests.support.stores import good_attrs, write_raw_store

    pos = np.random.default_rng(3).random((256, 3))
    path = write_raw_store(tmp_path / "raw.zarr", {"pos": pos}, good_attrs(box_size=1.0),
                           chunks=64)
    (path / "pos" / "c" / "3" / "0").unlink()
    with pytest.raises(SnapshotError, match="chunk c/3/0 missing.*allow_missing_chunks=True"):
        open_snapshot(path)
    got = open_snapshot(path, allow_missing_chunks=True, check=False).pos.compute()
    np.testing.assert_array_equal(got[:192], pos[:192])
    assert np.all(got[192:] == 0)


def test_product_chunk_deleted(tmp_path):
    import dask.array as da
    import xarray as xr

    from cosmo_dask.core.errors import SnapshotError
    from cosmo_dask.halos.result import HaloResult, open_catalog

    labels = da.from_array(np.arange(100) % 3 - 1, chunks=25)
    catalog = xr.Dataset({"n_members": ("halo", np.array([34, 33], np.int64))})
    path = HaloResult(labels, catalog, {}).to_zarr(tmp_path / "h.zarr")
    (Path(path) / "labels" / "c" / "2").unlink()
    with pytest.raises(SnapshotError, match="array 'labels': chunk c/2 is missing"):
        open_catalog(path)


def test_halo_catalog_chunk_deleted(tmp_path):
    """The catalog (written through xarray) is recorded and checked like every array."""
    import dask.array as da
    import xarray as xr

    from cosmo_dask.core.errors import SnapshotError
    from cosmo_dask.halos.result import HaloResult, open_catalog

    labels = da.from_array(np.arange(100) % 3 - 1, chunks=25)
    catalog = xr.Dataset({"n_members": ("halo", np.array([34, 33], np.int64)),
                          "spin": ("halo", np.zeros(2))})  # all fill value: still written
    path = HaloResult(labels, catalog, {}).to_zarr(tmp_path / "h.zarr")
    np.testing.assert_array_equal(open_catalog(path).catalog["n_members"], [34, 33])
    (Path(path) / "catalog" / "spin" / "c" / "0").unlink()
    with pytest.raises(SnapshotError, match="array 'catalog/spin': chunk c/0 is missing"):
        open_catalog(path)


# ------------------------------------------------------------------ paths on a real cluster
@pytest.fixture
def remote_cluster(tmp_path):
    """A scheduler and two worker processes started in another directory (as on a cluster
    whose workers do not share the client's working directory)."""
    import subprocess
    import sys

    from distributed import LocalCluster

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=":0") as cluster:
        procs = [subprocess.Popen([sys.executable, "-m", "dask", "worker",
                                   cluster.scheduler_address, "--nthreads", "1",
                                   "--no-dashboard", "--host", "127.0.0.1"],
                                  cwd=elsewhere, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for _ in range(2)]
        try:
            from distributed import Client

            with Client(cluster.scheduler_address, set_as_default=False) as c:
                c.wait_for_workers(2, timeout=60)
            yield cluster.scheduler_address, elsewhere
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_relative_paths_and_missing_chunks_on_workers_elsewhere(tmp_path, monkeypatch,
                                                                capsys, remote_cluster):
    from cosmo_dask import open_snapshot
    from cosmo_dask.halos.result import open_catalog

    address, elsewhere = remote_cluster
    base = tmp_path / "base"
    base.mkdir()
    monkeypatch.chdir(base)
    rng = np.random.default_rng(4)
    centres = rng.random((20, 3)) * 10.0
    pos = (centres[rng.integers(0, 20, 4000)] + 0.05 * rng.normal(size=(4000, 3))) % 10.0
    Snapshot.from_arrays(pos, ids=np.arange(4000), box_size=10.0, particle_mass=1.0,
                         chunks=1000).to_zarr("s.zarr")
    # relative paths, workers in another directory: the right halos, written where asked
    assert main(["--scheduler", address, "halos", "s.zarr", "h.zarr", "--linking-length",
                 "0.05", "--absolute", "--min-members", "20", "--centers", ""]) == 0
    out = capsys.readouterr().out
    labels = open_catalog(base / "h.zarr").labels.compute()
    assert (labels >= 0).sum() > 3000 and "20 halos" in out, out
    assert not list(elsewhere.rglob("*.zarr"))  # nothing written in the workers' directory
    # a deleted chunk is an error there too, before any work
    (base / "s.zarr" / "pos" / "c" / "2" / "0").unlink()
    assert main(["--scheduler", address, "halos", "s.zarr", "h2.zarr"]) == 2
    assert "chunk c/2/0 is missing" in capsys.readouterr().err
    with pytest.raises(Exception, match="chunk c/2/0 is missing"):
        open_snapshot("s.zarr")


@pytest.mark.timeout(120)
def test_workers_that_cannot_see_a_path_are_named(client, tmp_path):
    from cosmo_dask.core.errors import ClusterError
    from cosmo_dask.store.atomic import check_worker_paths

    check_worker_paths(client, inputs=[tmp_path], outputs=[tmp_path / "out.zarr"])
    with pytest.raises(ClusterError, match="the workers cannot see this path"):
        check_worker_paths(client, inputs=[tmp_path / "nowhere.zarr"])
    with pytest.raises(ClusterError, match="cannot write into this directory"):
        check_worker_paths(client, outputs=[tmp_path / "no" / "out.zarr"])


# ------------------------------------------------------------------ clear one-line errors
def test_garbage_array_metadata_is_named(work, capsys):
    meta = work / "p" / "s.zarr" / "vel" / "zarr.json"
    meta.write_text("garbage{")
    before = tree_hash(work / "p")
    assert main(["info", "p/s.zarr"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "vel/zarr.json: unreadable array metadata" in err
    assert tree_hash(work / "p") == before


def test_an_empty_snapshot_is_reported_not_a_crash(tmp_path, capsys):
    path = Snapshot.from_arrays(np.zeros((0, 3)), box_size=1.0, particle_mass=1.0).to_zarr(
        tmp_path / "e.zarr")
    before = tree_hash(Path(path))
    assert main(["info", path]) == 1
    out = capsys.readouterr()
    assert "holds no particles (N = 0)" in out.out and "Traceback" not in out.err
    assert tree_hash(Path(path)) == before


def test_mesh_sizes_are_checked_before_any_work(work, capsys, monkeypatch):
    import importlib

    from cosmo_dask import open_snapshot
    from cosmo_dask.core.errors import ParameterError
    from cosmo_dask.density import paint

    paint_module = importlib.import_module("cosmo_dask.density.painting")

    before = tree_hash(work / "p")
    assert main(["power", "p/s.zarr", "--n-mesh", "1"]) == 2
    assert "--n-mesh must be at least 2" in capsys.readouterr().err
    t0 = time.perf_counter()
    assert main(["power", "p/s.zarr", "--n-mesh", "4097"]) == 2
    err = capsys.readouterr().err
    assert "--n-mesh 4097 is larger than 4096" in err and "pencil decomposition" in err
    assert main(["power", "p/s.zarr", "--n-mesh", "1031"]) == 2
    assert "--n-mesh 1031 has the prime factor 1031" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 60
    snap = open_snapshot(work / "p" / "s.zarr")
    monkeypatch.setattr(paint_module, "memory_per_worker", lambda gpu: (2**27, "worker"))
    with pytest.raises(ParameterError, match="n_mesh=512 needs at least 1.0 GiB .*more than "
                                             "the 0.1 GiB of one worker.*about 256"):
        paint(snap, n_mesh=512)
    assert paint(snap, n_mesh=256).shape == (256, 256, 256)  # fits: nothing computed here
    monkeypatch.setattr(paint_module, "memory_per_worker", lambda gpu: (2**30, "worker"))
    with pytest.raises(ParameterError, match="the largest n_mesh that fits is about 512"):
        paint(snap, n_mesh=1024)
    assert tree_hash(work / "p") == before


def test_pse_of_particles_at_one_point_through_the_cli(tmp_path, capsys):
    """Every tetrahedron degenerate: the whole mass in one cell, not a crash (the API
    case is in test_pse_density.py)."""
    from cosmo_dask.density import open_density_octree

    n = 8
    path = Snapshot.from_arrays(np.tile([1.3, 0.4, 2.2], (n**3, 1)), np.zeros((n**3, 3)),
                                ids=np.arange(n**3), box_size=3.0, particle_mass=1.0,
                                lagrangian_shape=(n, n, n)).to_zarr(tmp_path / "pt.zarr")
    before = tree_hash(Path(path))
    assert main(["--cpu", "--workers", "1", "density", path, str(tmp_path / "o.zarr"),
                 "--method", "pse", "--patch-size", "4"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    octree = open_density_octree(tmp_path / "o.zarr")
    assert octree.total_mass() == pytest.approx(n**3, rel=1e-12)
    assert tree_hash(Path(path)) == before


# ------------------------------------------------------------------ losing the scheduler
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_losing_the_scheduler_is_one_line_within_10_s(tmp_path):
    """A real scheduler process killed mid-run: the CLI exits with one line naming its
    address, no traceback and no log noise, within 10 s."""
    import signal
    import subprocess
    import sys

    rng = np.random.default_rng(5)
    n = 60_000  # direct summation: minutes of work, so the run is surely under way
    Snapshot.from_arrays(rng.random((n, 3)), ids=np.arange(n), particle_mass=1.0 / n,
                         chunks=15_000).to_zarr(tmp_path / "s.zarr")
    sched = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                              "--port", "0", "--no-dashboard", "--scheduler-file",
                              str(tmp_path / "sched.json")], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [sched]
    before = tree_hash(tmp_path / "s.zarr")
    try:
        deadline = time.time() + 60
        while not (tmp_path / "sched.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", "--scheduler-file",
             str(tmp_path / "sched.json"), "--nthreads", "2", "--no-dashboard", "--host",
             "127.0.0.1"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cli = subprocess.Popen(
            [sys.executable, "-m", "cosmo_dask", "--scheduler", str(tmp_path / "sched.json"),
             "gravity", str(tmp_path / "s.zarr"), str(tmp_path / "g.zarr"), "--method",
             "direct", "--G", "1", "--softening", "0.01"], cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(cli)
        lines = []
        for line in cli.stderr:  # progress goes to stderr: wait until the work has started
            lines.append(line)
            if line.startswith("[") and "started" in line:
                break
        assert cli.poll() is None, "".join(lines)
        sched.send_signal(signal.SIGKILL)
        t0 = time.time()
        rest = cli.stderr.read()
        cli.wait(timeout=60)
        seconds = time.time() - t0
        err = [ln for ln in rest.splitlines() if not ln.startswith("[")]  # progress lines
        address = json.loads((tmp_path / "sched.json").read_text())["address"]
        assert cli.returncode == 1
        assert seconds < 10, seconds
        assert len(err) == 1 and re.fullmatch(
            rf"cosmo-dask: error: lost the connection to the Dask scheduler at "
            rf"{re.escape(address)} \(\w+\) \(run with --verbose for the traceback\)",
            err[0]), rest
        assert not (tmp_path / "g.zarr").exists()
        assert tree_hash(tmp_path / "s.zarr") == before
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def test_checksums_run_on_this_machine_when_the_cluster_has_fewer_threads(tmp_path):
    """A local GPU cluster has one thread per GPU: the CRC-32 pass (file reads, no GPU)
    then runs on this machine's threads, and finds the same altered chunk."""
    from distributed import Client, LocalCluster

    from cosmo_dask import open_snapshot
    from cosmo_dask.store.chunk_manifest import _checksum_scheduler

    path = _store(tmp_path)
    chunk = path / "vel" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[50] ^= 0x01
    chunk.write_bytes(bytes(data))
    cores = os.cpu_count() or 1
    for threads, where in ((1, "threads" if cores > 1 else None), (cores, None)):
        with LocalCluster(n_workers=1, threads_per_worker=threads, processes=False,
                          dashboard_address=":0") as cluster, \
                Client(cluster, set_as_default=False) as client, client.as_current():
            assert _checksum_scheduler() == where
            report = open_snapshot(path).validate(full=True, raise_errors=False)
            assert [p for p in report.problems if "chunk c/1/0 does not match" in p]
    assert _checksum_scheduler() is None  # no client: dask's own choice
