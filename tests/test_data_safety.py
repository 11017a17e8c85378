"""Bad outputs never touch an input: every case is refused with one line (exit 2) before
any work, and the input stores hash the same, byte for byte, before and after."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.atomic import WRITER_FILE, atomic_directory, leftovers
from cosmo_dask.cli import main
from cosmo_dask.errors import SnapshotError
from cosmo_dask.halos.result import FORMAT as HALOS


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
