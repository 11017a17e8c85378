"""Snapshot validation: the array schema, metadata checks and per-chunk value checks.

Three levels, from cheap to expensive:

* :func:`check_metadata` -- shapes, dtypes, lengths and attributes (of the core
  arrays and of the extra per-particle fields, :func:`check_field_meta`); reads no
  particle data (run at open and at construction);
* :func:`checked_array` -- wraps a dask array so each chunk is checked when it
  is computed (finite, inside the periodic box, positive masses), naming the
  first bad particle; attached on read and on write, costs one pass over data
  that is in memory anyway;
* :func:`full_report` -- all value checks plus duplicate ids over the whole
  snapshot, as reductions (``Snapshot.validate(full=True)``).

All failures raise :class:`~cosmo_dask.core.errors.SnapshotError`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, host
from ..core.errors import SnapshotError
from ..core.progress import compute
from ..core.task_graph import TaskGraph

FORMAT = "cosmo_dask.snapshot"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)

#: name -> (trailing shape, allowed dtype kinds, description)
ARRAY_SCHEMA: dict[str, tuple[tuple[int, ...], str, str]] = {
    "pos": ((3,), "f", "(N, 3) float32 or float64 positions"),
    "vel": ((3,), "f", "(N, 3) float32 or float64 velocities"),
    "ids": ((), "iu", "(N,) integer particle ids (int64 or uint64)"),
    "mass": ((), "f", "(N,) float32 or float64 masses"),
    "ptype": ((), "iu", "(N,) integer particle types (Gadget/SWIFT PartType numbers 0..5)"),
}
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: subgroup of a store holding the extra per-particle fields (``fields/<name>``)
FIELDS_GROUP = "fields"
#: a field's name: a Zarr member name of letters, digits and ``_`` (``__`` starts
#: names Zarr reserves)
FIELD_NAME = re.compile(r"(?!__)[A-Za-z0-9_]+")
#: dtype kinds of a field: float, signed and unsigned integer, bool
FIELD_KINDS = "fiub"


def where(source: str | None, name: str | None = None) -> str:
    """Prefix of error messages: '<path>: array 'pos'' or 'snapshot: array 'pos''."""
    base = str(source) if source else "snapshot"
    return f"{base}: array '{name}'" if name else base


# --------------------------------------------------------------------------- metadata
def check_array_meta(name: str, shape: tuple[int, ...], dtype: np.dtype, source=None) -> None:
    """Check one array's shape and dtype against :data:`ARRAY_SCHEMA`."""
    trailing, kinds, desc = ARRAY_SCHEMA[name]
    dtype = np.dtype(dtype)
    if len(shape) != 1 + len(trailing) or tuple(shape[1:]) != trailing:
        raise SnapshotError(f"{where(source, name)} has shape {tuple(shape)}; expected {desc}")
    if dtype.kind not in kinds or (kinds == "f" and dtype not in FLOAT_DTYPES):
        raise SnapshotError(f"{where(source, name)} has dtype {dtype}; expected {desc}")
    if name == "ids" and dtype.itemsize < 4:
        raise SnapshotError(f"{where(source, name)} has dtype {dtype}; expected {desc}")


def check_field_meta(name: str, shape: tuple[int, ...], dtype: np.dtype,
                     source=None) -> None:
    """Check an extra per-particle field's name, shape ((N,) or (N, k)) and dtype (numeric)."""
    if not isinstance(name, str) or not FIELD_NAME.fullmatch(name) or name in ARRAY_SCHEMA:
        raise SnapshotError(
            f"{where(source)}: field name {name!r} is not valid; a field is named with "
            f"letters, digits and '_' (not starting '__') and not {', '.join(ARRAY_SCHEMA)}"
        )
    dtype = np.dtype(dtype)
    what = f"{where(source)}: field '{name}'"
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] < 1):
        raise SnapshotError(f"{what} has shape {tuple(shape)}; expected (N,) or (N, k)")
    if dtype.kind not in FIELD_KINDS:
        raise SnapshotError(f"{what} has dtype {dtype}; expected a float, integer or bool dtype")


