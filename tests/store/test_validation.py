"""Every snapshot validation case gives a SnapshotError naming the problem,
through the API and through the CLI (one line, non-zero exit)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask import Snapshot, SnapshotError, open_snapshot
from cosmo_dask.cli import main
from cosmo_dask.store.validation import duplicate_ids
from tests.support.stores import good_attrs, write_raw_store

N = 200


def _pos(rng, box=1.0):
    return rng.random((N, 3)) * box


def _cli_error(capsys, path):
    code = main(["info", str(path)])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.startswith("cosmo-dask: error:") and "\n" not in err
    assert "Traceback" not in err
    return err


# ------------------------------------------------------------ errors found at open
def _case_missing(tmp_path, rng):
    return tmp_path / "nope.zarr", "does not exist"


def _case_file(tmp_path, rng):
    p = tmp_path / "file.zarr"
    p.write_text("hello")
    return p, "is a file"


def _case_plain_dir(tmp_path, rng):
    p = tmp_path / "plain"
    p.mkdir()
    return p, "not a cosmo_dask snapshot store"


def _case_no_format(tmp_path, rng):
    return write_raw_store(tmp_path / "a.zarr", {"pos": _pos(rng)}, {"box_size": None}), \
        "attribute 'format' is None"


def _case_other_format(tmp_path, rng):
    attrs = good_attrs(format="someone.else")
    return write_raw_store(tmp_path / "a.zarr", {"pos": _pos(rng)}, attrs), "'someone.else'"


def _case_version(tmp_path, rng):
    attrs = good_attrs(format_version=7)
    return write_raw_store(tmp_path / "a.zarr", {"pos": _pos(rng)}, attrs), "format_version 7"


def _case_zarr_v2(tmp_path, rng):
    return write_raw_store(tmp_path / "a.zarr", {"pos": _pos(rng)}, good_attrs(),
                           zarr_format=2), "Zarr v2 store"


def _case_no_pos(tmp_path, rng):
    return write_raw_store(tmp_path / "a.zarr", {"vel": _pos(rng)}, good_attrs()), "no 'pos'"


def _case_pos_shape(tmp_path, rng):
    return write_raw_store(tmp_path / "a.zarr", {"pos": rng.random((N, 2))}, good_attrs()), \
        "array 'pos' has shape (200, 2)"


def _case_pos_dtype(tmp_path, rng):
    pos = (rng.random((N, 3)) * 10).astype(np.int32)
    return write_raw_store(tmp_path / "a.zarr", {"pos": pos}, good_attrs()), \
        "array 'pos' has dtype int32"


def _case_ids_dtype(tmp_path, rng):
    arrays = {"pos": _pos(rng), "ids": rng.random(N)}
    return write_raw_store(tmp_path / "a.zarr", arrays, good_attrs()), "array 'ids' has dtype"


def _case_length(tmp_path, rng):
    arrays = {"pos": _pos(rng), "vel": rng.random((N - 1, 3))}
    return write_raw_store(tmp_path / "a.zarr", arrays, good_attrs()), "'vel' has 199 rows"


def _case_lagrangian(tmp_path, rng):
    attrs = good_attrs(lagrangian_shape=[5, 5, 5])
    return write_raw_store(tmp_path / "a.zarr", {"pos": _pos(rng)}, attrs), \
        "lagrangian_shape [5, 5, 5] holds 125"


OPEN_CASES = [_case_missing, _case_file, _case_plain_dir, _case_no_format, _case_other_format,
              _case_version, _case_zarr_v2, _case_no_pos, _case_pos_shape, _case_pos_dtype,
              _case_ids_dtype, _case_length, _case_lagrangian]


@pytest.mark.parametrize("case", OPEN_CASES, ids=[c.__name__[6:] for c in OPEN_CASES])
def test_open_errors(tmp_path, rng, capsys, case):
    path, message = case(tmp_path, rng)
    with pytest.raises(SnapshotError, match=None) as info:
        open_snapshot(path)
    assert message in str(info.value)
    assert str(path.name) in str(info.value) or "nope" in str(info.value)
    assert message in _cli_error(capsys, path)


# ------------------------------------------------------------ errors found in the data
def _case_nonfinite(tmp_path, rng):
    pos = _pos(rng)
    pos[123, 2] = np.inf
    return write_raw_store(tmp_path / "a.zarr", {"pos": pos}, good_attrs()), \
        "particle 123 has non-finite values"


def _case_outside_box(tmp_path, rng):
    pos = _pos(rng, box=2.0)
    pos[:, 0] = np.clip(pos[:, 0], 0, 1.9)
    pos[77] = [2.0, 0.5, 0.5]  # exactly box_size is outside [0, box)
    pos[100] = [-0.1, 0.5, 0.5]  # same 64-row chunk as 77: the first bad one is named
    return write_raw_store(tmp_path / "a.zarr", {"pos": pos}, good_attrs(box_size=2.0)), \
        "particle 77 at [2.0, 0.5, 0.5] is outside the periodic box [0, 2.0)"


def _case_bad_mass(tmp_path, rng):
    mass = np.ones(N)
    mass[66] = 0.0
    mass[67] = -1.0
    return write_raw_store(tmp_path / "a.zarr", {"pos": _pos(rng), "mass": mass}, good_attrs()), \
        "particle 66 has mass 0.0"


DATA_CASES = [_case_nonfinite, _case_outside_box, _case_bad_mass]


@pytest.mark.parametrize("case", DATA_CASES, ids=[c.__name__[6:] for c in DATA_CASES])
def test_data_errors_are_raised_on_compute_and_by_validate(tmp_path, rng, capsys, client, case):
    path, message = case(tmp_path, rng)
    snap = open_snapshot(path)  # lazy: opening succeeds
    arr = snap.mass if "mass" in message else snap.pos
    with pytest.raises(SnapshotError) as info:
        client.compute(arr, sync=True)  # raised inside a worker task, re-raised here
    assert message in str(info.value) and "a.zarr" in str(info.value)
    with pytest.raises(SnapshotError):
        snap.validate(full=True)
    assert main(["info", str(path)]) == 1  # info prints an INVALID summary, exits 1
    assert "INVALID" in capsys.readouterr().out


def test_wrap_fixes_positions_on_load(tmp_path, rng):
    pos = _pos(rng, box=2.0)
    pos[0] = [2.0, -0.5, 4.5]
    path = write_raw_store(tmp_path / "a.zarr", {"pos": pos}, good_attrs(box_size=2.0))
    got = open_snapshot(path, wrap=True).pos.compute()
    np.testing.assert_allclose(got[0], [0.0, 1.5, 0.5])
    assert ((got >= 0) & (got < 2.0)).all()
    np.testing.assert_array_equal(got[1:], pos[1:])


def test_wrap_never_returns_box_size_in_float32():
    box = np.float32(1.0)
    pos = np.array([[-1e-9, 0.5, 0.5]], dtype=np.float32)  # (-1e-9 mod 1) rounds to 1.0
    from cosmo_dask.store.validation import wrap_into_box

    out = wrap_into_box(pos, float(box))
    assert out.dtype == np.float32 and 0 <= out[0, 0] < 1.0


def test_duplicate_ids_found_only_by_full_validate(tmp_path, rng, capsys):
    ids = np.arange(N, dtype=np.int64)
    ids[150] = 10
    path = write_raw_store(tmp_path / "a.zarr", {"pos": _pos(rng), "ids": ids}, good_attrs(),
                           chunks=32)
    snap = open_snapshot(path)
    snap.pos.compute()  # per-chunk checks do not look at ids
    with pytest.raises(SnapshotError, match="1 duplicate ids \\(e.g. 10\\)"):
        snap.validate(full=True)
    assert main(["info", str(path)]) == 1
    assert "duplicate ids" in capsys.readouterr().out


@pytest.mark.parametrize("n_chunks", [1, 3, 17, 100])
def test_duplicate_id_count_matches_numpy(rng, n_chunks):
    import dask.array as da

    ids = rng.integers(0, 5000, size=4000).astype(np.uint64)
    expected = ids.size - np.unique(ids).size
    n, example = duplicate_ids(da.from_array(ids, chunks=-(-4000 // n_chunks)))
    assert n == expected
    assert example in set(ids[np.unique(ids, return_counts=True)[1][np.searchsorted(
        np.unique(ids), ids)] > 1].tolist())


def test_writing_invalid_values_raises_and_leaves_nothing(tmp_path, rng):
    pos = _pos(rng, box=1.0)
    pos[5] = 1.5
    snap = Snapshot.from_arrays(pos, box_size=1.0, chunks=50)
    with pytest.raises(SnapshotError, match="particle 5 .* outside the periodic box"):
        snap.to_zarr(tmp_path / "bad.zarr")
    assert list(tmp_path.iterdir()) == []
    mass = np.ones(N)
    mass[199] = -2
    with pytest.raises(SnapshotError, match="particle 199 has mass -2.0"):
        Snapshot.from_arrays(_pos(rng), mass=mass, chunks=50).to_zarr(tmp_path / "bad.zarr")
    assert list(tmp_path.iterdir()) == []


def test_open_with_check_false_skips_value_checks(tmp_path, rng):
    path, _ = _case_nonfinite(tmp_path, rng)
    assert np.isinf(open_snapshot(path, check=False).pos.compute()).sum() == 1
