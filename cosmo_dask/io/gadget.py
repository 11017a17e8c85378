"""Lazy import of Gadget / AREPO style HDF5 snapshots (single files and multi-file sets).

The file lookup (:func:`_find_files`), the checks and conventions below and the
assembly of a lazy Snapshot from the headers (:func:`_assemble`) are shared with
the format-1/2 binary reader, :mod:`cosmo_dask.io.gadget_binary`, and the SWIFT
reader, :mod:`cosmo_dask.io.swift`: a reader only describes its format
(:class:`_Format`), reads each file's header into a :class:`_FileMeta`,
supplies the dask task that reads rows of one field of one file and, where its
conventions differ from Gadget's (SWIFT), the function that applies them
(:class:`_Conventions`).

At call time :func:`from_gadget_hdf5` reads only the ``Header`` attributes and the
shapes and dtypes of the ``PartType{n}`` datasets of every file. Particle data
are read by dask tasks, one per piece of at most ``chunks`` rows of one file;
each task opens its file with h5py, reads its row slice and closes the file, so
the graph holds only paths and dataset names and runs on distributed workers.
``part_type`` is one type, or a list of types or ``"all"``: each type is read as
one type is, and the types are joined into one snapshot with a ``ptype`` array
and per-particle masses (:func:`_joint_arrays`; ``docs/gadget.md``, "Several
particle types"). Every snapshot carries ``provenance`` (files, format, types,
header), which ``to_zarr`` stores. Every other dataset of a ``PartType{n}`` group
(``InternalEnergy``, ``Density``, ...; the binary reader's gas blocks) becomes an
extra per-particle field of the snapshot, read by the same tasks (``fields=``
selects them; :func:`_select_fields`); with several types a field that some types
lack is NaN for their particles.

Conventions applied while reading (see ``docs/gadget.md``):

* **Velocities.** Gadget writes ``v_stored = v_pec / sqrt(a)`` in cosmological
  runs. A run counts as cosmological when the file has an attribute
  ``ComovingIntegrationOn`` (in the ``Parameters`` group, as Gadget-4 and AREPO
  write it, or in ``Header``) and it is non-zero, or, without it, when ``0 < Header/Time <= 1`` and
  ``Header/Omega0 > 0``. Then velocities are multiplied by ``sqrt(Time)`` (giving
  peculiar km/s), ``Time`` becomes the scale factor and the Omega/h values the
  cosmology; otherwise velocities are returned as stored and the snapshot has
  no scale factor and no cosmology.
* **Box.** ``BoxSize`` is a number, or three equal sides (SWIFT writes a
  3-vector); unequal sides, a negative or a non-finite side are an error, 0 means
  isolated.
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
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import dask.array as da
import h5py
import numpy as np
from dask.base import tokenize

from ..core.backend import default_chunk_size
from ..core.errors import ParameterError, SnapshotError
from ..core.task_graph import TaskGraph
from ..store.validation import (
    ARRAY_SCHEMA,
    FIELD_KINDS,
    FIELD_NAME,
    check_array_meta,
    check_field_meta,
    wrap_one_box,
)
from ..store.zarr_write import plain_attrs
from ..units import QUANTITIES, check_units, gravitational_constant

logger = logging.getLogger(__name__)

#: snapshot array name -> dataset name inside ``PartType{n}``
GADGET_FIELDS: dict[str, str] = {
    "pos": "Coordinates",
    "vel": "Velocities",
    "ids": "ParticleIDs",
    "mass": "Masses",
}

#: Gadget particle types 0..5
GADGET_TYPES = ("gas", "dark matter", "disk", "bulge", "stars", "black holes")

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

#: settings read from ``Header`` or from the ``Parameters`` group (both must agree)
_PARAMETER_KEYS = ("UnitLength_in_cm", "UnitMass_in_g", "UnitVelocity_in_cm_per_s",
                   "HubbleParam", "ComovingIntegrationOn", "Omega0", "OmegaLambda",
                   "OmegaBaryon")


@dataclass(frozen=True)
class GadgetInfo:
    """What :func:`from_gadget_hdf5`, ``from_gadget_binary`` or ``from_swift`` found and
    applied (``snapshot.gadget_info``).

    Attributes
    ----------
    files : tuple of str
        Absolute paths of all files of the set, in file-number order.
    part_type : int or tuple of int
        The particle type read (0 gas, 1 dark matter, ...) when ``part_type`` was
        one int; the types read, ascending, when it was a list or ``"all"``.
    n_particles : int
        Number of particles read over all files (all types read).
    n_per_file : tuple of int
        Particles read from each file: ``NumPart_ThisFile[part_type]`` (0 for skipped
        files), summed over the types read.
    header : dict
        ``Header`` attributes of the first file as plain Python values (for
        binary files the 256-byte header, under the HDF5 attribute names).
    cosmological : bool
        Whether the run was taken to be cosmological (see module docs).
    cosmological_rule : str
        Which rule decided ``cosmological``, with the values it used.
    velocity_factor : float
        Factor applied to the stored velocities (Gadget: ``sqrt(Time)`` or 1.0; SWIFT:
        ``a`` to the power of the ``a-scale exponent`` of ``Velocities``).
    format : str
        File format of the first file: ``"hdf5"``, ``"binary-1"`` or ``"binary-2"``
        (Gadget SnapFormat 1 or 2), ``"swift"`` (:func:`~cosmo_dask.io.from_swift`).
    velocity_rule : str
        How ``velocity_factor`` was found, with the values used.
    n_per_type : dict
        ``{type: particles over all files}`` of the types read.
    dropped : dict
        Several types only: ``{field: types without it}`` of the fields (``"vel"``,
        ``"ids"``) left out of the joint snapshot because some type read lacks them.
    """

    files: tuple[str, ...]
    part_type: int | tuple[int, ...]
    n_particles: int
    n_per_file: tuple[int, ...]
    header: dict[str, Any] = field(repr=False)
    cosmological: bool
    cosmological_rule: str
    velocity_factor: float
    format: str = "hdf5"
    velocity_rule: str = ""
    n_per_type: dict[int, int] = field(default_factory=dict)
    dropped: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def provenance(self) -> dict[str, Any]:
        """What a snapshot store records of this import (its ``provenance`` attribute):
        the source ``files``, their ``format``, the ``part_types`` read, ``n_per_type``
        and the first file's ``header``, as JSON values."""
        types = self.part_type if isinstance(self.part_type, tuple) else (self.part_type,)
        return {"files": list(self.files), "format": self.format, "part_types": list(types),
                "n_per_type": {str(t): n for t, n in self.n_per_type.items()},
                "header": plain_attrs(self.header, nonfinite_as_text=True)}


