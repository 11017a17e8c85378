"""Lazy import of Gadget / AREPO style HDF5 snapshots (single files and multi-file sets).

The file lookup (:func:`_find_files`), the checks and conventions below and the
assembly of a lazy Snapshot from the headers (:func:`_assemble`) are shared with
the format-1/2 binary reader, :mod:`cosmo_dask.io.gadget_binary`: a reader only
describes its format (:class:`_Format`), reads each file's header into a
:class:`_FileMeta` and supplies the dask task that reads rows of one field of
one file.

At call time :func:`from_gadget_hdf5` reads only the ``Header`` attributes and the
shapes and dtypes of the ``PartType{n}`` datasets of every file. Particle data
are read by dask tasks, one per piece of at most ``chunks`` rows of one file;
each task opens its file with h5py, reads its row slice and closes the file, so
the graph holds only paths and dataset names and runs on distributed workers.

Conventions applied while reading (see ``docs/gadget.md``):

* **Velocities.** Gadget writes ``v_stored = v_pec / sqrt(a)`` in cosmological
  runs. A run counts as cosmological when the file has an attribute
  ``ComovingIntegrationOn`` (in the ``Parameters`` group, as Gadget-4 and AREPO
  write it, or in ``Header``) and it is non-zero, or, without it, when ``0 < Header/Time <= 1`` and
  ``Header/Omega0 > 0``. Then velocities are multiplied by ``sqrt(Time)`` (giving
  peculiar km/s), ``Time`` becomes the scale factor and the Omega/h values the
  cosmology; otherwise velocities are returned as stored and the snapshot has
  no scale factor and no cosmology.
* **Positions on the box edge.** In periodic snapshots (``BoxSize > 0``) each
  read task maps ``x >= BoxSize`` to ``x - BoxSize`` and ``x < 0`` to
  ``x + BoxSize`` (one box at most), so coordinates written as exactly
  ``BoxSize`` land on 0.
* **Units.** ``UnitLength_in_cm``, ``UnitMass_in_g``, ``UnitVelocity_in_cm_per_s``,
  ``HubbleParam`` and ``ComovingIntegrationOn`` are read from ``Header`` or from
  the ``Parameters`` group (Gadget-4 and AREPO keep them there); when both hold
  a value they must agree.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import h5py
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ..backend import default_chunk_size
from ..errors import ParameterError, SnapshotError
from ..units import gravitational_constant
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


_SUBFILE = re.compile(r"^(?P<base>.+)\.(?P<num>\d+)\.(?P<ext>hdf5|h5)$")
_EXTENSIONS = ("hdf5", "h5")
_N_TYPES = 6

#: settings read from ``Header`` or from the ``Parameters`` group (both must agree)
_PARAMETER_KEYS = ("UnitLength_in_cm", "UnitMass_in_g", "UnitVelocity_in_cm_per_s",
                   "HubbleParam", "ComovingIntegrationOn", "Omega0", "OmegaLambda",
                   "OmegaBaryon")


@dataclass(frozen=True)
class GadgetInfo:
    """What :func:`from_gadget_hdf5` or ``from_gadget_binary`` found and applied
    (``snapshot.gadget_info``).

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
        ``Header`` attributes of the first file as plain Python values (for
        binary files the 256-byte header, under the HDF5 attribute names).
    cosmological : bool
        Whether the run was taken to be cosmological (see module docs).
    cosmological_rule : str
        Which rule decided ``cosmological``, with the values it used.
    velocity_factor : float
        Factor applied to the stored velocities (``sqrt(Time)`` or 1.0).
    format : str
        File format of the first file: ``"hdf5"``, ``"binary-1"`` or ``"binary-2"``
        (Gadget SnapFormat 1 or 2).
    """

    files: tuple[str, ...]
    part_type: int
    n_particles: int
    n_per_file: tuple[int, ...]
    header: dict[str, Any] = field(repr=False)
    cosmological: bool
    cosmological_rule: str
    velocity_factor: float
    format: str = "hdf5"


@dataclass(frozen=True)
class _Format:
    """What differs between the HDF5 and the binary reader; the rest is shared.

    Attributes
    ----------
    kind : str
        Name in messages (``"Gadget HDF5"``).
    subfile : re.Pattern
        Name of a file of a multi-file set, with groups ``base``, ``num``, ``ext``.
    extensions : tuple of str
        Extensions of single files and sub-files (``""``: none).
    num_files : callable
        ``num_files(path)``: the number of files of the set, from that file's header.
    read_meta : callable
        ``read_meta(path, part_type)``: the :class:`_FileMeta` of one file.
    header : str
        How messages name a header entry: ``"Header/"`` + ``NumPart_Total``.
    read_rows : callable
        ``read_rows(path, spec, start, stop)``, a dask task: rows [start, stop) of
        one field of one file, native byte order; ``spec`` is
        ``_FileMeta.specs[field]`` (data only: it goes into the graph).
    labels : dict
        Field -> its name in messages, ``{t}`` standing for the particle type.
    no_masses : str
        Message part for a type without per-particle masses, with ``{t}``.
    """

    kind: str
    subfile: re.Pattern[str]
    extensions: tuple[str, ...]
    num_files: Callable[[str], int]
    read_meta: Callable[[str, int], _FileMeta]
    header: str
    read_rows: Callable[[str, Any, int, int], np.ndarray]
    labels: Mapping[str, str]
    no_masses: str

    def label(self, name: str, part_type: int) -> str:
        return self.labels[name].format(t=part_type)


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
    return f"{base}.{str(num).zfill(width)}" + (f".{ext}" if ext else "")


def _file_number(path: str, fmt: _Format) -> int:
    """Number of a file for ordering: the sub-file index, else the last integer in the name."""
    name = os.path.basename(path)
    m = fmt.subfile.match(name)
    if m:
        return int(m["num"])
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


def _check_hdf5(path: str) -> None:
    if not h5py.is_hdf5(path):
        raise SnapshotError(
            f"{path}: not an HDF5 file; from_gadget_hdf5 reads Gadget/AREPO HDF5 snapshots "
            "(use from_gadget_binary for Gadget format-1/2 binary files)"
        )


def _files_in_set(path: str, value: Any, what: str) -> int:
    """A header's file count (``what`` names it in the message) as a positive int."""
    n = _scalar({"n": value}, "n")
    if n is None or n < 1 or n != int(n):
        raise SnapshotError(f"{path}: {what} is {value!r}; expected a positive integer")
    return int(n)


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
    return _files_in_set(path, value, "Header/NumFilesPerSnapshot")


