"""Nothing lost around replacement (issue 36, items 5-7 and the smaller ones of 9): a
simulation store is replaced only once the new run has an output or checkpoint; a replace
killed between its two renames is put back by the next open, write or ``clean``; a live
writer's temporary store is never taken for a dead one; ``resume`` rewrites the outputs
after its checkpoint; names and targets stay out of other stores.

Kills are simulated deterministically: the state a kill leaves is built directly, or a
subprocess kills itself (SIGKILL, SIGTERM) at a chosen point of the write."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cosmo_dask import Snapshot, open_snapshot
from cosmo_dask.cli import main
from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.models import zeldovich
from cosmo_dask.simulation import SimulationInterrupted, open_simulation, run
from cosmo_dask.store.atomic import (
    MARKER_SUFFIX,
    STALE_SECONDS,
    atomic_directory,
    leftovers,
    process_start,
    writer_state,
)

REPO = Path(__file__).resolve().parents[2]
DEAD_PID = 999999999  # above any pid_max: no such process


def _ics(n_side=8):
    return zeldovich(n_side, box_size=500.0, redshift=19.0, seed=3, precision="float64",
                     chunks=n_side**3 // 4)


def _files(path: Path) -> dict:
    """Every file below ``path``: relative path -> bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _age(path: Path, seconds: float) -> None:
    """Set the mtime of ``path`` (and of every entry below it) ``seconds`` into the past."""
    t = time.time() - seconds
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (t, t))


def _marker(tmp: Path, host=None, pid=DEAD_PID, start=None) -> Path:
    marker = tmp.with_name(tmp.name + MARKER_SUFFIX)
    marker.write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid,
                                  "start": start}))
    return marker


# ----------------------------------------------------------------------------- simulate --overwrite
def test_overwrite_keeps_the_old_store_until_the_first_checkpoint(tmp_path):
    """An overwrite interrupted after step 1 (before its first output or checkpoint) leaves
    the old store byte for byte and no temporary directory; one interrupted after its first
    checkpoint (step 2) has replaced it by the new, resumable run. (Old code: the old store
    was deleted before step 1, so the first interrupt left a store of the new run with
    no output and no checkpoint.)"""
    ics = _ics()
    out = tmp_path / "sim"
    run(ics, n_steps=2, n_mesh=16, out=out, outputs=(5.0,))
    before = _files(out)
    with pytest.raises(SimulationInterrupted):
        run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=2, overwrite=True,
            _stop_after=1)
    assert _files(out) == before
    assert _hidden(tmp_path) == []
    with pytest.raises(SimulationInterrupted):
        run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=2, overwrite=True,
            _stop_after=3)
    sim = open_simulation(out)
    assert sim.parameters["n_steps"] == 4 and len(sim.log) == 3
    assert (out / "checkpoint" / "zarr.json").is_file() and _hidden(tmp_path) == []
    res = run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=2, resume=True)
    assert [r["step"] for r in res.log] == [1, 2, 3, 4]