@dataclass(frozen=True)
class _Format:
    """What differs between the readers (Gadget HDF5, Gadget binary, SWIFT); the rest
    is shared. The fields after ``no_masses`` default to Gadget's.

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
    family : str
        The code family in messages (``"Gadget"``, ``"SWIFT"``).
    types : tuple of str
        Names of the particle types 0, 1, ...: ``part_type`` must index it.
    conventions : callable, optional
        ``conventions(metas, fmt)``: the :class:`_Conventions` of the set (box, cosmological
        rule, scale factor, velocity factor, cosmology, units); default
        :func:`_gadget_conventions`.
    mass_table : bool
        Whether ``Header/MassTable`` stands in for missing per-particle masses.
    not_hdf5, no_header : str
        HDF5 formats: message tails for a file that is not HDF5 / has no ``Header``.
    field_label : str
        How messages name an extra field without an entry in ``labels``, with ``{t}``
        and ``{name}`` (its dataset name).
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
    family: str = "Gadget"
    types: tuple[str, ...] = GADGET_TYPES
    conventions: Callable[[list[_FileMeta], _Format], _Conventions] | None = None
    mass_table: bool = True
    not_hdf5: str = ("from_gadget_hdf5 reads Gadget/AREPO HDF5 snapshots (use "
                     "from_gadget_binary for Gadget format-1/2 binary files)")
    no_header: str = ("not a Gadget/AREPO HDF5 snapshot (expected groups Header and "
                      "PartType0..PartType5)")
    field_label: str = "'PartType{t}/{name}'"

    def label(self, name: str, part_type: int) -> str:
        """How messages name field ``name`` (a core array or an extra dataset) of a type."""
        return self.labels.get(name, self.field_label).format(t=part_type, name=name)


@dataclass(frozen=True)
class _Conventions:
    """What a format's metadata say about the run, as :func:`_assemble` applies it.

    ``units`` holds the units the files state (any of length, velocity, mass may be
    missing: then ``no_units`` says why, and ``units=`` must supply them);
    ``velocity_rule`` says how ``velocity_factor`` was found.
    """

    box_size: float | None
    cosmological: bool
    rule: str
    scale_factor: float | None
    velocity_factor: float
    cosmology: dict[str, Any] | None
    units: dict[str, str]
    velocity_rule: str
    no_units: str = ""


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


def _check_hdf5(path: str, fmt: _Format) -> None:
    if not h5py.is_hdf5(path):
        raise SnapshotError(f"{path}: not an HDF5 file; {fmt.not_hdf5}")


def _files_in_set(path: str, value: Any, what: str) -> int:
    """A header's file count (``what`` names it in the message) as a positive int."""
    n = _scalar({"n": value}, "n")
    if n is None or n < 1 or n != int(n):
        raise SnapshotError(f"{path}: {what} is {value!r}; expected a positive integer")
    return int(n)


def _num_files(path: str, fmt: _Format | None = None) -> int:
    """``Header/NumFilesPerSnapshot`` of one HDF5 file (1 when absent); ``fmt`` words
    the messages (default Gadget HDF5)."""
    fmt = fmt or _HDF5
    _check_hdf5(path, fmt)
    try:
        with h5py.File(path, "r") as f:
            if "Header" not in f:
                raise SnapshotError(f"{path}: no 'Header' group; {fmt.no_header}")
            value = _py(f["Header"].attrs.get("NumFilesPerSnapshot", 1))
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be opened as HDF5 ({exc})") from None
    return _files_in_set(path, value, "Header/NumFilesPerSnapshot")


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
        f"{path}: no such {fmt.family} snapshot (tried {', '.join(singles + sets)}); give a "
        f"{fmt.kind} file, one file of a multi-file set, the base name or a glob pattern"
    )