def _no_header(path: str) -> str:
    return (
        f"{path}: no 'Header' group; not a Gadget/AREPO HDF5 snapshot "
        "(expected groups Header and PartType0..PartType5)"
    )


def _subfile_set(path: str, fmt: _Format) -> list[str]:
    """All files of the multi-file set that ``path`` (``base.N[.ext]``) belongs to."""
    m = fmt.subfile.match(os.path.basename(path))
    assert m is not None
    num = m["num"]
    width = len(num) if num.startswith("0") and len(num) > 1 else 0
    base = os.path.join(os.path.dirname(path), m["base"])
    n_files = fmt.num_files(path)
    if n_files == 1:
        return [path]
    files = [_subfile_name(base, i, m["ext"], width) for i in range(n_files)]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        shown = ", ".join(missing[:5])
        if len(missing) > 5:
            shown += f" and {len(missing) - 5} more"
        raise SnapshotError(
            f"{path}: {fmt.header}NumFilesPerSnapshot is {n_files} but {len(missing)} file(s) "
            f"of the set are missing: {shown}; all of {_subfile_name(base, 0, m['ext'], width)} .. "
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
    return _find_files(path_or_pattern, _HDF5)


def _find_files(path_or_pattern: str | os.PathLike, fmt: _Format) -> list[str]:
    """:func:`find_gadget_files` for the file names and headers of format ``fmt``."""
    ext = f".{fmt.extensions[0]}" if fmt.extensions[0] else ""
    single, sub = f"snap_000{ext}", _subfile_name("snap_000", 0, fmt.extensions[0], 0)
    text = os.path.expanduser(os.fspath(path_or_pattern))
    if any(c in text for c in "*?["):
        found = [os.path.abspath(p) for p in glob.glob(text) if os.path.isfile(p)]
        if not found:
            raise SnapshotError(
                f"{text}: the glob pattern matches no file; give a {fmt.kind} file "
                f"({single}), one file of a multi-file set ({sub}), the base "
                "name (snap_000) or a pattern matching existing files"
            )
        return sorted(found, key=lambda p: (_file_number(p, fmt), p))
    path = os.path.abspath(text)
    if os.path.isdir(path):
        raise SnapshotError(
            f"{path}: is a directory; give a snapshot file, base name or glob pattern "
            f"(e.g. '{os.path.join(path, '*' + ext)}')"
        )
    if os.path.isfile(path):
        if fmt.subfile.match(os.path.basename(path)):
            return _subfile_set(path, fmt)
        return [path]
    singles = [f"{path}.{ext}" for ext in fmt.extensions if ext]
    sets = [_subfile_name(path, 0, ext, 0) for ext in fmt.extensions]
    for candidate in singles:
        if os.path.isfile(candidate):
            return [candidate]
    for candidate in sets:
        if os.path.isfile(candidate):
            return _subfile_set(candidate, fmt)
    raise SnapshotError(
        f"{path}: no such Gadget snapshot (tried {', '.join(singles + sets)}); give a "
        f"{fmt.kind} file, one file of a multi-file set, the base name or a glob pattern"
    )


# ----------------------------------------------------------------------------- scanning
@dataclass
class _FileMeta:
    """What a reader found in one file without reading particle data.

    ``has_type``: the file has a place for the type's rows (HDF5: a
    ``PartType{n}`` group; binary files: always, their blocks hold every type).
    ``fields``: field -> (shape, dtype) of the type's rows as they will be
    returned. ``specs``: field -> what ``_Format.read_rows`` needs to find those
    rows (HDF5: the dataset name; binary: byte offset, on-disk dtype, row shape).
    ``parameters``: the ``_PARAMETER_KEYS`` found in a ``Parameters`` group.
    """

    path: str
    header: dict[str, Any]
    has_type: bool
    fields: dict[str, tuple[tuple[int, ...], np.dtype]]
    specs: dict[str, Any]
    parameters: dict[str, Any] = field(default_factory=dict)
    format: str = "hdf5"


def _read_file_meta(path: str, part_type: int) -> _FileMeta:
    """Header and Parameters attributes and dataset shapes/dtypes of one HDF5 file."""
    _check_hdf5(path)
    group = f"PartType{part_type}"
    try:
        with h5py.File(path, "r") as f:
            if "Header" not in f:
                raise SnapshotError(_no_header(path))
            header = {k: _py(v) for k, v in f["Header"].attrs.items()}
            parameters = {}
            if "Parameters" in f:
                attrs = f["Parameters"].attrs
                parameters = {k: _py(attrs[k]) for k in _PARAMETER_KEYS if k in attrs}
            fields, specs = {}, {}
            has_group = group in f
            if has_group:
                g = f[group]
                for name, dsname in GADGET_FIELDS.items():
                    obj = g.get(dsname)
                    if isinstance(obj, h5py.Dataset):
                        fields[name] = (tuple(obj.shape), obj.dtype)
                        specs[name] = f"{group}/{dsname}"
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be opened as HDF5 ({exc})") from None
    return _FileMeta(path, header, has_group, fields, specs, parameters)


def _types_present(metas: list[_FileMeta]) -> list[int]:
    present = set()
    for m in metas:
        counts = m.header.get("NumPart_ThisFile") or []
        present.update(t for t, c in enumerate(counts) if c)
    return sorted(present)


def _setting(meta: _FileMeta, key: str) -> float | None:
    """``key`` from ``Header`` or from the ``Parameters`` group; both must agree."""
    in_header = _scalar(meta.header, key)
    in_parameters = _scalar(meta.parameters, key)
    if (in_header is not None and in_parameters is not None
            and not math.isclose(in_header, in_parameters, rel_tol=1e-6)):
        raise SnapshotError(
            f"{meta.path}: Header/{key} is {in_header!r} but Parameters/{key} is "
            f"{in_parameters!r}; where both hold it they must agree (to a relative 1e-6)"
        )
    return in_parameters if in_header is None else in_header


def _cosmological(meta: _FileMeta, hdr: str) -> tuple[bool, str]:
    """Decide whether the run is cosmological; return (answer, rule used).

    ``hdr`` is how the rule names header entries (``_Format.header``).
    """
    flag = _setting(meta, "ComovingIntegrationOn")
    if flag is not None:
        in_header = _scalar(meta.header, "ComovingIntegrationOn") is not None
        where = "Header" if in_header else "Parameters"
        return bool(flag), f"{where}/ComovingIntegrationOn = {flag:g}"
    time = _scalar(meta.header, "Time")
    omega0 = _scalar(meta.header, "Omega0")
    answer = time is not None and 0 < time <= 1 and omega0 is not None and omega0 > 0
    return answer, (f"0 < {hdr}Time <= 1 and {hdr}Omega0 > 0 (Time = {time}, "
                    f"Omega0 = {omega0})")


def _unit_name(value: float | None, table: Mapping[float, str], cgs: str) -> str | None:
    if value is None:
        return None
    for ref, name in table.items():
        if math.isclose(value, ref, rel_tol=1e-3):
            return name
    return f"{value:.6g} {cgs}"


def _header_units(meta: _FileMeta, cosmological: bool) -> dict[str, str]:
    units = dict(DEFAULT_UNITS)
    length = _unit_name(_setting(meta, "UnitLength_in_cm"), _LENGTH_UNITS, "cm/h")
    mass = _unit_name(_setting(meta, "UnitMass_in_g"), _MASS_UNITS, "g/h")
    vel = _unit_name(_setting(meta, "UnitVelocity_in_cm_per_s"), _VELOCITY_UNITS, "cm/s")
    if length:
        units["length"] = length
    if mass:
        units["mass"] = mass
    if vel:
        units["velocity"] = f"{vel} (peculiar)" if cosmological else vel
    elif not cosmological:
        units["velocity"] = "km/s"
    return units


# ----------------------------------------------------------------------------- reading
def _wrap_into_box(data: np.ndarray, box: float) -> np.ndarray:
    """Map positions one box outside into [0, box): x >= box -> x - box, x < 0 -> x + box."""
    box_t = data.dtype.type(box)
    out = np.where(data >= box_t, data - box_t, data)
    out = np.where(out < 0, out + box_t, out)
    # x + box of a tiny negative x can round up to box itself: that is 0 periodically
    out = np.where(out >= box_t, data.dtype.type(0), out)
    return out.astype(data.dtype, copy=False)


def _read_hdf5_rows(path: str, dataset: str, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of ``dataset`` in ``path`` (opens and closes the file)."""
    with h5py.File(path, "r") as f:
        return f[dataset][start:stop]


def _read_piece(read_rows: Callable[[str, Any, int, int], np.ndarray], path: str, spec: Any,
                start: int, stop: int, scale: float | None, box: float | None) -> np.ndarray:
    """Rows [start, stop) of one field of ``path``, velocity factor and box wrap applied
    (a dask task of either reader)."""
    data = read_rows(path, spec, start, stop)
    if scale is not None:
        data = (data * np.float64(scale)).astype(data.dtype, copy=False)
    if box is not None:
        data = _wrap_into_box(data, box)
    return data


def _lazy_field(pieces: list[tuple[str, Any, int, int]],
                read_rows: Callable[[str, Any, int, int], np.ndarray], trailing: tuple[int, ...],
                dtype: np.dtype, stamps: list[Any], scale: float | None,
                box: float | None) -> da.Array:
    """A dask array of ``pieces`` ``(path, spec, start, stop)``, one task each."""
    token = tokenize(pieces, read_rows, trailing, str(dtype), stamps, scale, box)
    name = f"gadget-read-{token}"
    tail = (0,) * len(trailing)
    dsk = {
        (name, i) + tail: (_read_piece, read_rows, path, spec, start, stop, scale, box)
        for i, (path, spec, start, stop) in enumerate(pieces)
    }
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    chunks = (tuple(stop - start for _, _, start, stop in pieces),) + tuple((n,) for n in trailing)
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


def _scan(metas: list[_FileMeta], part_type: int, source: str, fmt: _Format):
    """Check the set from its headers; return the per-file counts and the field layout."""
    first, hdr = metas[0], fmt.header
    n_files_hdr = _scalar(first.header, "NumFilesPerSnapshot")
    if n_files_hdr is not None and int(n_files_hdr) != len(metas):
        raise SnapshotError(
            f"{source}: matched {len(metas)} file(s) but {hdr}NumFilesPerSnapshot of "
            f"{first.path} is {int(n_files_hdr)}; the pattern must match exactly the files of "
            "one snapshot"
        )
    group = f"PartType{part_type}"  # has_type is False only for HDF5 files without the group
    if not any(m.has_type for m in metas):
        present = _types_present(metas)
        raise SnapshotError(
            f"{source}: no '{group}' group in any of the {len(metas)} file(s); particle types "
            f"with particles: {present or 'none'} (choose one with part_type=)"
        )
    counts = []
    for m in metas:
        n = _per_type(m.header, "NumPart_ThisFile", part_type)
        if n is None:
            raise SnapshotError(f"{m.path}: {hdr[:-1]} has no NumPart_ThisFile attribute")
        n = int(n)
        if n > 0 and not m.has_type:
            raise SnapshotError(
                f"{m.path}: {hdr}NumPart_ThisFile[{part_type}] is {n} but there is no "
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
                f"{source}: {hdr}NumPart_Total[{part_type}] is {total} but NumPart_ThisFile"
                f"[{part_type}] sums to {total_sum} over {len(metas)} file(s); files are "
                "missing, extra or from different snapshots"
            )
    if total_sum == 0:
        raise SnapshotError(
            f"{source}: no particles of type {part_type} (NumPart_ThisFile[{part_type}] is 0 "
            f"in every file); types with particles: {_types_present(metas) or 'none'}"
        )
    used = [(m, n) for m, n in zip(metas, counts, strict=True) if n > 0]
    tables = {m.path: _per_type(m.header, "MassTable", part_type) for m, _ in used}
    if len({float(v or 0) for v in tables.values()}) > 1:
        raise SnapshotError(
            f"{source}: {hdr}MassTable[{part_type}] differs between files: {tables}"
        )
    ref, _ = used[0]
    if "pos" not in ref.fields:
        raise SnapshotError(f"{ref.path}: {fmt.label('pos', part_type)} is missing")
    layout: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for name, (shape, dtype) in ref.fields.items():
        layout[name] = (tuple(shape[1:]), dtype)
    for m, n in used:
        if set(m.fields) != set(layout):
            have = sorted(fmt.label(k, part_type) for k in m.fields)
            want = sorted(fmt.label(k, part_type) for k in layout)
            raise SnapshotError(
                f"{m.path}: has {have} but {ref.path} has {want}; all files must hold the "
                "same datasets"
            )
        for name, (shape, dtype) in m.fields.items():
            label = fmt.label(name, part_type)
            trailing, ref_dtype = layout[name]
            if dtype != ref_dtype:
                raise SnapshotError(
                    f"{m.path}: {label} has dtype {dtype} but it is {ref_dtype} in "
                    f"{ref.path}; dtypes must agree across files"
                )
            if tuple(shape[1:]) != trailing or shape[0] != n:
                raise SnapshotError(
                    f"{m.path}: {label} has shape {shape}; expected {(n,) + trailing} "
                    f"from {hdr}NumPart_ThisFile[{part_type}] = {n}"
                )
    for name, (trailing, dtype) in layout.items():
        check_array_meta(name, (total_sum,) + trailing, dtype, f"{ref.path}: {group}")
    return counts, layout


def _assemble(path_or_pattern: str | os.PathLike, part_type: Any, chunks: Any,
              units: Mapping[str, str] | None, fmt: _Format):
    """The lazy Snapshot of one particle type of a snapshot in format ``fmt``.

    The body of both public readers: checks the arguments, finds the files
    (:func:`_find_files`), reads their metadata (``fmt.read_meta``), checks the
    set (:func:`_scan`), applies the conventions of the module docs (box,
    cosmological rule and velocity factor, units and G, MassTable or
    per-particle masses), cuts every file's rows into pieces of at most
    ``chunks`` (never across files) and builds one ``gadget-read-<token>`` task
    per piece and field, each calling ``fmt.read_rows`` (:func:`_read_piece`).
    """
    part_type = _check_part_type(part_type)
    rows = _check_chunks(chunks)
    source = os.fspath(path_or_pattern)
    metas = [fmt.read_meta(p, part_type) for p in _find_files(path_or_pattern, fmt)]
    counts, layout = _scan(metas, part_type, source, fmt)
    first = metas[0]
    header = first.header

    box = _scalar(header, "BoxSize")
    box_size = box if box is not None and box > 0 else None
    cosmological, rule = _cosmological(first, fmt.header)
    time = _scalar(header, "Time")
    vel_factor = math.sqrt(time) if cosmological and time is not None and time > 0 else 1.0
    scale_factor = time if cosmological and time is not None and time > 0 else None
    cosmology = None
    if cosmological:
        cosmology = {
            "Omega_m": _setting(first, "Omega0"),
            "Omega_b": _setting(first, "OmegaBaryon"),
            "Omega_L": _setting(first, "OmegaLambda"),
            "h": _setting(first, "HubbleParam"),
            "sigma8": None,
            "n_s": None,
        }
    final_units = _merge_units(_header_units(first, cosmological), units)
    G = gravitational_constant(final_units, h=cosmology and cosmology["h"])  # noqa: N806

    particle_mass = None
    if "mass" not in layout:
        table = _per_type(header, "MassTable", part_type)
        if table is None or float(table) <= 0:
            raise SnapshotError(
                f"{source}: {fmt.no_masses.format(t=part_type)} and "
                f"{fmt.header}MassTable[{part_type}] is {table}; particle masses are unknown "
                "(a positive MassTable entry or per-particle masses are needed)"
            )
        particle_mass = float(table)

    pieces = []
    for m, n in zip(metas, counts, strict=True):
        for start in range(0, n, rows):
            pieces.append((m, start, min(start + rows, n)))
    stamps = []
    for m, n in zip(metas, counts, strict=True):
        if n:
            st = os.stat(m.path)
            stamps.append((m.path, st.st_size, st.st_mtime_ns))

    arrays = {}
    for name, (trailing, dtype) in layout.items():
        scale = vel_factor if name == "vel" and vel_factor != 1.0 else None
        wrap = box_size if name == "pos" else None
        field_pieces = [(m.path, m.specs[name], start, stop) for m, start, stop in pieces]
        arrays[name] = _lazy_field(field_pieces, fmt.read_rows, trailing, dtype, stamps,
                                   scale, wrap)

    info = GadgetInfo(
        files=tuple(m.path for m in metas), part_type=part_type, n_particles=sum(counts),
        n_per_file=tuple(counts), header=header, cosmological=cosmological,
        cosmological_rule=rule, velocity_factor=vel_factor, format=first.format,
    )
    logger.info("gadget import %s (%s): %d particles of type %d from %d file(s); "
                "cosmological=%s (%s); velocities x %g", source, info.format, info.n_particles,
                part_type, len(metas), cosmological, rule, vel_factor)

    from ..snapshot import Snapshot

    snap = Snapshot.from_arrays(
        arrays["pos"], arrays.get("vel"), arrays.get("ids"), arrays.get("mass"),
        box_size=box_size, particle_mass=particle_mass, scale_factor=scale_factor,
        cosmology=cosmology, units=final_units, G=G,
    )
    snap.gadget_info = info
    return snap


_HDF5 = _Format(
    kind="Gadget HDF5", subfile=_SUBFILE, extensions=_EXTENSIONS, num_files=_num_files,
    read_meta=_read_file_meta, header="Header/", read_rows=_read_hdf5_rows,
    labels={name: f"'PartType{{t}}/{dsname}'" for name, dsname in GADGET_FIELDS.items()},
    no_masses="PartType{t} has no 'Masses' dataset",
)


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
        ``{length, velocity, mass}`` strings overriding those derived from
        ``UnitLength_in_cm``, ``UnitMass_in_g``, ``UnitVelocity_in_cm_per_s``
        (attributes of ``Header`` or of the ``Parameters`` group; Gadget
        defaults kpc/h, km/s, 1e10 Msun/h when absent). ``G`` is set for (kpc/h or Mpc/h, km/s,
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
        of ``NumPart_ThisFile``; no ``Masses`` dataset and no MassTable entry;
        ``Header`` and ``Parameters`` holding different units, ``HubbleParam``
        or ``ComovingIntegrationOn``.
    """
    return _assemble(path_or_pattern, part_type, chunks, units, _HDF5)
