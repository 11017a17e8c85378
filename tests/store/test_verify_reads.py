"""Every read verifies each chunk's CRC-32 against the manifest written with it, and a
store's metadata is cross-checked before any chunk is listed (issue 36, failures 1, 2 and
the metadata part of 4).

Reproductions: a same-size byte flip in an input ``pos`` chunk made ``halos`` and
``power`` exit 0 with wrong answers; an XOR in a checkpoint chunk resumed silently into a
wrong state; shapes edited 4096 -> 4000 in every ``zarr.json`` were "valid, 4000
particles"; ``"shape": [1e12, 3]`` made ``info --quick`` list every chunk (24 GB).
"""

from __future__ import annotations

import json
import pickle
import time
import tracemalloc
import zlib
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr

from cosmo_dask import Snapshot, open_snapshot
from cosmo_dask.cli import main
from cosmo_dask.core.errors import ChecksumError, SnapshotError
from cosmo_dask.store.chunk_manifest import MANIFEST, VerifiedStore, crc32_combine, verified_store

N, CHUNK, BOX = 4096, 1024, 16.0
ALTERED = "chunk c/1/0 does not match the CRC-32 recorded when it was written"


@pytest.fixture
def on_cluster(_session_client):
    """argv prefix running a CLI command on the session's cluster (tests/conftest.py)."""
    return ["--scheduler", _session_client.scheduler.address]


def _store(tmp_path: Path, name="s.zarr", **kw) -> tuple[Path, np.ndarray]:
    """A 4096-particle store (chunks of 1024) of clumpy positions, and the positions."""
    rng = np.random.default_rng(7)
    centres = rng.random((40, 3)) * BOX
    pos = (centres[rng.integers(0, 40, N)] + rng.normal(scale=0.15, size=(N, 3))) % BOX
    path = tmp_path / name
    Snapshot.from_arrays(pos, rng.normal(size=(N, 3)), ids=np.arange(N), box_size=BOX,
                         particle_mass=1.0, chunks=CHUNK).to_zarr(path, **kw)
    return path, pos


def _error_line(err: str) -> str:
    """The CLI's one error line (the last of stderr; worker logs of the failed task are
    another matter: the CLI's logging, not the read)."""
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("cosmo-dask: error")]
    assert len(lines) == 1 and err.strip().endswith(lines[0]), err
    return lines[0]


def _flip(chunk: Path, offsets=(100,)) -> None:
    """Same size, other bytes: one low mantissa bit of a float64 (a value still inside the
    box, so the value checks cannot see it)."""
    data = bytearray(chunk.read_bytes())
    for o in offsets:
        data[o] ^= 0x01
    chunk.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- snapshots
def test_a_flipped_byte_fails_every_snapshot_read(tmp_path):
    path, pos = _store(tmp_path)
    _flip(path / "pos" / "c" / "1" / "0")
    with pytest.raises(ChecksumError, match=f"s.zarr: array 'pos': {ALTERED}") as err:
        open_snapshot(path).pos.compute()
    assert "\n" not in str(err.value) and isinstance(err.value, SnapshotError)
    # a task reading part of a chunk checksums the rest of the chunk file too
    with pytest.raises(ChecksumError, match=ALTERED):
        open_snapshot(path, chunks=700).pos.compute()
    with pytest.raises(ChecksumError, match=ALTERED):  # the unchecked twin verifies too
        open_snapshot(path, check=False).pos[1500:1600].compute()
    # untouched chunks and arrays read as before
    np.testing.assert_array_equal(open_snapshot(path).pos[:CHUNK].compute(), pos[:CHUNK])
    open_snapshot(path).vel.compute()
    # the opt-out reads the altered bytes: one coordinate differs from what was written
    got = open_snapshot(path, verify=False).pos.compute()
    assert (got != pos).sum() == 1 and got[CHUNK + 4, 0] != pos[CHUNK + 4, 0]
    with dask.config.set({"cosmo_dask.verify": False}):
        np.testing.assert_array_equal(open_snapshot(path).pos.compute(), got)