# ----------------------------------------------------------------------------- scanning
@dataclass
class _FileMeta:
    """What a reader found in one file without reading particle data.

    ``has_type``: the file has a place for the type's rows (HDF5: a
    ``PartType{n}`` group; binary files: always, their blocks hold every type).
    ``fields``: field -> (shape, dtype) of the type's rows as they will be
    returned: the core fields ``pos``, ``vel``, ``ids``, ``mass``, then the extra
    fields under their dataset names (``InternalEnergy``). ``specs``: field -> what
    ``_Format.read_rows`` needs to find those rows (HDF5: the dataset name; binary:
    byte offset, on-disk dtype, row shape).
    ``parameters``: the ``_PARAMETER_KEYS`` found in a ``Parameters`` group.
    ``sources``: further files the type's rows are read from (the source files of
    HDF5 virtual datasets); their size and modification time enter the task keys.
    ``extra``: what a format reads besides (SWIFT: units, cosmology, dataset attributes).
    """

    path: str
    header: dict[str, Any]
    has_type: bool
    fields: dict[str, tuple[tuple[int, ...], np.dtype]]
    specs: dict[str, Any]
    parameters: dict[str, Any] = field(default_factory=dict)
    format: str = "hdf5"
    sources: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def _read_file_meta(path: str, part_type: int, fmt: _Format | None = None,
                    extra: Callable[[h5py.File, _FileMeta], None] | None = None) -> _FileMeta:
    """Header and Parameters attributes and dataset shapes/dtypes of one HDF5 file.

    ``fmt`` words the messages (default Gadget HDF5); ``extra(file, meta)``, called
    while the file is open, reads what a format needs besides (SWIFT's groups).
    """
    fmt = fmt or _HDF5
    _check_hdf5(path, fmt)
    group = f"PartType{part_type}"
    try:
        with h5py.File(path, "r") as f:
            if "Header" not in f:
                raise SnapshotError(f"{path}: no 'Header' group; {fmt.no_header}")
            header = {k: _py(v) for k, v in f["Header"].attrs.items()}
            parameters = {}
            if "Parameters" in f:
                attrs = f["Parameters"].attrs
                parameters = {k: _py(attrs[k]) for k in _PARAMETER_KEYS if k in attrs}
            fields, specs, sources = {}, {}, []
            has_group = group in f
            if has_group:
                g = f[group]
                core = {dsname: name for name, dsname in GADGET_FIELDS.items()}
                names = [*GADGET_FIELDS.values(), *(k for k in g if k not in core)]
                for dsname in names:
                    obj = g.get(dsname)
                    name = core.get(dsname, dsname)
                    if not isinstance(obj, h5py.Dataset) or (dsname not in core
                                                              and dsname in ARRAY_SCHEMA):
                        continue  # subgroups and datasets named like a core array: not read
                    fields[name] = (tuple(obj.shape), obj.dtype)
                    specs[name] = f"{group}/{dsname}"
                    sources += _virtual_sources(path, obj, fmt.label(name, part_type))
            meta = _FileMeta(path, header, has_group, fields, specs, parameters,
                             sources=tuple(dict.fromkeys(sources)))
            if extra is not None:
                extra(f, meta)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be opened as HDF5 ({exc})") from None
    return meta


def _virtual_sources(path: str, dataset: h5py.Dataset, label: str) -> list[str]:
    """The source files of an HDF5 virtual dataset (none for a regular one), each of
    which must exist: HDF5 reads a missing source as fill values, without an error.
    A relative name is looked up as HDF5 does: under ``HDF5_VDS_PREFIX`` when that is
    set (``${ORIGIN}`` standing for the virtual file's folder), else beside the file."""
    if not dataset.is_virtual:
        return []
    folder = os.path.dirname(path)
    prefix = os.environ.get("HDF5_VDS_PREFIX")
    found = []
    for vmap in dataset.virtual_sources():
        name = vmap.file_name
        tried = [path] if name == "." else [os.path.join(folder, name)]
        if prefix and name != ".":
            tried.insert(0, os.path.join(prefix.replace("${ORIGIN}", folder), name))
        source = next((p for p in tried if os.path.isfile(p)), None)
        if source is None:
            raise SnapshotError(
                f"{path}: {label} is a virtual dataset over {name}, which is not at "
                f"{' or '.join(tried)} (HDF5 would read its rows as fill values); keep the "
                "files of a virtual snapshot beside it"
            )
        if source != path:
            found.append(os.path.abspath(source))
    return found


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