def check_metadata(
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]], attrs: dict[str, Any], source=None,
    fields: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None,
) -> int:
    """Check array shapes/dtypes/lengths and the attributes; return N.

    ``shapes`` maps present array names to ``(shape, dtype)``, ``fields`` the extra
    per-particle fields' names to theirs (:func:`check_field_meta`).
    """
    if "pos" not in shapes:
        raise SnapshotError(f"{where(source)}: no 'pos' array; a snapshot needs (N, 3) positions")
    for name, (shape, dtype) in shapes.items():
        check_array_meta(name, shape, dtype, source)
    for name, (shape, dtype) in (fields or {}).items():
        check_field_meta(name, shape, dtype, source)
    n = shapes["pos"][0][0]
    for name, (shape, _) in shapes.items():
        if shape[0] != n:
            raise SnapshotError(
                f"{where(source, name)} has {shape[0]} rows but 'pos' has {n}; "
                "all particle arrays must have the same length"
            )
    for name, (shape, _) in (fields or {}).items():
        if shape[0] != n:
            raise SnapshotError(f"{where(source)}: field '{name}' has {shape[0]} rows but "
                                f"'pos' has {n}; every field has one row per particle")
    check_attrs(attrs, n, has_mass=("mass" in shapes), source=source)
    return n


def check_stored_length(n: int, attrs: dict[str, Any], source=None) -> None:
    """SnapshotError unless the arrays' length ``n`` (from their shapes) is the store's
    ``n_particles`` attribute (when it has one): an edited ``zarr.json`` shape is refused
    before any chunk is listed or read."""
    stored = attrs.get("n_particles")
    if stored is None:
        return
    if isinstance(stored, bool) or not isinstance(stored, (int, np.integer)) or stored < 0:
        raise SnapshotError(f"{where(source)}: attribute 'n_particles' is {stored!r}; "
                            "expected a non-negative integer")
    if int(stored) != n:
        raise SnapshotError(
            f"{where(source)}: the arrays' shapes say {n} particles but the store's "
            f"'n_particles' attribute says {int(stored)}; the metadata (zarr.json) was "
            "altered after the store was written: restore it or re-create the store")


def _positive_number(value, name, source, allow_none=True):
    if value is None:
        if allow_none:
            return
        raise SnapshotError(f"{where(source)}: attribute '{name}' is missing")
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        raise SnapshotError(
            f"{where(source)}: attribute '{name}' is {value!r}; expected a positive finite number"
            + (" or null" if allow_none else "")
        )


def check_attrs(attrs: dict[str, Any], n: int, *, has_mass: bool, source=None) -> None:
    """Check the snapshot attributes (box, masses, Lagrangian shape, ...)."""
    _positive_number(attrs.get("box_size"), "box_size", source)
    _positive_number(attrs.get("particle_mass"), "particle_mass", source)
    _positive_number(attrs.get("scale_factor"), "scale_factor", source)
    _positive_number(attrs.get("G"), "G", source)
    if has_mass and attrs.get("particle_mass") is not None:
        raise SnapshotError(
            f"{where(source)}: both a 'mass' array and a 'particle_mass' attribute are given; "
            "give one of them"
        )
    shape = attrs.get("lagrangian_shape")
    if shape is not None:
        try:
            dims = [int(s) for s in shape]
            ok = len(dims) == 3 and all(d > 0 and d == s for d, s in zip(dims, shape, strict=True))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise SnapshotError(
                f"{where(source)}: attribute 'lagrangian_shape' is {shape!r}; "
                "expected three positive integers [nx, ny, nz]"
            )
        if math.prod(dims) != n:
            raise SnapshotError(
                f"{where(source)}: lagrangian_shape {dims} holds {math.prod(dims)} particles "
                f"but the snapshot has N = {n}; nx*ny*nz must equal N"
            )
    for key in ("cosmology", "units"):
        value = attrs.get(key)
        if value is not None and not isinstance(value, dict):
            raise SnapshotError(
                f"{where(source)}: attribute '{key}' must be a mapping, got {value!r}"
            )
    los = attrs.get("los")
    if los is not None:
        try:
            v = [float(c) for c in los] if not isinstance(los, (str, bytes)) else []
        except (TypeError, ValueError):
            v = []
        ok = len(v) == 3 and all(math.isfinite(c) for c in v)
        if not ok or abs(math.sqrt(sum(c * c for c in v)) - 1.0) > 1e-6:
            raise SnapshotError(
                f"{where(source)}: attribute 'los' is {los!r}; expected the unit line-of-sight "
                "vector [x, y, z] of a redshift-space snapshot, or null"
            )


# --------------------------------------------------------------------------- per-chunk checks
def _first_bad(bad, offset: int) -> int:
    xp = array_module(bad)
    flat = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim > 1 else bad
    return offset + int(xp.argmax(flat))