def test_verified_reads_of_intact_stores_are_unchanged(tmp_path):
    path, pos = _store(tmp_path)
    for chunks in (None, 700, 2048, 3000):
        np.testing.assert_array_equal(open_snapshot(path, chunks=chunks).pos.compute(), pos)
    zpath, _ = _store(tmp_path, "z.zarr", compressor="zstd")
    np.testing.assert_array_equal(open_snapshot(zpath, chunks=700).pos.compute(), pos)


def test_a_flipped_byte_in_a_compressed_chunk(tmp_path):
    path, _ = _store(tmp_path, compressor="zstd")
    chunk = path / "pos" / "c" / "1" / "0"
    raw = chunk.read_bytes()
    _flip(chunk, (len(raw) - 5,))  # inside the compressed frame (zstd does not check it)
    with pytest.raises(ChecksumError, match=ALTERED):
        open_snapshot(path).pos.compute()


def test_a_chunk_deleted_after_opening_is_not_read_as_zeros(tmp_path):
    path, _ = _store(tmp_path)
    snap = open_snapshot(path)
    (path / "vel" / "c" / "2" / "0").unlink()
    with pytest.raises(ChecksumError, match="array 'vel': chunk c/2/0 is missing"):
        snap.vel.compute()


def test_halos_and_power_api_refuse_a_flipped_chunk(tmp_path, client):
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.halos import fof

    path, _ = _store(tmp_path)
    _flip(path / "pos" / "c" / "1" / "0", (100, 2000, 5000))
    with pytest.raises(ChecksumError, match=ALTERED):
        fof(open_snapshot(path), min_members=5)
    with pytest.raises(ChecksumError, match=ALTERED):
        power_spectrum(open_snapshot(path), n_mesh=16).compute()
    res = fof(open_snapshot(path, verify=False), min_members=5)  # the opt-out runs
    assert res.labels.shape == (N,)


@pytest.mark.timeout(120)  # halos waited forever on a failed read (issue 36, failure 3)
@pytest.mark.parametrize("command", ["power", "halos"])
def test_halos_and_power_cli_refuse_a_flipped_chunk(tmp_path, capsys, on_cluster, command):
    path, _ = _store(tmp_path)
    _flip(path / "pos" / "c" / "1" / "0", (100, 2000, 5000))
    before = path.joinpath("pos", "c", "1", "0").read_bytes()
    argv = {"halos": ["halos", str(path), str(tmp_path / "h.zarr"), "--min-members", "5"],
            "power": ["power", str(path), "--n-mesh", "16"]}[command]
    assert main([*on_cluster, *argv]) == 2
    line = _error_line(capsys.readouterr().err)
    assert ALTERED in line and "s.zarr: array 'pos'" in line, line
    assert not (tmp_path / "h.zarr").exists()
    assert path.joinpath("pos", "c", "1", "0").read_bytes() == before
    # --no-verify: as a global option or after the command
    assert main([*on_cluster, "--no-verify", *argv]) == 0
    assert main([*on_cluster, *argv, "--no-verify", *(["--overwrite"] if command == "halos"
                                                      else [])]) == 0


# ----------------------------------------------------------------------------- products
def test_product_reads_verify(tmp_path):
    from cosmo_dask.halos import fof, open_catalog

    path, _ = _store(tmp_path)
    out = tmp_path / "h.zarr"
    fof(open_snapshot(path), min_members=5).to_zarr(out)
    labels = open_catalog(out).labels.compute()
    chunk = next(p for p in sorted((out / "labels" / "c").rglob("*")) if p.is_file())
    _flip(chunk, (3,))
    with pytest.raises(ChecksumError, match=r"h.zarr: array 'labels': chunk c/0 does not "):
        open_catalog(out).labels.compute()
    with dask.config.set({"cosmo_dask.verify": False}):
        got = open_catalog(out).labels.compute()
    assert (got != labels).sum() == 1
    _flip(chunk, (3,))  # restored; now a catalog variable (read through xarray)
    open_catalog(out)
    _flip(out / "catalog" / "n_members" / "c" / "0", (0,))
    with pytest.raises(ChecksumError, match="catalog: array 'n_members': chunk c/0 does not"):
        open_catalog(out)