def _unit_name(value: float | None, table: Mapping[float, str], cgs: str, *,
               rel_tol: float = 1e-3, digits: int = 6) -> str | None:
    """The name in ``table`` {cgs value: name} of a unit given in cgs (to ``rel_tol``),
    else the value with ``digits`` significant digits and ``cgs``; None for None."""
    if value is None:
        return None
    for ref, name in table.items():
        if math.isclose(value, ref, rel_tol=rel_tol):
            return name
    return f"{value:.{digits}g} {cgs}"


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


def _box_size(meta: _FileMeta, hdr: str) -> float | None:
    """``BoxSize`` of a header: a number (Gadget) or a 3-vector of equal sides (SWIFT);
    0 or absent means isolated (None). Unequal sides are an error, never "isolated"."""
    value = meta.header.get("BoxSize")
    if isinstance(value, list) and len(value) != 1:
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if len(value) != 3 or not numeric:
            raise SnapshotError(f"{meta.path}: {hdr}BoxSize is {value!r}; expected a number "
                                "or the three sides of the box")
        if not math.isclose(min(value), max(value), rel_tol=1e-9):
            raise SnapshotError(
                f"{meta.path}: {hdr}BoxSize has sides {value[0]!r}, {value[1]!r}, "
                f"{value[2]!r}; non-cubic boxes are not supported yet"
            )
        value = value[0]
    box = _scalar({"BoxSize": value}, "BoxSize")
    if box is not None and not (math.isfinite(box) and box >= 0):
        raise SnapshotError(f"{meta.path}: {hdr}BoxSize is {box!r}; expected the side of the "
                            "periodic box (> 0) or 0 for an isolated run")
    return box if box is not None and box > 0 else None


def _gadget_conventions(metas: list[_FileMeta], fmt: _Format) -> _Conventions:
    """The Gadget conventions of the module docs, from the first file's header (and
    ``Parameters`` group): box, cosmological rule, ``sqrt(Time)``, Omega/h, units."""
    first = metas[0]
    box_size = _box_size(first, fmt.header)
    if str(first.header.get("Code", "")).strip() == "SWIFT":
        warnings.warn(
            f"{first.path}: Header/Code is 'SWIFT'; {fmt.kind} conventions read its box and "
            "particles but not its Units group, Cosmology group or Scale-factor (units are "
            "taken as the Gadget defaults); use cosmo_dask.io.from_swift", stacklevel=4)
    cosmological, rule = _cosmological(first, fmt.header)
    time = _scalar(first.header, "Time")
    expanding = cosmological and time is not None and time > 0
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
    return _Conventions(
        box_size=box_size, cosmological=cosmological, rule=rule,
        scale_factor=time if expanding else None,
        velocity_factor=math.sqrt(time) if expanding else 1.0, cosmology=cosmology,
        units=_header_units(first, cosmological),
        velocity_rule=(f"sqrt({fmt.header}Time) = sqrt({time})" if expanding else
                       f"as stored ({fmt.header}Time = {time} is no scale factor)"
                       if cosmological else "as stored (not a cosmological run)"),
    )


# ----------------------------------------------------------------------------- reading
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
        data = wrap_one_box(data, box)  # farther out: reported by validation
    return data


def _lazy_field(pieces: list[tuple[str, Any, int, int]],
                read_rows: Callable[[str, Any, int, int], np.ndarray], trailing: tuple[int, ...],
                dtype: np.dtype, stamps: list[Any], scale: float | None,
                box: float | None) -> da.Array:
    """A dask array of ``pieces`` ``(path, spec, start, stop)``, one task each."""
    token = tokenize(pieces, read_rows, trailing, str(dtype), stamps, scale, box)
    name = f"gadget-read-{token}"
    tail = (0,) * len(trailing)
    g = TaskGraph()
    for i, (path, spec, start, stop) in enumerate(pieces):
        g.add((name, i) + tail, _read_piece, read_rows, path, spec, start, stop, scale, box)
    chunks = (tuple(stop - start for _, _, start, stop in pieces),) + tuple((n,) for n in trailing)
    return g.array(name, chunks, np.empty((0,) + trailing, dtype=dtype))


def _check_chunks(chunks: Any) -> int:
    if chunks is None:
        return default_chunk_size()
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ParameterError(f"chunks must be a positive number of particles, got {chunks!r}")
    return int(chunks)


def _check_part_type(part_type: Any, fmt: _Format) -> tuple[int, ...] | None:
    """The types asked for: ``(t,)`` for one int, the ascending types of a list or tuple,
    None for ``"all"`` (the types with particles, found from the headers)."""
    if isinstance(part_type, str) and part_type == "all":
        return None
    several = isinstance(part_type, (list, tuple))
    values = list(part_type) if several else [part_type]
    for value in values:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if not ok or not 0 <= value < len(fmt.types):
            names = ", ".join(f"{t} {name}" for t, name in enumerate(fmt.types))
            got = f"{value!r} in {part_type!r}" if several else repr(part_type)
            raise ParameterError(
                f"part_type must be a {fmt.family} particle type 0..{len(fmt.types) - 1} "
                f"({names}), got {got}; several types: a list of them or 'all'"
            )
    types = [int(v) for v in values]
    if not types:
        raise ParameterError(f"part_type is empty ({part_type!r}); give a {fmt.family} "
                             "particle type, a list of them or 'all'")
    if len(set(types)) != len(types):
        raise ParameterError(f"part_type {part_type!r} names a type more than once; give "
                             "each type once")
    return tuple(sorted(types))


