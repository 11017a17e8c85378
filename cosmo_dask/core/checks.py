"""Checks of scalar parameters shared by every package: a finite positive number, a
positive integer, a seed, a line of sight. Each raises
:class:`~cosmo_dask.core.errors.ParameterError` naming the parameter and the value given."""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import ParameterError

__all__ = ["PRECISIONS", "MAX_CHUNKS", "LOS_AXES", "check_bounded_int", "check_chunk_count",
           "check_chunk_memory", "check_cube_side", "check_disk_space", "check_finite",
           "check_integer", "check_los", "check_positive", "check_positive_int", "check_seed",
           "check_subset"]


#: the working precisions (floating dtypes' names) of every kernel
PRECISIONS = ("float32", "float64")

#: the most dask chunks along the particle axis that an explicit chunk size may give: every
#: all-to-all step (domain split, slab exchange, the way back to chunk order) has a task
#: per (chunk, domain or slab) pair, and the scheduler holds about a kilobyte per task, so
#: 2^16 chunks (8 times a 2048^3 store in its default 2^20-row chunks) keep a graph within
#: a few GB of scheduler memory; more are refused before any graph is built
MAX_CHUNKS = 2**16


#: line-of-sight axes by name (or index 0, 1, 2)
LOS_AXES = {"x": 0, "y": 1, "z": 2}


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """An integer >= ``minimum`` (integral floats such as ``2e5`` are accepted)."""
    ok = _is_number(value) and math.isfinite(float(value)) and float(value) == int(value)
    if not ok or int(value) < minimum:
        raise ParameterError(
            f"{name} must be an integer >= {minimum}, got {value!r}"
        )
    return int(value)