def test_a_failed_new_run_leaves_no_out_directory(tmp_path):
    """A new run that fails before its first output or checkpoint leaves nothing at OUT
    and no temporary directory (old code: an OUT with a manifest and no output)."""
    with pytest.raises(SimulationInterrupted):
        run(_ics(), n_steps=3, n_mesh=16, out=tmp_path / "sim", _stop_after=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_simulation_json_has_the_permissions_of_any_new_file(tmp_path):
    """simulation.json is 0666 less the umask like every other output (old code: 0600)."""
    previous = os.umask(0o022)
    try:
        run(_ics(), n_steps=1, n_mesh=16, out=tmp_path / "sim", write_particles=False)
    finally:
        os.umask(previous)
    assert (tmp_path / "sim" / "simulation.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "sim" / "outputs").stat().st_mode & 0o777 == 0o755


# ----------------------------------------------------------------------------- interrupted replace
def _interrupted_replace(tmp_path, rng, *, with_new=True, marker=True):
    """``s.zarr`` replaced by a write killed between its two renames: the old store at
    ``.s.zarr.old-T``, the complete new one at ``.s.zarr.tmp-T``, nothing at ``s.zarr``,
    both a minute and a half old (so the 60 s rule of old code takes them for dead)."""
    old = Snapshot.from_arrays(rng.random((100, 3)), chunks=30)
    new = Snapshot.from_arrays(rng.random((80, 3)), chunks=40)
    old.to_zarr(tmp_path / "s.zarr")
    token = "0123456789ab"
    tmp = tmp_path / f".s.zarr.tmp-{token}"
    if with_new:
        new.to_zarr(tmp_path / "new.zarr")
        os.rename(tmp_path / "new.zarr", tmp)
    os.rename(tmp_path / "s.zarr", tmp_path / f".s.zarr.old-{token}")
    if marker:
        _marker(tmp)
    for p in tmp_path.iterdir():
        _age(p, 90)
    return old.pos.compute(), new.pos.compute()


@pytest.mark.parametrize("how", ["open", "write", "clean", "clean-no-marker"])
def test_a_replace_killed_between_its_renames_is_finished(tmp_path, rng, capsys, how):
    """The next open, write or `cosmo-dask clean` puts the complete new store at the
    target and removes the old one; nothing is lost (old code: no store at the target,
    and `clean` deleted both hidden siblings). Without a writer marker (a store of an
    older cosmo_dask), the same once the siblings are a minute old."""
    _, new = _interrupted_replace(tmp_path, rng, marker=how != "clean-no-marker")
    target = tmp_path / "s.zarr"
    if how == "open":
        np.testing.assert_array_equal(open_snapshot(target).pos.compute(), new)
    elif how == "write":
        with pytest.raises(SnapshotError, match="already exists"):
            Snapshot.from_arrays(rng.random((10, 3))).to_zarr(target)
    else:
        assert main(["clean", str(target)]) == 0
        assert "replace finished" in capsys.readouterr().out
    np.testing.assert_array_equal(open_snapshot(target).pos.compute(), new)
    assert _hidden(tmp_path) == []


def test_a_simulation_store_replace_killed_between_its_renames_is_finished_on_open(tmp_path):
    """The same for a simulation store (a plain directory): open_simulation finds the new
    run at its path (old code: "no such simulation store")."""
    out = tmp_path / "sim"
    run(_ics(), n_steps=1, n_mesh=16, out=out, write_particles=False, analyses=("power",))
    token = "0123456789ab"
    os.rename(out, tmp_path / f".sim.tmp-{token}")
    (tmp_path / f".sim.old-{token}").mkdir()
    _marker(tmp_path / f".sim.tmp-{token}")
    sim = open_simulation(out)
    assert sim.redshifts == [0.0] and sim.power(0.0).power.size > 0
    assert _hidden(tmp_path) == []


def test_a_replace_killed_after_moving_the_old_store_aside_puts_it_back(tmp_path, rng, capsys):
    """Only the old store, moved aside (the new one lost): `clean` puts it back."""
    old, _ = _interrupted_replace(tmp_path, rng, with_new=False)
    assert main(["clean", str(tmp_path / "s.zarr")]) == 0
    assert "restored" in capsys.readouterr().out
    np.testing.assert_array_equal(open_snapshot(tmp_path / "s.zarr").pos.compute(), old)
    assert _hidden(tmp_path) == []


def test_an_interrupted_replace_of_a_live_writer_is_left_alone(tmp_path, rng):
    """Between the renames of a writer that is still running (this process) nothing is
    moved: it is about to finish the replace itself."""
    _interrupted_replace(tmp_path, rng, marker=False)
    _marker(tmp_path / ".s.zarr.tmp-0123456789ab", pid=os.getpid(),
            start=process_start(os.getpid()))
    assert main(["clean", str(tmp_path / "s.zarr")]) == 0
    assert not (tmp_path / "s.zarr").exists()
    assert len(_hidden(tmp_path)) == 3


def test_an_interrupted_checkpoint_replace_is_recovered_by_resume(tmp_path):
    """A run killed between the renames of a checkpoint replace: `resume` finds the
    complete checkpoint (old code: "holds no checkpoint"; `clean` deleted it)."""
    ics = _ics()
    out = tmp_path / "sim"
    ref = run(ics, n_steps=4, n_mesh=16)
    with pytest.raises(SimulationInterrupted):
        run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=2, _stop_after=2)
    token = "0123456789ab"
    os.rename(out / "checkpoint", out / f".checkpoint.tmp-{token}")  # the complete one
    (out / f".checkpoint.old-{token}").mkdir()  # what it replaced
    _age(out / f".checkpoint.tmp-{token}", 90)
    res = run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=2, resume=True)
    assert np.array_equal(res.snapshot.pos.compute(), ref.snapshot.pos.compute())
    assert _hidden(out) == []