def _all_types(metas: list[_FileMeta], source: str, fmt: _Format) -> tuple[int, ...]:
    """``part_type="all"``: the types with particles in some file of the set."""
    types = tuple(t for t in _types_present(metas) if t < len(fmt.types))
    if not types:
        raise SnapshotError(
            f"{source}: no particles of any type ({fmt.header}NumPart_ThisFile is 0 in all "
            f"{len(metas)} file(s)); part_type='all' needs at least one"
        )
    return types


def _merge_units(header_units: dict[str, str], units: Mapping[str, str] | None) -> dict[str, str]:
    return header_units if units is None else {**header_units, **check_units(units)}


def _check_fields(fields: Any) -> tuple[str, ...] | None:
    """The ``fields=`` argument: None (every extra dataset) or a tuple of names."""
    several = isinstance(fields, (list, tuple, set, frozenset))
    if fields is not None and not (several and all(isinstance(f, str) for f in fields)):
        raise ParameterError(f"fields must be None (every extra dataset), () (none) or a list "
                             f"of dataset names, got {fields!r}")
    return None if fields is None else tuple(dict.fromkeys(fields))


def _select_fields(metas_of: Mapping[int, list[_FileMeta]], wanted: tuple[str, ...] | None,
                   source: str, fmt: _Format) -> dict[int, list[_FileMeta]]:
    """Each type's file metadata keeping the core fields and the extra fields read.

    ``wanted`` None: the extra datasets every file with particles of the type holds
    as a numeric (N,) or (N, k) array of its N rows, named as a field may be (others
    are left out and logged);
    a tuple: those names, for the types that have them (each must exist for some
    type read; :func:`_scan` then checks them like the core fields).
    """
    def usable(m: _FileMeta, t: int) -> set[str]:
        n = _per_type(m.header, "NumPart_ThisFile", t) or 0
        return {k for k, (shape, dtype) in m.fields.items() if k not in GADGET_FIELDS
                and len(shape) in (1, 2) and shape[0] == n and dtype.kind in FIELD_KINDS
                and FIELD_NAME.fullmatch(k)}

    present = {t: {k for m in metas for k in m.fields if k not in GADGET_FIELDS}
               for t, metas in metas_of.items()}
    everywhere = {}
    for t, metas in metas_of.items():
        used = [m for m in metas if (_per_type(m.header, "NumPart_ThisFile", t) or 0) > 0]
        everywhere[t] = set.intersection(*(usable(m, t) for m in used)) if used else set()
    if wanted is None:
        keep = everywhere
        for t in metas_of:
            if present[t] - keep[t]:
                logger.warning("%s import %s: %s left out: not a numeric (N,) or (N, k) array "
                               "in every file with particles of type %d, or not a field name "
                               "(letters, digits, '_')", fmt.family, source,
                               ", ".join(sorted(present[t] - keep[t])), t)
    else:
        available = sorted(set().union(*present.values()))
        unknown = [name for name in wanted if name not in available]
        if unknown:
            types = ", ".join(map(str, metas_of))
            raise SnapshotError(f"{source}: no field {', '.join(map(repr, unknown))} in "
                                f"particle type(s) {types}; available: "
                                f"{', '.join(available) or 'none'}")
        keep = {t: set(wanted) & present[t] for t in metas_of}
    out = {}
    for t, metas in metas_of.items():
        def kept(d: dict[str, Any], t: int = t) -> dict[str, Any]:
            return {k: v for k, v in d.items() if k in GADGET_FIELDS or k in keep[t]}

        out[t] = [replace(m, fields=kept(m.fields), specs=kept(m.specs)) for m in metas]
    return out


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
        check = check_array_meta if name in GADGET_FIELDS else check_field_meta
        check(name, (total_sum,) + trailing, dtype, f"{ref.path}: {group}")
    return counts, layout


def _table_mass(header: Mapping[str, Any], layout: Mapping[str, Any], part_type: int,
                source: str, fmt: _Format) -> float | None:
    """None when the type has per-particle masses, else its positive ``MassTable`` entry
    (an error where the format has no MassTable or the entry is not positive)."""
    if "mass" in layout:
        return None
    if not fmt.mass_table:
        raise SnapshotError(f"{source}: {fmt.no_masses.format(t=part_type)}; particle "
                            "masses are unknown")
    table = _per_type(header, "MassTable", part_type)
    if table is None or float(table) <= 0:
        raise SnapshotError(
            f"{source}: {fmt.no_masses.format(t=part_type)} and "
            f"{fmt.header}MassTable[{part_type}] is {table}; particle masses are unknown "
            "(a positive MassTable entry or per-particle masses are needed)"
        )
    return float(table)


