"""Lazy import of Gadget format-1 and format-2 binary snapshots (SnapFormat 1 and 2).

A file is a sequence of Fortran-style records, each framed by two equal 4-byte
record-length markers: the 256-byte header, then the blocks POS, VEL, ID and
MASS (MASS only where a type has particles and no ``MassTable`` entry), each
holding the rows of types 0..5 in that order, then blocks for gas only. Format
1 identifies blocks by their position; format 2 precedes every block with an
8-byte record holding its 4-character label and its size + 8. The byte order
is that of the first marker (256 for format 1, 8 for format 2).

At call time :func:`from_gadget_binary` reads only each file's header and the
markers of every record (8 bytes a record), checks them and computes the byte
offset of the requested type's rows in each block. The gas blocks U, RHO and HSML
(by label in format 2; in format 1, known only by position, U and RHO after MASS,
while their sizes fit) become the fields ``InternalEnergy``, ``Density`` and
``SmoothingLength`` of type 0.
Particle data are read by dask tasks that each read their rows from their file
with ``np.fromfile``, so the graph holds only paths, offsets and dtypes. Everything
after that (the checks of the set, the conventions, the assembly of the Snapshot)
is shared with :func:`cosmo_dask.io.from_gadget_hdf5` (see :mod:`cosmo_dask.io.gadget`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np

from ..core.errors import SnapshotError
from .gadget import _assemble, _FileMeta, _files_in_set, _Format, _py

logger = logging.getLogger(__name__)

#: the 256-byte header, its fields under the names of the HDF5 ``Header`` attributes
#: (Gadget-2 names: npart, mass, time, redshift, flag_sfr, flag_feedback, npartTotal,
#: flag_cooling, num_files, BoxSize, Omega0, OmegaLambda, HubbleParam, flag_stellarage,
#: flag_metals, npartTotalHighWord, flag_entropy_instead_u, then padding)
_HEADER = np.dtype([
    ("NumPart_ThisFile", "i4", (6,)), ("MassTable", "f8", (6,)), ("Time", "f8"),
    ("Redshift", "f8"), ("Flag_Sfr", "i4"), ("Flag_Feedback", "i4"),
    ("NumPart_Total", "u4", (6,)), ("Flag_Cooling", "i4"), ("NumFilesPerSnapshot", "i4"),
    ("BoxSize", "f8"), ("Omega0", "f8"), ("OmegaLambda", "f8"), ("HubbleParam", "f8"),
    ("Flag_StellarAge", "i4"), ("Flag_Metals", "i4"), ("NumPart_Total_HighWord", "u4", (6,)),
    ("Flag_Entropy_ICs", "i4"), ("padding", "V60"),
])

#: snapshot array name -> (block label, shape of one row, dtype kind: float or unsigned)
_BLOCKS: dict[str, tuple[str, tuple[int, ...], str]] = {
    "pos": ("POS", (3,), "f"),
    "vel": ("VEL", (3,), "f"),
    "ids": ("ID", (), "u"),
    "mass": ("MASS", (), "f"),
}
#: gas blocks (type 0 only, one float a particle) read as extra fields, in the order of
#: format-1 files (after MASS) -> (block label, row shape, dtype kind); the field names
#: are those of the HDF5 datasets
_GAS_BLOCKS: dict[str, tuple[str, tuple[int, ...], str]] = {
    "InternalEnergy": ("U", (), "f"),
    "Density": ("RHO", (), "f"),
    "SmoothingLength": ("HSML", (), "f"),
}

#: the gas blocks a format-1 file is known to hold by position (see _format1_names)
_FORMAT1_GAS = ("U", "RHO")

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class _Records:
    """Record markers of one open file, read one at a time and checked."""

    def __init__(self, f: IO[bytes], path: str, order: str) -> None:
        self.f, self.path, self.order = f, path, order
        self.size = os.fstat(f.fileno()).st_size

    def read(self, pos: int, n: int) -> bytes:
        self.f.seek(pos)
        return self.f.read(n)

    def marker(self, pos: int) -> int:
        return int(np.frombuffer(self.read(pos, 4), f"{self.order}u4")[0])

    def record(self, pos: int, block: str) -> tuple[int, int]:
        """(offset of the data, bytes) of the record starting at ``pos``."""
        if pos + 4 > self.size:
            raise SnapshotError(
                f"{self.path}: block {block}: the file ends at byte {self.size}, inside the "
                f"record marker at byte {pos}; the file is truncated"
            )
        n = self.marker(pos)
        if pos + 8 + n > self.size:
            raise SnapshotError(
                f"{self.path}: block {block}: its record of {n} bytes at byte {pos} runs past "
                f"the end of the file ({self.size} bytes); the file is truncated"
            )
        trailing = self.marker(pos + 4 + n)
        if trailing != n:
            raise SnapshotError(
                f"{self.path}: block {block}: leading record marker {n} and trailing marker "
                f"{trailing} disagree (record at byte {pos}); the file is corrupt"
            )
        return pos + 4, n

    def label(self, pos: int, after: str) -> tuple[str, int, int]:
        """Format 2: (label, announced size, end) of the label record at ``pos``."""
        start, n = self.record(pos, f"label after {after}")
        if n != 8:
            raise SnapshotError(
                f"{self.path}: block label after {after}: record of {n} bytes at byte {pos}; "
                "a format-2 label record holds 8 (4 characters and the block size + 8)"
            )
        raw = self.read(start, 8)
        name = raw[:4].decode("latin-1").rstrip()
        return name, int(np.frombuffer(raw[4:], f"{self.order}i4")[0]) - 8, start + 12


def _detect(first: bytes, path: str) -> tuple[int, str]:
    """(SnapFormat, byte order) from the first record marker of a file."""
    if len(first) == 4:
        for order in "<>":
            marker = int(np.frombuffer(first, f"{order}u4")[0])
            if marker in (256, 8):
                return (1 if marker == 256 else 2), order
        seen = (f"{int(np.frombuffer(first, '<u4')[0])} little-endian, "
                f"{int(np.frombuffer(first, '>u4')[0])} big-endian")
    else:
        seen = f"missing (the file has {len(first)} bytes)"
    hint = " (an HDF5 file: use from_gadget_hdf5)" if first == _HDF5_SIGNATURE[:4] else ""
    raise SnapshotError(
        f"{path}: not a Gadget binary snapshot: first record marker is {seen}; expected 256 "
        f"(format 1: the header) or 8 (format 2: a block label){hint}"
    )


def _header(raw: bytes, order: str) -> dict[str, Any]:
    values = np.frombuffer(raw, _HEADER.newbyteorder(order))[0]
    return {k: _py(values[k]) for k in _HEADER.names if k != "padding"}


def _rows_per_type(header: Mapping[str, Any], name: str) -> list[int]:
    """Rows of each type in the block of field ``name``: ``npart``, and for MASS only
    the types without a MassTable entry."""
    return [n if name != "mass" or m == 0 else 0
            for n, m in zip(header["NumPart_ThisFile"], header["MassTable"], strict=True)]


def _format1_names(header: Mapping[str, Any]) -> list[str]:
    """Labels of the leading blocks of a format-1 file, in file order (the gas blocks
    where there is gas: :func:`_read_file_meta` reads them only while their sizes fit)."""
    with_mass = any(n > 0 for n in _rows_per_type(header, "mass"))
    # only U and RHO: every Gadget writes them first; what follows differs between codes
    # and options (Gadget-2: HSML; Gadget-3 with cooling: NE, NH, then HSML), with blocks
    # of equal size that no check could tell apart (format 2 names HSML by label)
    gas = list(_FORMAT1_GAS) if header["NumPart_ThisFile"][0] > 0 else []
    return ["HEAD", "POS", "VEL", "ID"] + (["MASS"] if with_mass else []) + gas


def _read_layout(path: str) -> tuple[int, str, dict[str, Any], dict[str, tuple[int, int]]]:
    """Format, byte order, header and blocks (label -> data offset, bytes) of one file.

    Reads the header and the markers of every record; each record is checked.
    """
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be opened ({exc.strerror})") from None
    with f:
        snap_format, order = _detect(f.read(4), path)
        records = _Records(f, path, order)
        header: dict[str, Any] | None = None
        names = ["HEAD"]
        blocks: dict[str, tuple[int, int]] = {}
        pos, label = 0, "start of file"
        while pos < records.size:
            if snap_format == 2:
                label, announced, pos = records.label(pos, label)
            else:
                label = names[len(blocks)] if len(blocks) < len(names) else f"#{len(blocks)}"
            start, n = records.record(pos, label)
            if snap_format == 2 and announced != n:
                raise SnapshotError(
                    f"{path}: block {label}: its label record announces {announced} bytes but "
                    f"the record at byte {pos} holds {n}; the file is corrupt"
                )
            if label == "HEAD" and header is None:
                if n != _HEADER.itemsize:
                    raise SnapshotError(
                        f"{path}: block HEAD has {n} bytes; a Gadget header has 256"
                    )
                header = _header(records.read(start, n), order)
                names = _format1_names(header)
            blocks.setdefault(label, (start, n))
            pos = start + n + 4
    if header is None:
        raise SnapshotError(f"{path}: block HEAD is missing; not a Gadget format-2 snapshot")
    return snap_format, order, header, blocks


def _block(path: str, blocks: Mapping[str, tuple[int, int]], name: str,
           per_type: list[int], order: str) -> tuple[int, np.dtype]:
    """(data offset, on-disk dtype) of the block of field ``name`` in one file.

    ``per_type`` are the rows of each type the block must hold; its item size
    (4 or 8 bytes) follows from its length.
    """
    label, row, kind = _BLOCKS[name]
    values = sum(per_type) * math.prod(row)
    if label not in blocks:
        raise SnapshotError(
            f"{path}: block {label} is missing; the header's npart {per_type} needs "
            f"{sum(per_type)} rows in it"
        )
    offset, n = blocks[label]
    disk = _disk_dtype(n, values, order, kind)
    if disk is not None:
        return offset, disk
    raise SnapshotError(
        f"{path}: block {label} has {n} bytes but the header's npart {per_type} needs "
        f"{values} values of 4 or 8 bytes ({values * 4} or {values * 8} bytes)"
    )


def _disk_dtype(n_bytes: int, values: int, order: str, kind: str) -> np.dtype | None:
    """The on-disk dtype of a block of ``n_bytes`` holding ``values`` values of 4 or 8
    bytes, or None when its size fits neither."""
    for size in (4, 8):
        if n_bytes == values * size:
            return np.dtype(f"{order}{kind}{size}")
    return None


def _gas_fields(path: str, snap_format: int, order: str, n_gas: int,
                blocks: Mapping[str, tuple[int, int]], fields: dict, specs: dict) -> None:
    """Add the gas blocks U, RHO, HSML present with ``n_gas`` values of 4 or 8 bytes to
    ``fields`` and ``specs`` (type 0). A block of another size is skipped and logged; in
    format 1, where blocks are known only by position, so are the blocks after it."""
    for name, (label, row, kind) in _GAS_BLOCKS.items():
        if label not in blocks:
            continue
        offset, n = blocks[label]
        disk = _disk_dtype(n, n_gas, order, kind)
        if disk is None:
            rest = list(_FORMAT1_GAS[_FORMAT1_GAS.index(label):]) if snap_format == 1 \
                else [label]
            logger.warning("%s: block %s has %d bytes, not %d gas values of 4 or 8 bytes; "
                           "%s not read", path, label, n, n_gas,
                           f"block{'s' * (len(rest) > 1)} {', '.join(rest)}")
            if snap_format == 1:
                return
            continue
        fields[name] = ((n_gas,) + row, disk.newbyteorder("="))
        specs[name] = (offset, disk.str, row)


def _read_file_meta(path: str, part_type: int) -> _FileMeta:
    """Header and block offsets of one binary file (no particle data read)."""
    snap_format, order, header, blocks = _read_layout(path)
    npart = header["NumPart_ThisFile"]
    if min(npart) < 0:
        raise SnapshotError(f"{path}: block HEAD: npart is {npart}; counts cannot be negative")
    fields, specs = {}, {}
    for name, (_, row, _) in _BLOCKS.items():
        per_type = _rows_per_type(header, name)
        if sum(per_type) == 0:
            continue
        offset, disk = _block(path, blocks, name, per_type, order)
        if per_type[part_type] > 0:
            skip = sum(per_type[:part_type]) * math.prod(row) * disk.itemsize
            fields[name] = ((per_type[part_type],) + row, disk.newbyteorder("="))
            specs[name] = (offset + skip, disk.str, row)
    if part_type == 0 and npart[0] > 0:
        _gas_fields(path, snap_format, order, npart[0], blocks, fields, specs)
    return _FileMeta(path, header, True, fields, specs, format=f"binary-{snap_format}")


def _num_files(path: str) -> int:
    header = _read_layout(path)[2]
    return _files_in_set(path, header["NumFilesPerSnapshot"], "header NumFilesPerSnapshot")


def _read_rows(path: str, spec: tuple[int, str, tuple[int, ...]], start: int,
               stop: int) -> np.ndarray:
    """Rows [start, stop) of one field of one type in ``path``, in native byte order."""
    offset, disk, row = spec
    dtype = np.dtype(disk)
    count = (stop - start) * math.prod(row)
    first = offset + start * math.prod(row) * dtype.itemsize
    data = np.fromfile(path, dtype=dtype, count=count, offset=first)
    if data.size != count:
        raise SnapshotError(
            f"{path}: {count} values of {dtype} expected from byte {first}, the file ends "
            "first; it changed after from_gadget_binary read it"
        )
    return data.astype(dtype.newbyteorder("="), copy=False).reshape((stop - start,) + row)


_BINARY = _Format(
    kind="Gadget binary", subfile=re.compile(r"^(?P<base>.+)\.(?P<num>\d+)(?P<ext>)$"),
    extensions=("",), num_files=_num_files, read_meta=_read_file_meta, header="header ",
    read_rows=_read_rows,
    labels={name: f"block {b[0]}" for name, b in {**_BLOCKS, **_GAS_BLOCKS}.items()},
    no_masses="type {t} has no rows in a MASS block",
)


def from_gadget_binary(path_or_pattern: str | os.PathLike,
                       part_type: int | Sequence[int] | str = 1, *, chunks: int | None = None,
                       units: Mapping[str, str] | None = None,
                       fields: Sequence[str] | None = None):
    """Open one or several particle types of a Gadget format-1 or format-2 binary
    snapshot, lazily.

    The binary counterpart of :func:`cosmo_dask.io.from_gadget_hdf5`, with the
    same conventions and errors: only the headers and record markers are read
    here; the particle data are read by dask tasks (``gadget-read-<token>``)
    that each read one row range of one file, so the result can be computed
    on a distributed cluster whose workers see the same paths.

    Parameters
    ----------
    path_or_pattern : str or path-like
        A single file ``snap_000``; any file of a multi-file set ``snap_000.N``
        (the whole set, per the header's ``num_files``, is read); the base name
        ``snap_000`` of a set ``snap_000.0``, ``snap_000.1``, ...; or a glob
        pattern. Files are ordered by their number; paths are made absolute.
    part_type, chunks
        As for :func:`~cosmo_dask.io.from_gadget_hdf5`: the Gadget type 0..5
        (default 1, dark matter), a list of types or ``"all"`` (one snapshot with
        ``ptype`` and per-particle masses), and the most particles in a dask chunk.
    units : dict, optional
        ``{length, velocity, mass}`` strings replacing the Gadget defaults
        (kpc/h, km/s, 1e10 Msun/h: binary headers state no units). ``G`` is set
        for (kpc/h or Mpc/h, km/s, 1e10 Msun/h) and None otherwise.
    fields : list of str, optional
        The gas blocks read as extra fields of type 0: None (default) those present,
        ``()`` none, or a list of ``InternalEnergy`` (block U), ``Density`` (RHO),
        ``SmoothingLength`` (HSML). A block whose size is not one float of 4 or 8
        bytes per gas particle is skipped and logged (in format 1 with the blocks
        after it). Other blocks are not read.

    Returns
    -------
    Snapshot
        ``pos`` (block POS, wrapped into [0, BoxSize)), ``vel`` (block VEL,
        times ``sqrt(a)`` for cosmological runs: peculiar km/s), ``ids`` (block
        ID, uint32 or uint64), ``mass`` (block MASS) or ``particle_mass``
        (``MassTable[part_type]``); float32 or float64 as stored, in native
        byte order. ``box_size``, ``scale_factor`` and ``cosmology`` as for
        HDF5 (``Omega_b`` is None: the header has no OmegaBaryon). The object
        has a ``gadget_info`` attribute (:class:`~cosmo_dask.io.GadgetInfo`,
        ``format`` ``"binary-1"`` or ``"binary-2"``; ``header`` under the HDF5
        attribute names).

    Raises
    ------
    ParameterError
        ``part_type`` outside 0..5, bad ``chunks``, ``units`` or ``fields``.
    SnapshotError
        Nothing matches the path or pattern; a file is not a Gadget binary
        snapshot (first record marker neither 256 nor 8 in either byte
        order); missing files of a multi-file set; a truncated file, record
        markers that disagree, a missing block or one whose size does not
        match the header's particle counts (naming the file and the block);
        ``NumPart_Total`` (+ HighWord * 2^32) not the sum of the files' counts;
        ``MassTable`` differing between files; no particles of ``part_type`` (or
        of a type of the list, naming the types present).
    """
    return _assemble(path_or_pattern, part_type, chunks, units, _BINARY, fields)