def range_is_valid(lo: float, hi: float, name: str, box_size: float | None) -> bool:
    """True when a chunk whose values span [lo, hi] certainly passes :func:`check_block`.

    NaN propagates through min/max, so one min and one max decide the common case.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    if name == "mass":
        return lo > 0
    if name == "pos" and box_size is not None:
        return lo >= 0 and hi < box_size
    return True


def check_block(block, name: str, box_size: float | None, source: str | None, offset: int):
    """Raise SnapshotError if a chunk of array ``name`` holds invalid values."""
    xp = array_module(block)
    if block.dtype.kind != "f" or block.size == 0:
        return
    if range_is_valid(float(block.min()), float(block.max()), name, box_size):
        return
    finite = xp.isfinite(block)
    if not bool(finite.all()):
        i = _first_bad(~finite, offset)
        raise SnapshotError(
            f"{where(source, name)}: particle {i} has non-finite values; all {name} must be finite"
        )
    if name == "mass":
        bad = block <= 0
        if bool(bad.any()):
            i = _first_bad(bad, offset)
            raise SnapshotError(
                f"{where(source, name)}: particle {i} has mass {float(block[i - offset])}; "
                "masses must be > 0"
            )
    if name == "pos" and box_size is not None:
        bad = (block < 0) | (block >= box_size)
        if bool(bad.any()):
            i = _first_bad(bad, offset)
            value = block[i - offset].tolist()
            raise SnapshotError(
                f"{where(source, name)}: particle {i} at {value} is outside the periodic box "
                f"[0, {box_size}); open with wrap=True to wrap positions into the box"
            )


CHECKED_ARRAYS = ("pos", "vel", "mass")


def _check_chunk(block, name, box_size, source, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    check_block(block, name, box_size, source, offset)
    return block


def checked_array(arr: da.Array, name: str, box_size: float | None, source=None) -> da.Array:
    """Return ``arr`` with a per-chunk value check fused into its graph."""
    if name not in CHECKED_ARRAYS:
        return arr
    token = tokenize(arr, name, box_size, str(source))
    return arr.map_blocks(
        _check_chunk,
        name,
        box_size,
        str(source) if source else None,
        dtype=arr.dtype,
        meta=arr._meta,
        name=f"check-{name}-{token}",
    )


def wrap_into_box(x, box_size: float, dtype=None):
    """Coordinates ``x`` (NumPy or CuPy) wrapped into ``[0, box_size)`` and cast to
    ``dtype`` (default: ``x``'s).

    After the cast no value equals or exceeds ``box_size``, whether compared in
    float64 or in ``dtype``: values that round up to the box edge (they come from
    tiny negative coordinates) are set to 0, their periodic image. The one wrap of
    the package: generators, readers, the integrator's drift and ``wrap=True``.
    """
    xp = array_module(x)
    dtype = np.dtype(x.dtype if dtype is None else dtype)
    out = xp.mod(x, box_size).astype(dtype, copy=False)
    hi = np.nextafter(dtype.type(box_size), dtype.type(0))  # largest valid value
    out[out > hi] = 0
    return out


def wrap_one_box(x, box_size: float):
    """Coordinates ``x`` (NumPy or CuPy) within one box of ``[0, box_size)``, i.e. in
    ``[-box_size, 2 box_size)``, wrapped into it (:func:`wrap_into_box`); those farther
    out, and NaNs, are returned as they are, for validation to report (a reader's wrap: a
    coordinate written as ``BoxSize`` or as a tiny negative number is a periodic image,
    one several boxes out is a broken file)."""
    xp = array_module(x)
    near = (x >= -box_size) & (x < 2 * box_size)
    if bool(near.all()):
        return wrap_into_box(x, box_size)
    return xp.where(near, wrap_into_box(x, box_size), x).astype(x.dtype, copy=False)


def wrapped_positions(pos: da.Array, box_size: float) -> da.Array:
    """Positions wrapped into [0, box_size) chunk by chunk."""
    return pos.map_blocks(
        wrap_into_box,
        box_size,
        dtype=pos.dtype,
        meta=pos._meta,
        name=f"wrap-pos-{tokenize(pos, box_size)}",
    )


# --------------------------------------------------------------------------- full validation
@dataclass
class ValidationReport:
    """Outcome of :meth:`Snapshot.validate`; ``problems`` is empty when valid."""

    n_particles: int
    full: bool
    problems: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        level = "full" if self.full else "metadata"
        if self.ok:
            return f"valid ({level} check of {self.n_particles} particles)"
        return f"INVALID ({level} check): " + "; ".join(self.problems)


def _block_stats(block, box_size):
    xp = array_module(block)
    finite = xp.isfinite(block)
    out = np.zeros(3, dtype=np.float64)
    out[0] = float((~finite).sum())
    if box_size is not None and block.size:
        out[1] = float(((block < 0) | (block >= box_size)).sum())
    if block.size:
        out[2] = float(xp.min(xp.where(finite, block, xp.inf)))
    else:
        out[2] = np.inf
    return out[None, :]


def _stats(arr: da.Array, box_size) -> da.Array:
    """(n_nonfinite, n_outside_box, min_finite) of an array, as a tiny dask array."""
    flat = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr[:, None]
    parts = flat.map_blocks(
        _block_stats,
        box_size,
        dtype=np.float64,
        chunks=((1,) * flat.numblocks[0], (3,)),
        meta=np.empty((0, 0)),
        name=f"validate-{tokenize(arr, box_size)}",
    )
    return da.stack([parts[:, 0].sum(), parts[:, 1].sum(), parts[:, 2].min()])


# Duplicate-id check: hash-partition ids into buckets (one split task per chunk,
# one check task per bucket), so no task ever holds more than ~N/n_buckets ids.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _bucket_of(ids, bits: int):
    xp = array_module(ids)
    if not bits:
        return xp.zeros(ids.shape, xp.int64)
    h = ids.astype(xp.uint64, copy=False) * _GOLDEN  # wraps mod 2^64, on NumPy and CuPy
    return (h >> np.uint64(64 - bits)).astype(xp.int64)


def _split_ids(block, bits):
    """A chunk of ids split into its ``2**bits`` hash buckets (on the chunk's device)."""
    xp = array_module(block)
    b = _bucket_of(block, bits)
    order = xp.argsort(b)
    bounds = host(xp.searchsorted(b[order], xp.arange((1 << bits) + 1)))
    s = block[order]
    return [s[bounds[i] : bounds[i + 1]] for i in range(1 << bits)]


def _dups_in_bucket(*parts):
    """(number of repeated ids, one example or None) in one bucket's parts."""
    xp = array_module(parts[0]) if parts else np
    ids = xp.concatenate(parts) if parts else np.empty(0, np.int64)
    if ids.size < 2:
        return np.int64(0), None
    ids = xp.sort(ids)
    dup = ids[1:] == ids[:-1]
    n = int(dup.sum())
    return np.int64(n), (host(ids[1:][dup][:1])[0].item() if n else None)


def duplicate_ids(ids: da.Array) -> tuple[int, Any]:
    """Number of repeated id values (occurrences beyond the first) and one example."""
    nchunks = ids.numblocks[0]
    bits = max(0, min(6, int(math.ceil(math.log2(max(nchunks, 1))))))
    nb = 1 << bits
    token = tokenize(ids, bits)
    g = TaskGraph([ids])
    splits = [g.add_split(f"ids-split-{token}-{i}", _split_ids, g.chunk(ids, i), bits, n=nb)
              for i in range(nchunks)]
    checks = [g.add(f"ids-dupcheck-{token}-{j}", _dups_in_bucket, *[s[j] for s in splits]).key
              for j in range(nb)]
    results = g.compute(checks, label="checking ids for duplicates")
    total = sum(int(n) for n, _ in results)
    example = next((ex for n, ex in results if n), None)
    return total, example


def full_report(snap, *, check_ids: bool = True) -> ValidationReport:
    """Run every value check over the whole snapshot (reads all data)."""
    src = snap.source
    box = snap.box_size
    report = ValidationReport(n_particles=snap.n_particles, full=True)
    if snap.n_particles == 0:
        report.problems.append(f"{src or 'snapshot'}: holds no particles (N = 0); every "
                               "analysis needs at least one")
        return report
    names = [n for n in ("pos", "vel", "mass") if getattr(snap, n) is not None]
    stats = compute(*[_stats(getattr(snap, n), box if n == "pos" else None) for n in names],
                    label=f"validating {src or 'snapshot'}")
    for name, (nonfinite, outside, vmin) in zip(names, stats, strict=True):
        report.figures[f"{name}_nonfinite"] = int(nonfinite)
        if nonfinite:
            report.problems.append(f"{where(src, name)}: {int(nonfinite)} non-finite values")
        if name == "pos" and box is not None:
            report.figures["pos_outside_box"] = int(outside)
            if outside:
                report.problems.append(
                    f"{where(src, name)}: {int(outside)} coordinates outside the periodic box "
                    f"[0, {box}) (open with wrap=True to wrap them)"
                )
        if name == "mass":
            report.figures["mass_min"] = float(vmin)
            if vmin <= 0:
                report.problems.append(f"{where(src, name)}: masses must be > 0, minimum is {vmin}")
    if check_ids and snap.ids is not None:
        n_dup, example = duplicate_ids(snap.ids)
        report.figures["duplicate_ids"] = n_dup
        if n_dup:
            report.problems.append(
                f"{where(src, 'ids')}: {n_dup} duplicate ids (e.g. {example}); ids must be unique"
            )
    return report
