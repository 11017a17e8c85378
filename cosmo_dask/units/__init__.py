"""The one unit system: a snapshot's ``units`` (three strings) read by astropy.units.

A snapshot states its units as ``{"length": ..., "velocity": ..., "mass": ...}``
strings, and its ``G`` in those units. A physical unit string is

* an optional number: ``"1e10 Msun/h"``;
* an astropy unit expression: ``kpc``, ``Mpc``, ``km/s``, ``Msun``, ``cm``, ``g``;
* ``h``, the reduced Hubble constant, anywhere and to any power (``kpc/h``: a length
  of 1 kpc/h is 1/h kpc; ``"h / Mpc"``, ``"Mpc3 / h3"`` as products write them);
* an optional note in parentheses, kept through conversions and not part of the
  unit: ``"km/s (peculiar)"``.

Strings that do not read as such (``"N-body length"``, ``"box units"``) label a
dimensionless system: they convert only to themselves.

Conversions between units of equal ``h`` power need no ``h`` (``kpc/h`` to
``Mpc/h``); between different powers (``kpc/h`` to ``kpc``) they need the
cosmology's ``h``. ``G`` comes from astropy's CODATA value: 43009.17 in
(kpc/h) (km/s)^2 / (1e10 Msun/h), 43.00917 with Mpc/h.

The library is astropy.units (the community's standard for unit arithmetic; ``h`` is
its ``littleh``); this module only adds the snapshot's three-string form.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.errors import ParameterError

#: the three quantities a snapshot states units for
QUANTITIES = ("length", "velocity", "mass")
#: the physical type each must have
_PHYSICAL = {"length": "length", "velocity": "speed", "mass": "mass"}

_NOTE = re.compile(r"^(?P<unit>.*?)\s*(?P<note>\([^()]*\))?\s*$")
_H = re.compile(r"(?<![A-Za-z0-9_])h(?![A-Za-z_])")


@dataclass(frozen=True)
class Unit:
    """A parsed unit string: one ``text`` equals ``scale * h**(-h_div)`` (``scale`` an
    astropy unit with its number, ``h_div`` the count of ``/h``); ``scale`` is None for a
    label. ``note`` is the parenthesised remark, if any."""

    text: str
    scale: object | None  # astropy.units.UnitBase, or None for a label
    h_div: int
    note: str

    @property
    def physical(self) -> bool:
        return self.scale is not None


@functools.lru_cache(maxsize=256)
def parse(text: str, quantity: str | None = None) -> Unit:
    """Read a unit string (see the module doc). ``h`` may appear anywhere and to any
    power (``"kpc/h"``, ``"1e10 Msun/h"``, ``"1e+10 h2 Msun / Mpc3"``, ``"h / Mpc"``);
    ``quantity`` (length, velocity, mass) checks the physical type; a string astropy
    cannot read is a label."""
    import astropy.units as u
    from astropy.cosmology import units as cu

    m = _NOTE.match(str(text))
    body, note = m["unit"].strip(), (m["note"] or "")
    # h is the reduced Hubble constant (astropy's littleh), never hours
    body = _H.sub("littleh", body).replace("^", "**")
    try:
        with u.add_enabled_units(cu), warnings.catch_warnings():
            warnings.simplefilter("ignore", u.UnitsWarning)  # "km/s/h": several slashes
            unit = u.Unit(body, parse_strict="raise")
    except (ValueError, TypeError):
        return Unit(str(text), None, 0, note)
    k = sum(p for b, p in zip(unit.bases, unit.powers, strict=True) if b == cu.littleh)
    scale = u.Unit(unit * cu.littleh ** -k)
    if quantity is not None and scale.physical_type != _PHYSICAL[quantity]:
        raise ParameterError(f"{text!r} is not a unit of {quantity} "
                             f"({scale.physical_type})")
    return Unit(str(text), scale, int(-k), note)


def factor(old: str, new: str, quantity: str | None = None, *, h: float | None = None) -> float:
    """The number to multiply values in ``old`` units by to express them in ``new``.

    Raises ParameterError when the units are not convertible (other physical types,
    a label to anything but itself) or when the ``/h`` powers differ and ``h`` is not
    given.
    """
    a, b = parse(old, quantity), parse(new, quantity)
    if not (a.physical and b.physical):
        if without_note(old) == without_note(new):
            return 1.0
        raise ParameterError(f"cannot convert {old!r} to {new!r}: "
                             f"{old if not a.physical else new!r} is no physical unit")
    if not a.scale.is_equivalent(b.scale):
        raise ParameterError(f"cannot convert {old!r} to {new!r}")
    out = float(a.scale.to(b.scale))
    if a.h_div != b.h_div:
        if h is None or not (h > 0 and math.isfinite(h)):
            raise ParameterError(
                f"converting {old!r} to {new!r} needs the Hubble parameter h (the snapshot's "
                "cosmology has none; pass h=)")
        out *= h ** (b.h_div - a.h_div)
    return out


def without_note(text: str) -> str:
    """``text`` without its parenthesised note: ``"km/s"`` for ``"km/s (peculiar)"``."""
    return _NOTE.match(str(text))["unit"].strip()


def with_note(new: str, old: str) -> str:
    """``new`` carrying ``old``'s parenthesised note when ``new`` has none
    (``"km/s"`` from ``"km/s (peculiar)"`` stays ``"km/s (peculiar)"``)."""
    note = parse(old).note
    return f"{new} {note}" if note and not parse(new).note else new


def gravitational_constant(units: Mapping[str, str] | None, *, h: float | None = None
                           ) -> float | None:
    """G in ``units`` (length * velocity^2 / mass), from astropy's CODATA value; None when
    a unit is a label, or when the ``/h`` powers of length and mass differ and ``h`` is
    not given."""
    import astropy.constants as const

    if not units or any(q not in units for q in QUANTITIES):
        return None
    try:
        length, vel, mass = (parse(units[q], q) for q in QUANTITIES)
    except ParameterError:
        return None
    if not (length.physical and vel.physical and mass.physical):
        return None
    value = float(const.G.to(length.scale * vel.scale**2 / mass.scale).value)
    if length.h_div != mass.h_div:
        if h is None:
            return None
        value *= h ** (length.h_div - mass.h_div)
    return value


def check_units(units: Mapping[str, str], what: str = "units") -> dict[str, str]:
    """``units`` as a plain dict after checking its keys and that physical strings have
    the right physical type."""
    if not isinstance(units, Mapping):
        raise ParameterError(f"{what} must be a mapping {{length, velocity, mass}}, "
                             f"got {units!r}")
    unknown = set(units) - set(QUANTITIES)
    if unknown:
        raise ParameterError(f"{what} has unknown key(s) {sorted(unknown)}; valid keys are "
                             "length, velocity, mass")
    for q, text in units.items():
        parse(str(text), q)
    return {str(k): str(v) for k, v in units.items()}