# ----------------------------------------------------------------------------- live writers
def test_a_live_writers_temporary_store_is_kept_by_clean_and_by_a_second_write(tmp_path, rng,
                                                                               capsys):
    """A writer still computing (its temporary store a Zarr group with arrays, unmodified for
    two minutes) is named by its marker (host, pid, start time) for the store's whole life:
    `clean` and a second write to the same target keep it, and it then completes
    (old code: the writer file was gone once arrays existed, and the store was deleted)."""
    import zarr

    target = tmp_path / "h.zarr"
    with atomic_directory(target, overwrite=True) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3,
                                attributes={"format": "cosmo_dask.test"})
        group.create_array("a", shape=(4,), dtype="f8")[:] = np.arange(4.0)
        _age(tmp, 120)
        assert main(["clean", str(target)]) == 0
        assert "kept (its writer (process" in capsys.readouterr().out
        with atomic_directory(target) as other:  # a second write to the same target
            (other / "zarr.json").write_text(json.dumps(
                {"zarr_format": 3, "node_type": "group",
                 "attributes": {"format": "cosmo_dask.test"}}))
        assert tmp.is_dir() and (tmp / "a" / "zarr.json").is_file()
        marker = json.loads(tmp.with_name(tmp.name + MARKER_SUFFIX).read_text())
        assert marker["pid"] == os.getpid() and marker["host"] == socket.gethostname()
        assert marker["start"] == pytest.approx(process_start(os.getpid()))
    assert zarr.open_group(str(target), mode="r")["a"][:].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert _hidden(tmp_path) == []


@pytest.mark.parametrize("case, alive", [
    ("dead pid", False),
    ("pid reused by a later process", False),
    ("this process", True),
    ("another host, recent", True),
    ("another host, silent past the limit", False),
])
def test_clean_removes_only_stores_whose_writer_is_gone(tmp_path, case, alive):
    """Same host: gone when the pid is not running or now belongs to a process with another
    start time; another host: kept unless its marker was not refreshed for STALE_SECONDS."""
    tmp = tmp_path / ".h.zarr.tmp-0123456789ab"
    tmp.mkdir()
    (tmp / "zarr.json").write_text("{}")
    me, start = os.getpid(), process_start(os.getpid())
    kw = {"dead pid": {},
          "pid reused by a later process": {"pid": me, "start": start - 1000.0},
          "this process": {"pid": me, "start": start},
          "another host, recent": {"host": "elsewhere-node-7", "pid": me},
          "another host, silent past the limit": {"host": "elsewhere-node-7", "pid": me}}[case]
    marker = _marker(tmp, **kw)
    _age(tmp, 120)
    if "past the limit" in case:
        _age(marker, STALE_SECONDS + 60)
    assert writer_state(tmp)[0] is alive
    assert [a for _, a in leftovers(tmp_path / "h.zarr")] == [alive]
    assert main(["clean", str(tmp_path / "h.zarr")]) == 0
    assert tmp.exists() is alive and marker.exists() is alive