def check_integer(value: Any, name: str, minimum: int) -> int:
    """An integer (a Python or NumPy int, not a bool, not a float) >= ``minimum``; unlike
    :func:`check_positive_int`, ``20.0`` is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_seed(seed: Any) -> int:
    """A non-negative integer seed."""
    return check_positive_int(seed, "seed", minimum=0)


def check_finite(value: Any, name: str) -> float:
    """A finite number (of any sign)."""
    if not (_is_number(value) and math.isfinite(float(value))):
        raise ParameterError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """A finite number > 0 (or >= 0 with ``allow_zero``)."""
    ok = _is_number(value) and math.isfinite(float(value))
    ok = ok and (float(value) >= 0 if allow_zero else float(value) > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ParameterError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def check_cube_side(value: Any, name: str) -> float:
    """The side of a periodic cube: a finite number > 0 whose cube (the volume, and the
    unit of P(k) and of the particle masses derived from it) is a finite, non-zero float64,
    i.e. between about 1e-102 and 5.6e102; else a ParameterError."""
    side = check_positive(value, name)
    try:
        volume = side**3
    except OverflowError:
        volume = math.inf
    if not (math.isfinite(volume) and volume > 0):
        raise ParameterError(f"{name} must lie between 1e-100 and 1e100 (its cube, the "
                             f"volume, must be a finite float64), got {value!r}")
    return side


def check_los(los: Any, what: str):
    """The unit line-of-sight vector (float64 NumPy array (3,)) of ``los``: an axis (0, 1,
    2 or 'x', 'y', 'z') or a non-zero finite 3-vector (normalised); else a ParameterError
    starting with ``what`` (the function or option it is for)."""
    import numpy as np

    if isinstance(los, str):
        if los.lower() not in LOS_AXES:
            raise ParameterError(f"{what}: los must be 'x', 'y', 'z', an axis index or a "
                                 f"3-vector, got {los!r}")
        los = LOS_AXES[los.lower()]
    if isinstance(los, numbers.Integral) and not isinstance(los, bool):
        if not 0 <= los <= 2:
            raise ParameterError(f"{what}: los axis must be 0, 1 or 2, got {los}")
        v = np.zeros(3)
        v[int(los)] = 1.0
        return v
    try:
        v = np.asarray(los, dtype=np.float64)
    except (TypeError, ValueError):
        v = np.zeros(0)
    norm = float(np.linalg.norm(v)) if v.shape == (3,) else 0.0
    if v.shape != (3,) or not np.all(np.isfinite(v)) or norm == 0:
        raise ParameterError(f"{what}: los must be an axis or a non-zero 3-vector, "
                             f"got {los!r}")
    return v / norm


def check_subset(values: Any, allowed: tuple[str, ...], name: str) -> tuple[str, ...]:
    """``values`` (a name or a sequence of names) as a tuple, each among ``allowed``."""
    if isinstance(values, str):
        values = (values,)
    values = tuple(values)
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ParameterError(f"{name} must be a subset of {allowed}, got {bad}")
    return values


def check_bounded_int(value: Any, name: str, maximum: int, why: str, minimum: int = 1) -> int:
    """An integer in ``[minimum, maximum]`` (as :func:`check_positive_int`), else a
    ParameterError that gives ``why`` (the reason for the upper bound, derived from the
    data or the machine)."""
    value = check_positive_int(value, name, minimum=minimum)
    if value > maximum:
        raise ParameterError(f"{name} must be at most {maximum} ({why}), got {value}")
    return value


def check_chunk_count(n_rows: int, rows_per_chunk: int, name: str = "chunks") -> int:
    """The number of chunks ``rows_per_chunk`` gives ``n_rows`` rows, at most
    :data:`MAX_CHUNKS`, else a ParameterError naming ``name`` and the smallest size
    allowed."""
    n_chunks = -(-int(n_rows) // int(rows_per_chunk)) if n_rows else 1
    if n_chunks > MAX_CHUNKS:
        smallest = -(-int(n_rows) // MAX_CHUNKS)
        raise ParameterError(f"{name} = {rows_per_chunk} gives {n_chunks} chunks of "
                             f"{n_rows} particles, more than {MAX_CHUNKS} (a graph holds "
                             f"tasks per chunk): give at least {smallest} particles a chunk")
    return n_chunks


def check_chunk_memory(rows_per_chunk: int, row_bytes: int, n_rows: int) -> int:
    """``rows_per_chunk`` when a chunk of that many rows (out of ``n_rows``) of ``row_bytes``
    bytes fits in this machine's physical memory, else a ParameterError (a task holds a
    whole chunk, and a chunk can be read or made only in one piece)."""
    import psutil

    total = psutil.virtual_memory().total
    need = int(rows_per_chunk) * int(row_bytes)
    if need > total:
        raise ParameterError(f"{n_rows} particles: each chunk would hold {rows_per_chunk} "
                             f"of them ({_bytes(need)}), more than this machine's memory "
                             f"({_bytes(total)}); ask for fewer particles")
    return int(rows_per_chunk)


def check_disk_space(nbytes: int, target: Any, what: str) -> int:
    """``nbytes`` (what a write of ``what`` to ``target`` will store), else a
    ParameterError when it exceeds the free space of the file system that holds
    ``target`` (its nearest existing parent). Nothing is checked for remote targets
    (URLs) or when the free space cannot be read."""
    import os
    import shutil

    text = os.fspath(target) if isinstance(target, (str, os.PathLike)) else None
    if text is None or "://" in text:
        return int(nbytes)
    parent = os.path.abspath(os.path.expanduser(text))
    while parent and not os.path.isdir(parent):
        up = os.path.dirname(parent)
        if up == parent:
            return int(nbytes)
        parent = up
    try:
        free = shutil.disk_usage(parent).free
    except OSError:
        return int(nbytes)
    if nbytes > free:
        raise ParameterError(f"{what}: {text} would take {_bytes(nbytes)}, more than the "
                             f"{_bytes(free)} free on its file system")
    return int(nbytes)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"  # pragma: no cover