def test_verified_store_pickles_and_passes_unmanifested_arrays(tmp_path):
    root = tmp_path / "g.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    g.create_array("plain", shape=(10,), chunks=(5,), dtype="f8")[:] = np.arange(10.0)
    store = pickle.loads(pickle.dumps(verified_store(root)))
    assert isinstance(store, VerifiedStore) and store.root == Path(root)
    back = zarr.open_group(store, mode="r")
    np.testing.assert_array_equal(back["plain"][:], np.arange(10.0))  # no manifest: read


# ----------------------------------------------------------------------------- checkpoints
def _killed_run(tmp_path):
    from cosmo_dask.models import zeldovich
    from cosmo_dask.simulation import run
    from cosmo_dask.simulation.runner import SimulationInterrupted

    ics = zeldovich(16, box_size=500.0, redshift=19.0, seed=3, precision="float64",
                    chunks=16**3 // 4)
    out = tmp_path / "sim"
    with pytest.raises(SimulationInterrupted):
        run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=2, _stop_after=3)
    return ics, out


def _xor_every_97th(chunk: Path) -> None:
    """XOR one byte of every 97th float64 (the reproduction's damage)."""
    data = bytearray(chunk.read_bytes())
    for i in range(0, len(data) // 8, 97):
        data[8 * i + 3] ^= 0x5A
    chunk.write_bytes(bytes(data))


def test_a_corrupted_checkpoint_does_not_resume(tmp_path):
    from cosmo_dask.simulation import run
    from cosmo_dask.simulation.store import read_checkpoint

    ics, out = _killed_run(tmp_path)
    _xor_every_97th(out / "checkpoint" / "pos" / "c" / "1" / "0")
    with pytest.raises(ChecksumError, match="checkpoint: array 'pos': chunk c/1/0 does not"):
        run(ics, n_steps=4, n_mesh=16, out=out, checkpoint_every=2, resume=True)
    arrays, _ = read_checkpoint(out, verify=False)  # the opt-out reads the damage
    assert np.isfinite(arrays["pos"].compute()).all()


def test_simulate_resume_cli_refuses_a_corrupted_checkpoint(tmp_path, capsys, on_cluster):
    ics, out = _killed_run(tmp_path)
    ics.to_zarr(tmp_path / "ics.zarr")
    _xor_every_97th(out / "checkpoint" / "pos" / "c" / "1" / "0")
    argv = [*on_cluster, "simulate", str(tmp_path / "ics.zarr"), str(out), "--steps", "4",
            "--n-mesh", "16", "--checkpoint-every", "2", "--resume"]
    assert main(argv) == 2
    line = _error_line(capsys.readouterr().err)
    assert "checkpoint: array 'pos': chunk c/1/0 does not match the CRC-32" in line, line


def test_an_edited_checkpoint_shape_is_refused(tmp_path):
    from cosmo_dask.simulation.store import read_checkpoint

    _, out = _killed_run(tmp_path)
    meta = out / "checkpoint" / "pos" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"][0] = 4000
    meta.write_text(json.dumps(doc))
    with pytest.raises(SnapshotError, match="array 'pos' has 4000 rows but the run has "
                       "n_particles = 4096"):
        read_checkpoint(out)


# ----------------------------------------------------------------------------- metadata
def _edit_shapes(path: Path, rows) -> None:
    for name in ("pos", "vel", "ids"):
        meta = path / name / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["shape"][0] = rows
        meta.write_text(json.dumps(doc))


def test_edited_shapes_are_an_error_not_fewer_particles(tmp_path, capsys):
    path, _ = _store(tmp_path)
    _edit_shapes(path, 4000)
    with pytest.raises(SnapshotError, match="shapes say 4000 particles but the store's "
                       "'n_particles' attribute says 4096"):
        open_snapshot(path)
    for argv in (["info", str(path)], ["info", str(path), "--quick"]):
        assert main(argv) == 2
        assert "'n_particles' attribute says 4096" in _error_line(capsys.readouterr().err)


def test_a_huge_shape_is_refused_from_metadata_alone(tmp_path, capsys):
    """``1e12`` as JSON's float is refused by zarr's parser already; as an integer it
    passed every check and ``info --quick`` listed 10^9 chunks."""
    path, _ = _store(tmp_path)
    _edit_shapes(path, 10**12)
    tracemalloc.start()
    t0 = time.perf_counter()
    assert main(["info", str(path), "--quick"]) == 2
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = capsys.readouterr().err.strip()
    assert "1000000000000 particles but the store's 'n_particles' attribute says 4096" in err
    # listing the chunks took 24 GB and minutes; the metadata check allocates nothing big
    assert peak < 64 << 20, peak
    assert seconds < 30  # generous: a 2-core VM under load; the listing never ends


def test_a_huge_shape_without_n_particles_is_refused_by_the_manifest(tmp_path):
    """The manifest's chunk count catches a shape when the attribute is gone too."""
    path, _ = _store(tmp_path)
    _edit_shapes(path, 10**12)
    doc = json.loads((path / "zarr.json").read_text())
    del doc["attributes"]["n_particles"]
    (path / "zarr.json").write_text(json.dumps(doc))
    tracemalloc.start()
    with pytest.raises(SnapshotError, match=r"array 'pos' has shape \(1000000000000, 3\) in "
                       r"chunks of \(1024, 3\), 976562500 chunks, but its manifest records 4"):
        open_snapshot(path)
    assert tracemalloc.get_traced_memory()[1] < 64 << 20
    tracemalloc.stop()
    assert zarr.open_group(str(path), mode="r")["pos"].attrs[MANIFEST]["n_chunks"] == 4


# ----------------------------------------------------------------------------- helpers
def test_crc32_combine_matches_zlib():
    rng = np.random.default_rng(0)
    for n1, n2 in ((0, 5), (5, 0), (1, 1), (1000, 12345), (8 << 20, 3)):
        a, b = rng.bytes(n1), rng.bytes(n2)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), n2) == zlib.crc32(a + b)


