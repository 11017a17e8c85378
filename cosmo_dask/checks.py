"""Checks of scalar parameters shared by every package: a finite positive number, a
positive integer, a seed. Each raises :class:`~cosmo_dask.errors.ParameterError` naming
the parameter and the value given."""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import ParameterError

__all__ = ["PRECISIONS", "check_finite", "check_integer", "check_positive", "check_positive_int",
           "check_seed", "check_subset"]


#: the working precisions (floating dtypes' names) of every kernel
PRECISIONS = ("float32", "float64")


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


def check_subset(values: Any, allowed: tuple[str, ...], name: str) -> tuple[str, ...]:
    """``values`` (a name or a sequence of names) as a tuple, each among ``allowed``."""
    if isinstance(values, str):
        values = (values,)
    values = tuple(values)
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ParameterError(f"{name} must be a subset of {allowed}, got {bad}")
    return values
