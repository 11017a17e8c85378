"""Lazy import of Gadget / AREPO style HDF5 snapshots (single files and multi-file sets).

At call time :func:`from_gadget_hdf5` reads only the ``Header`` attributes and the
shapes and dtypes of the ``PartType{n}`` datasets of every file. Particle data
are read by dask tasks, one per piece of at most ``chunks`` rows of one file;
each task opens its file with h5py, reads its row slice and closes the file, so
the graph holds only paths and dataset names and runs on distributed workers.

Conventions applied while reading (see ``docs/gadget.md``):

* **Velocities.** Gadget writes ``v_stored = v_pec / sqrt(a)`` in cosmological
  runs. A run counts as cosmological when the file has a ``Parameters`` group
  with attribute ``ComovingIntegrationOn`` (Gadget-4, AREPO) and it is non-zero,
  or, without that attribute, when ``0 < Header/Time <= 1`` and
  ``Header/Omega0 > 0``. Then velocities are multiplied by ``sqrt(Time)`` (giving
  peculiar km/s), ``Time`` becomes the scale factor and the Omega/h values the
  cosmology; otherwise velocities are returned as stored and the snapshot has
  no scale factor and no cosmology.
* **Positions on the box edge.** In periodic snapshots (``BoxSize > 0``) each
  read task maps ``x >= BoxSize`` to ``x - BoxSize`` and ``x < 0`` to
  ``x + BoxSize`` (one box at most), so coordinates written as exactly
  ``BoxSize`` land on 0.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import h5py
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ..backend import default_chunk_size
from ..errors import ParameterError, SnapshotError
from ..validation import check_array_meta

logger = logging.getLogger(__name__)

#: snapshot array name -> dataset name inside ``PartType{n}``
GADGET_FIELDS: dict[str, str] = {
    "pos": "Coordinates",
    "vel": "Velocities",
    "ids": "ParticleIDs",
    "mass": "Masses",
}

#: units assumed when the header has no ``Unit*`` attributes (Gadget defaults)
DEFAULT_UNITS: dict[str, str] = {
    "length": "kpc/h",
    "velocity": "km/s (peculiar)",
    "mass": "1e10 Msun/h",
}

# header unit value (cgs) -> unit name; matched to a relative tolerance of 1e-3
_LENGTH_UNITS = {3.085678e21: "kpc/h", 3.085678e24: "Mpc/h"}
_MASS_UNITS = {1.989e43: "1e10 Msun/h"}
_VELOCITY_UNITS = {1e5: "km/s"}

# G in (length, km/s, 1e10 Msun/h); the h factors cancel in G M / r
_G_BY_LENGTH = {"kpc/h": 43009.1, "Mpc/h": 43.0091}

_SUBFILE = re.compile(r"^(?P<base>.+)\.(?P<num>\d+)\.(?P<ext>hdf5|h5)$")
_EXTENSIONS = ("hdf5", "h5")
_N_TYPES = 6


@dataclass(frozen=True)
class GadgetInfo:
    """What :func:`from_gadget_hdf5` found and applied (``snapshot.gadget_info``).

    Attributes
    ----------
    files : tuple of str
        Absolute paths of all files of the set, in file-number order.
    part_type : int
        The Gadget particle type read (0 gas, 1 dark matter, ...).
    n_particles : int
        Number of particles of that type over all files.
    n_per_file : tuple of int
        ``NumPart_ThisFile[part_type]`` of each file (0 for skipped files).
    header : dict
        ``Header`` attributes of the first file as plain Python values.
    cosmological : bool
        Whether the run was taken to be cosmological (see module docs).
    cosmological_rule : str
        Which rule decided ``cosmological``, with the values it used.
    velocity_factor : float
        Factor applied to the stored velocities (``sqrt(Time)`` or 1.0).
    """

    files: tuple[str, ...]
    part_type: int
    n_particles: int
    n_per_file: tuple[int, ...]
    header: dict[str, Any] = field(repr=False)
    cosmological: bool
    cosmological_rule: str
    velocity_factor: float


# ----------------------------------------------------------------------------- helpers
def _py(value: Any) -> Any:
    """h5py attribute value -> plain Python (numbers, strings, lists)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return _py(value[()])
        return [_py(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _scalar(header: Mapping[str, Any], key: str) -> float | None:
    """A header attribute as float (first element of length-1 arrays), or None."""
    value = header.get(key)
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _per_type(header: Mapping[str, Any], key: str, part_type: int) -> int | float | None:
    """Entry ``part_type`` of a per-type header array such as NumPart_ThisFile."""
    value = header.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        value = [value]
    return value[part_type] if part_type < len(value) else 0


def _subfile_name(base: str, num: str | int, ext: str, width: int) -> str:
    return f"{base}.{str(num).zfill(width)}.{ext}"


def _file_number(path: str) -> int:
    """Number of a file for ordering: the sub-file index, else the last integer in the name."""
    name = os.path.basename(path)
    m = _SUBFILE.match(name)
    if m:
        return int(m["num"])
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


def _check_hdf5(path: str) -> None:
    if not h5py.is_hdf5(path):
        raise SnapshotError(
            f"{path}: not an HDF5 file; from_gadget_hdf5 reads Gadget/AREPO HDF5 snapshots "
            "(a Gadget format-1/2 binary file must be converted first)"
        )


def _num_files(path: str) -> int:
    """``Header/NumFilesPerSnapshot`` of one file (1 when absent)."""
    _check_hdf5(path)
    try:
        with h5py.File(path, "r") as f:
            if "Header" not in f:
                raise SnapshotError(_no_header(path))
            value = _py(f["Header"].attrs.get("NumFilesPerSnapshot", 1))
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be opened as HDF5 ({exc})") from None
    n = _scalar({"n": value}, "n")
    if n is None or n < 1 or n != int(n):
        raise SnapshotError(
            f"{path}: Header/NumFilesPerSnapshot is {value!r}; expected a positive integer"
        )
    return int(n)


def _no_header(path: str) -> str:
    return (
        f"{path}: no 'Header' group; not a Gadget/AREPO HDF5 snapshot "
        "(expected groups Header and PartType0..PartType5)"
    )


def _subfile_set(path: str) -> list[str]:
    """All files of the multi-file set that ``path`` (``base.N.ext``) belongs to."""
    m = _SUBFILE.match(os.path.basename(path))
    assert m is not None
    num = m["num"]
    width = len(num) if num.startswith("0") and len(num) > 1 else 0
    base = os.path.join(os.path.dirname(path), m["base"])
    n_files = _num_files(path)
    if n_files == 1:
        return [path]
    files = [_subfile_name(base, i, m["ext"], width) for i in range(n_files)]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        shown = ", ".join(missing[:5])
        if len(missing) > 5:
            shown += f" and {len(missing) - 5} more"
        raise SnapshotError(
            f"{path}: Header/NumFilesPerSnapshot is {n_files} but {len(missing)} file(s) of the "
            f"set are missing: {shown}; all of {_subfile_name(base, 0, m['ext'], width)} .. "
            f"{files[-1]} must exist"
        )
    if path not in files:
        raise SnapshotError(
            f"{path}: expected the files of its set to be named {files[0]} .. {files[-1]}"
        )
    return files


def find_gadget_files(path_or_pattern: str | os.PathLike) -> list[str]:
    """Resolve a snapshot path, sub-file, base name or glob into its files.

    Parameters
    ----------
    path_or_pattern : str or path-like
        ``snap_000.hdf5`` (single file); ``snap_000.3.hdf5`` (any file of a
        multi-file set: all ``snap_000.N.hdf5`` listed by
        ``Header/NumFilesPerSnapshot`` are returned and must exist); the base
        ``snap_000`` (tries ``snap_000.hdf5``, ``snap_000.h5``, then
        ``snap_000.0.hdf5``/``.0.h5``); or a glob pattern (``*``, ``?``, ``[``).

    Returns
    -------
    list of str
        Absolute paths ordered by file number (sub-file index, else the last
        integer in the file name).

    Raises
    ------
    SnapshotError
        When nothing matches, a sub-file of the set is missing, or a file is
        not an HDF5 file with a ``Header`` group.
    """
    text = os.path.expanduser(os.fspath(path_or_pattern))
    if any(c in text for c in "*?["):
        found = [os.path.abspath(p) for p in glob.glob(text) if os.path.isfile(p)]
        if not found:
            raise SnapshotError(
                f"{text}: the glob pattern matches no file; give a Gadget HDF5 file "
                "(snap_000.hdf5), one file of a multi-file set (snap_000.0.hdf5), the base "
                "name (snap_000) or a pattern matching existing files"
            )
        return sorted(found, key=lambda p: (_file_number(p), p))
    path = os.path.abspath(text)
    if os.path.isdir(path):
        raise SnapshotError(
            f"{path}: is a directory; give a snapshot file, base name or glob pattern "
            f"(e.g. '{os.path.join(path, '*.hdf5')}')"
        )
    if os.path.isfile(path):
        if _SUBFILE.match(os.path.basename(path)):
            return _subfile_set(path)
        return [path]
    tried = [f"{path}.{ext}" for ext in _EXTENSIONS] + [f"{path}.0.{ext}" for ext in _EXTENSIONS]
    for candidate in tried[:2]:
        if os.path.isfile(candidate):
            return [candidate]
    for candidate in tried[2:]:
        if os.path.isfile(candidate):
            return _subfile_set(candidate)
    raise SnapshotError(
        f"{path}: no such Gadget snapshot (tried {', '.join(tried)}); give a Gadget HDF5 "
        "file, one file of a multi-file set, the base name or a glob pattern"
    )


# ----------------------------------------------------------------------------- scanning
@dataclass
class _FileMeta:
    path: str
    header: dict[str, Any]
    comoving_flag: Any
    has_group: bool
    fields: dict[str, tuple[tuple[int, ...], np.dtype]]


def _read_file_meta(path: str, part_type: int) -> _FileMeta:
    """Header attributes and dataset shapes/dtypes of one file (no particle data read)."""
    _check_hdf5(path)
    group = f"PartType{part_type}"
    try:
        with h5py.File(path, "r") as f:
            if "Header" not in f:
                raise SnapshotError(_no_header(path))
            header = {k: _py(v) for k, v in f["Header"].attrs.items()}
            flag = None
            if "Parameters" in f:
                flag = _py(f["Parameters"].attrs.get("ComovingIntegrationOn"))
            fields = {}
            has_group = group in f
            if has_group:
                g = f[group]
                for name, dsname in GADGET_FIELDS.items():
                    obj = g.get(dsname)
                    if isinstance(obj, h5py.Dataset):
                        fields[name] = (tuple(obj.shape), obj.dtype)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be opened as HDF5 ({exc})") from None
    return _FileMeta(path, header, flag, has_group, fields)


def _types_present(metas: list[_FileMeta]) -> list[int]:
    present = set()
    for m in metas:
        counts = m.header.get("NumPart_ThisFile") or []
        present.update(t for t, c in enumerate(counts) if c)
    return sorted(present)


def _cosmological(meta: _FileMeta) -> tuple[bool, str]:
    """Decide whether the run is cosmological; return (answer, rule used)."""
    if meta.comoving_flag is not None:
        flag = _scalar({"f": meta.comoving_flag}, "f")
        return bool(flag), f"Parameters/ComovingIntegrationOn = {meta.comoving_flag!r}"
    time = _scalar(meta.header, "Time")
    omega0 = _scalar(meta.header, "Omega0")
    answer = time is not None and 0 < time <= 1 and omega0 is not None and omega0 > 0
    return answer, f"0 < Header/Time <= 1 and Header/Omega0 > 0 (Time = {time}, Omega0 = {omega0})"


def _unit_name(value: float | None, table: Mapping[float, str], cgs: str) -> str | None:
    if value is None:
        return None
    for ref, name in table.items():
        if math.isclose(value, ref, rel_tol=1e-3):
            return name
    return f"{value:.6g} {cgs}"


def _header_units(header: Mapping[str, Any], cosmological: bool) -> dict[str, str]:
    units = dict(DEFAULT_UNITS)
    length = _unit_name(_scalar(header, "UnitLength_in_cm"), _LENGTH_UNITS, "cm/h")
    mass = _unit_name(_scalar(header, "UnitMass_in_g"), _MASS_UNITS, "g/h")
    vel = _unit_name(_scalar(header, "UnitVelocity_in_cm_per_s"), _VELOCITY_UNITS, "cm/s")
    if length:
        units["length"] = length
    if mass:
        units["mass"] = mass
    if vel:
        units["velocity"] = f"{vel} (peculiar)" if cosmological else vel
    elif not cosmological:
        units["velocity"] = "km/s"
    return units


def gravitational_constant(units: Mapping[str, str]) -> float | None:
    """G in the given units when they are (kpc/h or Mpc/h, km/s, 1e10 Msun/h), else None.

    Returns 43009.1 (kpc/h) (km/s)^2 / (1e10 Msun/h) or 43.0091 for Mpc/h.
    """
    if units.get("mass") != "1e10 Msun/h" or not str(units.get("velocity", "")).startswith("km/s"):
        return None
    return _G_BY_LENGTH.get(units.get("length"))


# ----------------------------------------------------------------------------- reading
def _wrap_into_box(data: np.ndarray, box: float) -> np.ndarray:
    """Map positions one box outside into [0, box): x >= box -> x - box, x < 0 -> x + box."""
    box_t = data.dtype.type(box)
    out = np.where(data >= box_t, data - box_t, data)
    out = np.where(out < 0, out + box_t, out)
    # x + box of a tiny negative x can round up to box itself: that is 0 periodically
    out = np.where(out >= box_t, data.dtype.type(0), out)
    return out.astype(data.dtype, copy=False)


def _read_piece(path: str, dataset: str, start: int, stop: int, scale: float | None,
                box: float | None) -> np.ndarray:
    """Read rows [start, stop) of ``dataset`` in ``path`` (a dask task; opens and closes)."""
    with h5py.File(path, "r") as f:
        data = f[dataset][start:stop]
    if scale is not None:
        data = (data * np.float64(scale)).astype(data.dtype, copy=False)
    if box is not None:
        data = _wrap_into_box(data, box)
    return data


def _lazy_field(pieces: list[tuple[str, int, int]], dataset: str, trailing: tuple[int, ...],
                dtype: np.dtype, stamps: list[Any], scale: float | None,
                box: float | None) -> da.Array:
    token = tokenize(pieces, dataset, trailing, str(dtype), stamps, scale, box)
    name = f"gadget-read-{token}"
    tail = (0,) * len(trailing)
    dsk = {
        (name, i) + tail: (_read_piece, path, dataset, start, stop, scale, box)
        for i, (path, start, stop) in enumerate(pieces)
    }
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    chunks = (tuple(stop - start for _, start, stop in pieces),) + tuple((n,) for n in trailing)
    meta = np.empty((0,) + trailing, dtype=dtype)
    return da.Array(graph, name, chunks, meta=meta)


def _check_chunks(chunks: Any) -> int:
    if chunks is None:
        return default_chunk_size()
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ParameterError(f"chunks must be a positive number of particles, got {chunks!r}")
    return int(chunks)


def _check_part_type(part_type: Any) -> int:
    ok = isinstance(part_type, (int, np.integer)) and not isinstance(part_type, bool)
    if not ok or not 0 <= part_type < _N_TYPES:
        raise ParameterError(
            f"part_type must be a Gadget particle type 0..5 (0 gas, 1 dark matter, 2 disk, "
            f"3 bulge, 4 stars, 5 black holes), got {part_type!r}"
        )
    return int(part_type)


def _merge_units(header_units: dict[str, str], units: Mapping[str, str] | None) -> dict[str, str]:
    if units is None:
        return header_units
    if not isinstance(units, Mapping):
        raise ParameterError(f"units must be a mapping {{length, velocity, mass}}, got {units!r}")
    unknown = set(units) - set(DEFAULT_UNITS)
    if unknown:
        raise ParameterError(
            f"units has unknown key(s) {sorted(unknown)}; valid keys are length, velocity, mass"
        )
    merged = dict(header_units)
    merged.update({k: str(v) for k, v in units.items()})
    return merged


def _scan(files: list[str], part_type: int, source: str):
    """Read every header; check the set; return per-file metadata and the field layout."""
    metas = [_read_file_meta(p, part_type) for p in files]
    first = metas[0]
    n_files_hdr = _scalar(first.header, "NumFilesPerSnapshot")
    if n_files_hdr is not None and int(n_files_hdr) != len(files):
        raise SnapshotError(
            f"{source}: matched {len(files)} file(s) but Header/NumFilesPerSnapshot of "
            f"{first.path} is {int(n_files_hdr)}; the pattern must match exactly the files of "
            "one snapshot"
        )
    group = f"PartType{part_type}"
    if not any(m.has_group for m in metas):
        present = _types_present(metas)
        raise SnapshotError(
            f"{source}: no '{group}' group in any of the {len(metas)} file(s); particle types "
            f"with particles: {present or 'none'} (choose one with part_type=)"
        )
    counts = []
    for m in metas:
        n = _per_type(m.header, "NumPart_ThisFile", part_type)
        if n is None:
            raise SnapshotError(f"{m.path}: Header has no NumPart_ThisFile attribute")
        n = int(n)
        if n > 0 and not m.has_group:
            raise SnapshotError(
                f"{m.path}: Header/NumPart_ThisFile[{part_type}] is {n} but there is no "
                f"'{group}' group"
            )
        counts.append(n)
    total_sum = sum(counts)
    total = _per_type(first.header, "NumPart_Total", part_type)
    if total is not None:
        high = _per_type(first.header, "NumPart_Total_HighWord", part_type) or 0
        total = int(total) + (int(high) << 32)
        if total != total_sum:
            raise SnapshotError(
                f"{source}: Header/NumPart_Total[{part_type}] is {total} but NumPart_ThisFile"
                f"[{part_type}] sums to {total_sum} over {len(metas)} file(s); files are "
                "missing, extra or from different snapshots"
            )
    if total_sum == 0:
        raise SnapshotError(
            f"{source}: no particles of type {part_type} (NumPart_ThisFile[{part_type}] is 0 "
            f"in every file); types with particles: {_types_present(metas) or 'none'}"
        )
    used = [(m, n) for m, n in zip(metas, counts, strict=True) if n > 0]
    ref, _ = used[0]
    if "pos" not in ref.fields:
        raise SnapshotError(f"{ref.path}: '{group}' has no 'Coordinates' dataset")
    layout: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for name, (shape, dtype) in ref.fields.items():
        layout[name] = (tuple(shape[1:]), dtype)
    for m, n in used:
        if set(m.fields) != set(layout):
            have = sorted(GADGET_FIELDS[k] for k in m.fields)
            want = sorted(GADGET_FIELDS[k] for k in layout)
            raise SnapshotError(
                f"{m.path}: '{group}' has datasets {have} but {ref.path} has {want}; "
                "all files must hold the same datasets"
            )
        for name, (shape, dtype) in m.fields.items():
            dsname = f"{group}/{GADGET_FIELDS[name]}"
            trailing, ref_dtype = layout[name]
            if dtype != ref_dtype:
                raise SnapshotError(
                    f"{m.path}: '{dsname}' has dtype {dtype} but it is {ref_dtype} in "
                    f"{ref.path}; dtypes must agree across files"
                )
            if tuple(shape[1:]) != trailing or shape[0] != n:
                raise SnapshotError(
                    f"{m.path}: '{dsname}' has shape {shape}; expected {(n,) + trailing} "
                    f"from Header/NumPart_ThisFile[{part_type}] = {n}"
                )
    tables = {m.path: _per_type(m.header, "MassTable", part_type) for m, _ in used}
    if len({float(v or 0) for v in tables.values()}) > 1:
        raise SnapshotError(
            f"{source}: Header/MassTable[{part_type}] differs between files: {tables}"
        )
    for name, (trailing, dtype) in layout.items():
        check_array_meta(name, (total_sum,) + trailing, dtype, f"{ref.path}: {group}")
    return metas, counts, layout


def from_gadget_hdf5(path_or_pattern: str | os.PathLike, part_type: int = 1, *,
                     chunks: int | None = None, units: Mapping[str, str] | None = None):
    """Open one particle type of a Gadget/AREPO HDF5 snapshot as a lazy Snapshot.

    Only headers and dataset shapes are read here; the particle data are read
    by dask tasks (``gadget-read-<token>``) that each open one file, read a
    row slice and close it, so the result can be computed on a distributed
    cluster whose workers see the same paths.

    Parameters
    ----------
    path_or_pattern : str or path-like
        A single file ``snap_000.hdf5``; any file of a multi-file set
        ``snap_000.N.hdf5`` (the whole set, per ``Header/NumFilesPerSnapshot``,
        is read); the base name ``snap_000``; or a glob pattern. Files are
        ordered by their number; paths are made absolute.
    part_type : int
        Gadget particle type 0..5 (default 1, dark matter).
    chunks : int, optional
        Maximum particles per dask chunk (default: dask config
        ``cosmo_dask.chunk_size``). Chunks never span two files.
    units : dict, optional
        ``{length, velocity, mass}`` strings overriding those derived from the
        header (``UnitLength_in_cm``, ``UnitMass_in_g``,
        ``UnitVelocity_in_cm_per_s``; Gadget defaults kpc/h, km/s,
        1e10 Msun/h when absent). ``G`` is set for (kpc/h or Mpc/h, km/s,
        1e10 Msun/h) and None otherwise.

    Returns
    -------
    Snapshot
        ``pos`` (``Coordinates``, in length units, wrapped into [0, BoxSize)),
        ``vel`` (``Velocities`` times ``sqrt(a)`` for cosmological runs: peculiar
        km/s), ``ids`` (``ParticleIDs``), ``mass`` (``Masses``) or
        ``particle_mass`` (``Header/MassTable[part_type]``). ``box_size`` is
        ``Header/BoxSize`` (0 means isolated: None). For cosmological runs
        ``scale_factor`` is ``Header/Time`` and ``cosmology`` holds Omega_m
        (Omega0), Omega_b (OmegaBaryon or None), Omega_L (OmegaLambda), h
        (HubbleParam), sigma8 and n_s (None). The returned object also has a
        ``gadget_info`` attribute (:class:`GadgetInfo`).

    Raises
    ------
    ParameterError
        ``part_type`` outside 0..5, bad ``chunks`` or ``units``.
    SnapshotError
        Nothing matches the path or pattern; a file is not HDF5 or has no
        Header; missing files of a multi-file set; no ``PartType{n}`` group in
        any file; datasets or dtypes inconsistent between files; dataset
        lengths not matching ``NumPart_ThisFile``; ``NumPart_Total`` not the sum
        of ``NumPart_ThisFile``; no ``Masses`` dataset and no MassTable entry.
    """
    part_type = _check_part_type(part_type)
    rows = _check_chunks(chunks)
    source = os.fspath(path_or_pattern)
    files = find_gadget_files(path_or_pattern)
    metas, counts, layout = _scan(files, part_type, source)
    header = metas[0].header

    box = _scalar(header, "BoxSize")
    box_size = box if box is not None and box > 0 else None
    cosmological, rule = _cosmological(metas[0])
    time = _scalar(header, "Time")
    vel_factor = math.sqrt(time) if cosmological and time is not None and time > 0 else 1.0
    scale_factor = time if cosmological and time is not None and time > 0 else None
    cosmology = None
    if cosmological:
        cosmology = {
            "Omega_m": _scalar(header, "Omega0"),
            "Omega_b": _scalar(header, "OmegaBaryon"),
            "Omega_L": _scalar(header, "OmegaLambda"),
            "h": _scalar(header, "HubbleParam"),
            "sigma8": None,
            "n_s": None,
        }
    final_units = _merge_units(_header_units(header, cosmological), units)
    G = gravitational_constant(final_units)  # noqa: N806 (physics symbol)

    particle_mass = None
    if "mass" not in layout:
        table = _per_type(header, "MassTable", part_type)
        if table is None or float(table) <= 0:
            raise SnapshotError(
                f"{source}: PartType{part_type} has no 'Masses' dataset and "
                f"Header/MassTable[{part_type}] is {table}; particle masses are unknown "
                "(a positive MassTable entry or a Masses dataset is needed)"
            )
        particle_mass = float(table)

    pieces = []
    for m, n in zip(metas, counts, strict=True):
        for start in range(0, n, rows):
            pieces.append((m.path, start, min(start + rows, n)))
    stamps = []
    for m, n in zip(metas, counts, strict=True):
        if n:
            st = os.stat(m.path)
            stamps.append((m.path, st.st_size, st.st_mtime_ns))

    group = f"PartType{part_type}"
    arrays = {}
    for name, (trailing, dtype) in layout.items():
        scale = vel_factor if name == "vel" and vel_factor != 1.0 else None
        wrap = box_size if name == "pos" else None
        arrays[name] = _lazy_field(pieces, f"{group}/{GADGET_FIELDS[name]}", trailing, dtype,
                                   stamps, scale, wrap)

    info = GadgetInfo(
        files=tuple(files), part_type=part_type, n_particles=sum(counts),
        n_per_file=tuple(counts), header=header, cosmological=cosmological,
        cosmological_rule=rule, velocity_factor=vel_factor,
    )
    logger.info("gadget import %s: %d particles of type %d from %d file(s); cosmological=%s "
                "(%s); velocities x %g", source, info.n_particles, part_type, len(files),
                cosmological, rule, vel_factor)

    from ..snapshot import Snapshot

    snap = Snapshot.from_arrays(
        arrays["pos"], arrays.get("vel"), arrays.get("ids"), arrays.get("mass"),
        box_size=box_size, particle_mass=particle_mass, scale_factor=scale_factor,
        cosmology=cosmology, units=final_units, G=G,
    )
    snap.gadget_info = info
    return snap