def test_gpu_piece_checksums_combine_to_the_chunk_crc(tmp_path):
    """The GPU reader's check (:func:`zarr_read._check_pieces`), on the CPU: pieces of a
    chunk checksummed apart, plus the file's bytes before and after them."""
    from cosmo_dask.store.zarr_read import _check_pieces, _direct_plan

    path, _ = _store(tmp_path)
    plan = _direct_plan(zarr.open_group(str(path), mode="r")["pos"], verify=True)
    width = 3 * 8
    raw = (path / "pos" / "c" / "1" / "0").read_bytes()
    pieces = [(1, a, min(1900, a + 300)) for a in range(1100, 1900, 300)]
    values = [zlib.crc32(raw[(a - CHUNK) * width:(b - CHUNK) * width]) for _, a, b in pieces]
    _check_pieces(plan, pieces, values, width, "s.zarr: array 'pos'")
    values[1] ^= 1
    with pytest.raises(ChecksumError, match="s.zarr: array 'pos': chunk c/1/0 does not"):
        _check_pieces(plan, pieces, values, width, "s.zarr: array 'pos'")


@pytest.mark.gpu
def test_gpu_reads_verify(tmp_path):
    """The GPU reader verifies the host bytes of each piece before copying them."""
    path, pos = _store(tmp_path)
    zpath, _ = _store(tmp_path, "z.zarr", compressor="zstd")
    for p in (path, zpath):
        for chunks in (None, 700):
            got = open_snapshot(p, device="gpu", chunks=chunks).pos.compute().get()
            np.testing.assert_array_equal(got, pos)
    _flip(path / "pos" / "c" / "1" / "0")
    for chunks in (None, 700):
        with pytest.raises(ChecksumError, match=ALTERED):
            open_snapshot(path, device="gpu", chunks=chunks).pos.compute()
    got = open_snapshot(path, device="gpu", verify=False).pos.compute().get()
    assert (got != pos).sum() == 1