def _type_arrays(metas: list[_FileMeta], counts: list[int],
                 layout: Mapping[str, tuple[tuple[int, ...], np.dtype]], rows: int,
                 conv: _Conventions, fmt: _Format) -> dict[str, da.Array]:
    """The lazy arrays of one particle type: every file's rows cut into pieces of at most
    ``rows`` (never across files), one ``gadget-read-<token>`` task per piece and field."""
    pieces = []
    for m, n in zip(metas, counts, strict=True):
        for start in range(0, n, rows):
            pieces.append((m, start, min(start + rows, n)))
    stamps = []
    for m, n in zip(metas, counts, strict=True):
        for path in (m.path, *m.sources) if n else ():
            st = os.stat(path)
            stamps.append((path, st.st_size, st.st_mtime_ns))
    vel_factor, box_size = conv.velocity_factor, conv.box_size
    arrays = {}
    for name, (trailing, dtype) in layout.items():
        scale = vel_factor if name == "vel" and vel_factor != 1.0 else None
        wrap = box_size if name == "pos" else None
        field_pieces = [(m.path, m.specs[name], start, stop) for m, start, stop in pieces]
        arrays[name] = _lazy_field(field_pieces, fmt.read_rows, trailing, dtype, stamps,
                                   scale, wrap)
    return arrays


def _common_dtype(name: str, dtypes: Mapping[int, np.dtype], source: str,
                  fmt: _Format) -> np.dtype:
    """numpy's promotion of one field's dtypes over the types read; ids must stay integers."""
    common = np.result_type(*dtypes.values())
    if name == "ids" and common.kind not in "iu":
        have = ", ".join(f"{fmt.label(name, t)} {dt}" for t, dt in dtypes.items())
        raise SnapshotError(
            f"{source}: {have}: no integer dtype holds them all (numpy promotes them to "
            f"{common}); read these types separately"
        )
    return common


def _joint_arrays(per_type: Mapping[int, dict[str, da.Array]],
                  table: Mapping[int, float | None], source: str,
                  fmt: _Format) -> tuple[dict[str, da.Array], dict[str, tuple[int, ...]]]:
    """The arrays of several types as one snapshot's, and the fields dropped.

    Each field is the concatenation of the types' arrays in type order, in numpy's
    promotion of their dtypes; a field that some type lacks is dropped (``{field:
    types without it}``). ``mass`` is per particle: each type's masses, or its
    MassTable entry broadcast, in the promotion of the positions' dtype and the
    types' mass dtypes. ``ptype`` (uint8) holds each particle's type. An extra field
    is kept when any type has it, in the promotion of its dtypes, NaN for the types
    without it (lazily, ``da.full`` in the type's chunks; an integer or bool field
    that needs NaN becomes float64). Every type keeps its chunks, so none spans two
    types.
    """
    types = list(per_type)
    dropped = {name: tuple(t for t in types if name not in per_type[t])
               for name in ("vel", "ids") if any(name in a for a in per_type.values())}
    dropped = {name: lacking for name, lacking in dropped.items() if lacking}
    joint = {}
    for name in ("pos", "vel", "ids"):
        if name in dropped or name not in per_type[types[0]]:
            continue
        dtype = _common_dtype(name, {t: per_type[t][name].dtype for t in types}, source, fmt)
        joint[name] = da.concatenate([per_type[t][name].astype(dtype) for t in types])
    mass_dtype = np.result_type(joint["pos"].dtype,
                                *(a["mass"].dtype for a in per_type.values() if "mass" in a))
    rows = {t: per_type[t]["pos"].chunks[0] for t in types}

    def full(t: int, value: Any, dtype: Any, trailing: tuple[int, ...] = ()) -> da.Array:
        """A constant array of type ``t``'s rows, in its chunks."""
        return da.full((sum(rows[t]),) + trailing, value, dtype=dtype,
                       chunks=(rows[t],) + trailing)

    joint["mass"] = da.concatenate([per_type[t]["mass"].astype(mass_dtype) if table[t] is None
                                    else full(t, table[t], mass_dtype) for t in types])
    joint["ptype"] = da.concatenate([full(t, t, np.uint8) for t in types])
    for name in dict.fromkeys(k for t in types for k in per_type[t] if k not in GADGET_FIELDS):
        have = {t: per_type[t][name] for t in types if name in per_type[t]}
        trailing = {a.shape[1:] for a in have.values()}
        if len(trailing) > 1:
            shapes = ", ".join(f"{fmt.label(name, t)} {a.shape}" for t, a in have.items())
            raise SnapshotError(f"{source}: {shapes}: a field's row shape must be the same in "
                                "every type; read these types separately or leave it out with "
                                "fields=")
        dtype = np.result_type(*(a.dtype for a in have.values()))
        lacking = [t for t in types if t not in have]
        if lacking and dtype.kind != "f":
            dtype = np.dtype(np.float64)  # NaN for the types without it
        if lacking:
            logger.info("%s import %s: field %s is NaN (%s) for type(s) %s, which lack it",
                        fmt.family, source, name, dtype, ", ".join(map(str, lacking)))
        (shape,) = trailing
        joint[name] = da.concatenate([have[t].astype(dtype) if t in have
                                      else full(t, np.nan, dtype, shape) for t in types])
    return joint, dropped