_KILL_IN_CHECKPOINT = """
import os, signal, sys
import cosmo_dask.simulation.store as st
from cosmo_dask.models import zeldovich
from cosmo_dask.simulation import run

calls = []
plain = st.store_arrays
def store_arrays(group, arrays, **kw):
    plain(group, arrays, **kw)
    calls.append(1)
    if len(calls) == 2:  # the second checkpoint: arrays written, not yet renamed
        os.kill(os.getpid(), signal.SIGKILL)
st.store_arrays = store_arrays
ics = zeldovich(8, box_size=500.0, redshift=19.0, seed=3, precision="float64", chunks=128)
run(ics, n_steps=4, n_mesh=16, out=sys.argv[1], checkpoint_every=1)
"""


def test_a_checkpoint_temporary_store_of_a_killed_run_is_gone_after_resume(tmp_path):
    """SIGKILL while the second checkpoint is written (its arrays complete): the resume from
    the first is bit-identical and leaves no `.checkpoint.tmp-*` (old code: the killed
    writer had lost its writer file, so the fresh temporary store was taken for a live
    writer's and survived)."""
    out = tmp_path / "sim"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _KILL_IN_CHECKPOINT, str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [n for n in _hidden(out) if n.startswith(".checkpoint.tmp-")]
    ics = _ics()
    ref = run(ics, n_steps=4, n_mesh=16)
    res = run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=1, resume=True)
    assert np.array_equal(res.snapshot.pos.compute(), ref.snapshot.pos.compute())
    assert _hidden(out) == []