def _assemble(path_or_pattern: str | os.PathLike, part_type: Any, chunks: Any,
              units: Mapping[str, str] | None, fmt: _Format, fields: Any = None):
    """The lazy Snapshot of one or several particle types of a snapshot in format ``fmt``.

    The body of the public readers: checks the arguments, finds the files
    (:func:`_find_files`), reads their metadata for each type asked for
    (``fmt.read_meta``), checks the set per type (:func:`_scan`), applies the
    format's conventions (``fmt.conventions``, by default those of the module
    docs: box, cosmological rule and velocity factor, units; then G, MassTable or
    per-particle masses), cuts every file's rows of each type into pieces of at
    most ``chunks`` (never across files or types) and builds one
    ``gadget-read-<token>`` task per piece and field, each calling
    ``fmt.read_rows`` (:func:`_read_piece`). One int ``part_type`` gives that type's
    snapshot; a list or ``"all"`` one snapshot of the types joined
    (:func:`_joint_arrays`), with ``ptype`` and per-particle masses. The extra
    datasets ``fields`` selects (:func:`_select_fields`) become the snapshot's fields.
    """
    requested = _check_part_type(part_type, fmt)
    joint = not isinstance(part_type, (int, np.integer))
    rows = _check_chunks(chunks)
    wanted = _check_fields(fields)
    source = os.fspath(path_or_pattern)
    files = _find_files(path_or_pattern, fmt)
    first_type = 0 if requested is None else requested[0]
    metas = [fmt.read_meta(p, first_type) for p in files]
    types = requested or _all_types(metas, source, fmt)
    metas_of = {t: metas if t == first_type else [fmt.read_meta(p, t) for p in files]
                for t in types}
    metas_of = _select_fields(metas_of, wanted, source, fmt)
    scans = {t: _scan(metas_of[t], t, source, fmt) for t in types}
    first = metas[0]
    header = first.header

    convs = {}
    for i, t in enumerate(types):
        with warnings.catch_warnings():
            if i:  # the set's warnings were given for the first type
                warnings.simplefilter("ignore")
            convs[t] = (fmt.conventions or _gadget_conventions)(metas_of[t], fmt)
    conv = convs[types[0]]
    final_units = _merge_units(conv.units, units)
    missing = [q for q in QUANTITIES if q not in final_units]
    if missing:
        raise SnapshotError(
            f"{first.path}: {conv.no_units}; give the {' and '.join(missing)} unit(s) with "
            "units={'length': ..., 'velocity': ..., 'mass': ...}"
        )
    cosmology = conv.cosmology
    G = gravitational_constant(final_units, h=cosmology and cosmology["h"])  # noqa: N806

    table = {t: _table_mass(header, scans[t][1], t, source, fmt) for t in types}
    per_type = {t: _type_arrays(metas_of[t], *scans[t], rows, convs[t], fmt) for t in types}
    dropped: dict[str, tuple[int, ...]] = {}
    if joint:
        arrays, dropped = _joint_arrays(per_type, table, source, fmt)
        factors = {t: convs[t].velocity_factor for t in types}
        if "vel" in arrays and len(set(factors.values())) > 1:
            rules = "; ".join(f"type {t}: {convs[t].velocity_rule}" for t in types)
            raise SnapshotError(f"{source}: the velocity factor differs between the particle "
                                f"types ({rules}); read these types separately")
    else:
        arrays = per_type[types[0]]

    n_per_type = {t: sum(scans[t][0]) for t in types}
    info = GadgetInfo(
        files=tuple(m.path for m in metas), part_type=types if joint else types[0],
        n_particles=sum(n_per_type.values()),
        n_per_file=tuple(sum(scans[t][0][i] for t in types) for i in range(len(metas))),
        header=header, cosmological=conv.cosmological, cosmological_rule=conv.rule,
        velocity_factor=conv.velocity_factor, format=first.format,
        velocity_rule=conv.velocity_rule, n_per_type=n_per_type, dropped=dropped,
    )
    logger.info("%s import %s (%s): %s from %d file(s); cosmological=%s (%s); velocities x %g",
                fmt.family, source, info.format,
                ", ".join(f"{n} particles of type {t}" for t, n in n_per_type.items()),
                len(metas), conv.cosmological, conv.rule, conv.velocity_factor)
    for name, lacking in dropped.items():
        logger.warning("%s import %s: '%s' is left out of the joint snapshot: %s missing; a "
                       "field is kept only when every type read has it", fmt.family, source,
                       name, ", ".join(fmt.label(name, t) for t in lacking))

    from ..store.snapshot import Snapshot

    snap = Snapshot.from_arrays(
        arrays["pos"], arrays.get("vel"), arrays.get("ids"), arrays.get("mass"),
        box_size=conv.box_size, particle_mass=None if joint else table[types[0]],
        scale_factor=conv.scale_factor, cosmology=cosmology, units=final_units, G=G,
        ptype=arrays.get("ptype"),
        fields={k: v for k, v in arrays.items() if k not in ARRAY_SCHEMA},
    )
    snap = Snapshot(snap.arrays, {**snap.attrs, "provenance": info.provenance()},
                    fields=snap.fields)
    snap.gadget_info = info
    return snap


_HDF5 = _Format(
    kind="Gadget HDF5", subfile=_SUBFILE, extensions=_EXTENSIONS, num_files=_num_files,
    read_meta=_read_file_meta, header="Header/", read_rows=_read_hdf5_rows,
    labels={name: f"'PartType{{t}}/{dsname}'" for name, dsname in GADGET_FIELDS.items()},
    no_masses="PartType{t} has no 'Masses' dataset",
)


def from_gadget_hdf5(path_or_pattern: str | os.PathLike,
                     part_type: int | Sequence[int] | str = 1, *, chunks: int | None = None,
                     units: Mapping[str, str] | None = None,
                     fields: Sequence[str] | None = None):
    """Open one or several particle types of a Gadget/AREPO HDF5 snapshot as a lazy Snapshot.

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
    part_type : int, list of int or "all"
        Gadget particle type 0..5 (default 1, dark matter); or a list or tuple of
        types (``[0, 1, 4]``), or ``"all"`` (every type with particles), read as
        one snapshot: the types' rows concatenated in type order, a ``ptype``
        array (uint8) and per-particle ``mass`` (see ``docs/gadget.md``,
        "Several particle types").
    chunks : int, optional
        Maximum particles per dask chunk (default: dask config
        ``cosmo_dask.chunk_size``). Chunks never span two files or two types.
    units : dict, optional
        ``{length, velocity, mass}`` strings overriding those derived from
        ``UnitLength_in_cm``, ``UnitMass_in_g``, ``UnitVelocity_in_cm_per_s``
        (attributes of ``Header`` or of the ``Parameters`` group; Gadget
        defaults kpc/h, km/s, 1e10 Msun/h when absent). ``G`` is set for (kpc/h or Mpc/h, km/s,
        1e10 Msun/h) and None otherwise.
    fields : list of str, optional
        The other datasets of ``PartType{n}`` read as extra per-particle fields
        (``snap.fields``, under their dataset names): None (default) every one that
        every file holds as a numeric (N,) or (N, k) array, ``()`` none, or a list
        of names (each must exist for some type read). With several types a field
        is NaN for the types without it (integer and bool fields become float64).

    Returns
    -------
    Snapshot
        ``pos`` (``Coordinates``, in length units, wrapped into [0, BoxSize)),
        ``vel`` (``Velocities`` times ``sqrt(a)`` for cosmological runs: peculiar
        km/s), ``ids`` (``ParticleIDs``), ``mass`` (``Masses``) or
        ``particle_mass`` (``Header/MassTable[part_type]``). ``box_size`` is
        ``Header/BoxSize`` (a number or three equal sides; 0 means isolated: None).
        For cosmological runs ``scale_factor`` is ``Header/Time`` and
        ``cosmology`` holds Omega_m (Omega0), Omega_b (OmegaBaryon or None),
        Omega_L (OmegaLambda), h (HubbleParam), sigma8 and n_s (None). The
        returned object also has a ``gadget_info`` attribute (:class:`GadgetInfo`),
        and ``provenance`` (files, format, types, header) is kept by transforms and
        written by ``to_zarr``. ``fields`` holds the extra datasets as stored (no
        unit or velocity conversion).

    Raises
    ------
    ParameterError
        ``part_type`` outside 0..5 (or a list naming one, empty or naming a type
        twice), bad ``chunks``, ``units`` or ``fields``.
    SnapshotError
        A name in ``fields`` that no type read has (listing those available);
        nothing matches the path or pattern; a file is not HDF5 or has no
        Header; missing files of a multi-file set; no ``PartType{n}`` group in
        any file; datasets or dtypes inconsistent between files; dataset
        lengths not matching ``NumPart_ThisFile``; ``NumPart_Total`` not the sum
        of ``NumPart_ThisFile``; no ``Masses`` dataset and no MassTable entry;
        ``Header`` and ``Parameters`` holding different units, ``HubbleParam``
        or ``ComovingIntegrationOn``; a non-cubic ``BoxSize``; a virtual dataset
        whose source file is missing. Several types: a requested type without
        particles (naming the types present); ``ParticleIDs`` dtypes without a
        common integer dtype.

    Warns
    -----
    UserWarning
        On a SWIFT file (``Header/Code`` 'SWIFT'): its box and particles are read,
        but not its units, cosmology or scale factor; use
        :func:`~cosmo_dask.io.from_swift`.
    """
    return _assemble(path_or_pattern, part_type, chunks, units, _HDF5, fields)