def test_clean_of_a_simulation_store_settles_its_checkpoint_and_outputs(tmp_path, capsys):
    """`cosmo-dask clean SIM` also removes dead writers' temporary stores next to its
    checkpoint and output members (old code: only SIM's own siblings were looked at)."""
    out = tmp_path / "sim"
    run(_ics(), n_steps=1, n_mesh=16, out=out, write_particles=False, analyses=("power",))
    name = open_simulation(out).outputs[0]["name"]
    power_tmp = out / "outputs" / name / ".power.tmp-0123456789ab"
    power_tmp.mkdir()
    _marker(power_tmp)
    checkpoint_tmp = out / ".checkpoint.tmp-ba9876543210"  # of an older cosmo_dask
    checkpoint_tmp.mkdir()
    _age(checkpoint_tmp, 90)
    assert main(["clean", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"{power_tmp}: removed" in said and f"{checkpoint_tmp}: removed" in said
    assert _hidden(out) == [] and _hidden(out / "outputs" / name) == []
    assert open_simulation(out).power(0.0).power.size > 0


_TERM_DURING_WRITE = """
import os, signal, sys, time
import cosmo_dask.store.zarr_write as zw
from cosmo_dask.cli import main

plain = zw.write_manifests
def write_manifests(*args, **kwargs):  # every chunk written, the store not yet renamed
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    return plain(*args, **kwargs)
zw.write_manifests = write_manifests
sys.exit(main(["--cpu", "--workers", "1", "generate", "plummer", sys.argv[1], "--n", "1000"]))
"""


def test_sigterm_during_a_write_leaves_no_temporary_directory(tmp_path):
    """SIGTERM is handled like Ctrl-C: one line, exit 143, the temporary store removed
    (old code: the default action ended the process and left `.out.zarr.tmp-*`)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _TERM_DURING_WRITE,
                           str(tmp_path / "out.zarr")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr
    assert "cosmo-dask: terminated" in proc.stderr.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- resume
def test_resume_of_a_finished_run_with_analyses_rewrites_the_later_outputs(tmp_path):
    """A finished run with P(k) at every output, resumed from its last checkpoint: the
    outputs after it are rewritten (same values), the earlier ones untouched (old code:
    "outputs/001_z0.0000/power: is a directory that is not a cosmo_dask store")."""
    ics = _ics()
    out = tmp_path / "sim"
    run(ics, n_steps=4, n_mesh=16, out=out, outputs=(5.0,), checkpoint_every=2,
        analyses=("power",))
    sim = open_simulation(out)
    names = [e["name"] for e in sim.outputs]
    assert [e["step"] for e in sim.outputs] == [2, 5]  # checkpoints after steps 2 and 4
    early = _files(out / "outputs" / names[0])
    p0 = sim.power(0.0)
    (out / "outputs" / names[1] / "power" / "zarr.json").unlink()  # a table of older code
    res = run(ics, n_steps=4, n_mesh=16, out=out, outputs=(5.0,), checkpoint_every=2,
              analyses=("power",), resume=True)
    assert [r["step"] for r in res.log] == [1, 2, 3, 4, 5]
    again = open_simulation(out)
    np.testing.assert_array_equal(again.power(0.0).power.values, p0.power.values)
    assert (out / "outputs" / names[1] / "power" / "zarr.json").is_file()
    assert _files(out / "outputs" / names[0]) == early
    assert _hidden(out) == [] and _hidden(out / "outputs" / names[1]) == []


# ----------------------------------------------------------------------------- paths
@pytest.mark.filterwarnings("ignore:Object at s is not recognized")
@pytest.mark.parametrize("store, message", [("ic.zarr", "lies inside the input"),
                                            ("other.zarr", "lies inside the Zarr store")])
def test_a_simulation_into_an_empty_directory_inside_a_store_is_refused(tmp_path, store,
                                                                          message):
    """`simulate ic.zarr ic.zarr/s --overwrite` (or into any other store): refused before
    any work, the store unchanged (old code: the run wrote into the ICs store)."""
    ics = tmp_path / "ic.zarr"
    _ics().to_zarr(ics)
    if store != "ic.zarr":
        _ics().to_zarr(tmp_path / store)
    (tmp_path / store / "s").mkdir()
    before = _files(tmp_path / store)
    with pytest.raises(ParameterError, match=message):
        run(open_snapshot(ics), n_steps=1, n_mesh=16, out=tmp_path / store / "s",
            overwrite=True)
    assert _files(tmp_path / store) == before
    assert sorted(p.name for p in (tmp_path / store / "s").iterdir()) == []


def test_a_directory_named_like_a_temporary_store_inside_a_store_is_still_inside(tmp_path,
                                                                                  rng):
    store = tmp_path / "s.zarr"
    Snapshot.from_arrays(rng.random((10, 3))).to_zarr(store)
    (store / ".x.tmp-0123456789ab").mkdir()
    with pytest.raises(SnapshotError, match="inside the Zarr store"):
        Snapshot.from_arrays(rng.random((10, 3))).to_zarr(store / ".x.tmp-0123456789ab" / "y")


@pytest.mark.parametrize("name", ["../../victim", "/abs/victim", "a/../../victim", "..", ""])
def test_output_names_from_the_manifest_stay_inside_the_store(tmp_path, name):
    """A simulation.json naming an output outside the store is refused on opening, with
    one line naming the file (old code: snapshot(z), power() and halos() read the other
    store)."""
    ics = _ics()
    victim = tmp_path / "victim" / "snapshot"
    victim.parent.mkdir()
    ics.to_zarr(victim)
    out = tmp_path / "sim"  # outputs/../../victim is tmp_path/victim
    run(ics, n_steps=1, n_mesh=16, out=out)
    doc = json.loads((out / "simulation.json").read_text())
    doc["outputs"][0]["name"] = name
    (out / "simulation.json").write_text(json.dumps(doc))
    with pytest.raises(SnapshotError, match=r"simulation.json: output name .* is not a "
                                            r"directory name inside the store"):
        open_simulation(out).snapshot(0.0)
