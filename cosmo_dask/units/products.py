"""Unit strings of analysis products (catalogs, meshes, densities, forces, expansions).

Every product states the unit of each of its arrays in an attribute ``units``
derived here from the input snapshot's ``units`` (:mod:`cosmo_dask.units`).
:func:`product_units` composes one string per quantity from the snapshot's
length, velocity and mass units:

* ``length``, ``velocity``, ``mass``: the snapshot's strings as they are
  (``"Mpc/h"``, ``"km/s (peculiar)"``, ``"1e10 Msun/h"``);
* composed physical units (``density``, ``acceleration``, ...): astropy's
  generic form of the product, with ``h`` standing for the reduced Hubble
  constant at any power: ``"1e+10 h2 Msun / Mpc3"`` for (1e10 Msun/h) /
  (Mpc/h)^3, ``"km2 h Mpc-1 s-2"`` for (km/s)^2 / (Mpc/h), ``"km2 / s2"``
  (never ending in a parenthesis, which would read as a note).
  :func:`cosmo_dask.units.parse` reads every string this module writes
  (``h`` as astropy's ``littleh``);
* labels (``"N-body length"``, no physical unit): written out as they are,
  ``"N-body mass / N-body length^3"``; a snapshot without units gets the labels
  ``"input length"``, ``"input velocity"``, ``"input mass"`` (the values are
  in whatever units the input has).

Potentials and accelerations are in velocity^2 and velocity^2 / length when the
gravitational constant is the snapshot's (so ``G`` is in length velocity^2 /
mass). An analysis that fell back to ``G = 1`` because neither the call nor the
snapshot gave one (``g_one=True``) has potentials in mass / length and
accelerations in mass / length^2, marked ``"(G = 1)"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from . import QUANTITIES, parse, without_note

__all__ = ["DIMENSIONS", "FORCE_ARRAYS", "LABELS", "input_units",
           "product_units", "store_units"]

#: the labels of a snapshot that states no units (or lacks one of them)
LABELS = {"length": "input length", "velocity": "input velocity", "mass": "input mass"}

#: powers of (length, velocity, mass) of every quantity :func:`product_units` returns
DIMENSIONS: dict[str, tuple[int, int, int]] = {
    "length": (1, 0, 0),
    "velocity": (0, 1, 0),
    "mass": (0, 0, 1),
    "volume": (3, 0, 0),
    "volume_squared": (6, 0, 0),
    "number_density": (-3, 0, 0),
    "inverse_length": (-1, 0, 0),
    "density": (-3, 0, 1),
    "acceleration": (-1, 2, 0),
    "potential": (0, 2, 0),
    "specific_angular_momentum": (1, 1, 0),
    "gravitational_constant": (1, 2, -1),
}
#: the same with G = 1: G M / r and G M / r^2, G itself the number 1
_G_ONE = {"acceleration": (-2, 0, 1), "potential": (-1, 0, 1), "gravitational_constant": None}
G_ONE_NOTE = "(G = 1)"
#: the quantity of the ``acc`` and ``pot`` arrays of gravity and expansion stores
FORCE_ARRAYS = {"acc": "acceleration", "pot": "potential"}


def product_units(units: Mapping[str, str] | None = None, *, g_one: bool = False
                  ) -> dict[str, str]:
    """The unit string of every product quantity, from a snapshot's units.

    Parameters
    ----------
    units : mapping, optional
        The snapshot's ``units`` (``{"length", "velocity", "mass"}``); a missing
        quantity, or None, takes its label from :data:`LABELS`. A mapping that
        already holds every quantity of the result (this function's output) is
        returned as it is.
    g_one : bool
        The analysis used ``G = 1`` in place of a gravitational constant in
        these units (potentials in mass / length, accelerations in mass /
        length^2, marked ``"(G = 1)"``).

    Returns
    -------
    dict
        ``length``, ``velocity``, ``mass``, ``volume``, ``volume_squared`` (a
        bispectrum), ``number_density``
        (1 / length^3), ``inverse_length``,
        ``density`` (mass / length^3), ``acceleration`` (velocity^2 / length),
        ``potential`` (velocity^2), ``specific_angular_momentum`` (length
        velocity), ``gravitational_constant`` (length velocity^2 / mass) and
        ``dimensionless`` (``"1"``: counts, indices, ids, coefficients).
    """
    if units is not None and all(k in units for k in (*DIMENSIONS, "dimensionless")):
        return {str(k): str(v) for k, v in units.items()}
    base = {q: str((units or {}).get(q) or LABELS[q]) for q in QUANTITIES}
    out = {}
    for name, powers in DIMENSIONS.items():
        if g_one and name in _G_ONE:
            powers = _G_ONE[name]
            out[name] = f"{_compose(base, powers) if powers else '1'} {G_ONE_NOTE}"
        else:
            out[name] = _compose(base, powers)
    out["dimensionless"] = "1"
    return out


def input_units(snap_or_pos, G: float | None = None) -> dict[str, str]:  # noqa: N803
    """:func:`product_units` of an analysis input: a Snapshot's ``units`` (or the
    labels for raw arrays), with ``g_one`` when neither ``G`` nor the snapshot's
    ``G`` is given (the analyses then use G = 1).

    A snapshot is read through its ``units`` (a mapping, or None) and ``G``
    attributes, which raw arrays (NumPy, CuPy, dask) do not have: this module is
    below :mod:`cosmo_dask.store.snapshot` (which uses it) and does not import it back.
    """
    units = getattr(snap_or_pos, "units", None)
    snap_g = getattr(snap_or_pos, "G", None)
    return product_units(units if isinstance(units, Mapping) else None,
                         g_one=G is None and snap_g is None)


def _compose(base: Mapping[str, str], powers: tuple[int, int, int]) -> str:
    used = [(q, p) for q, p in zip(QUANTITIES, powers, strict=True) if p]
    if used == [(used[0][0], 1)]:
        return base[used[0][0]]
    parsed = {q: parse(base[q]) for q, _ in used}
    if all(parsed[q].physical for q, _ in used):
        import astropy.units as u
        from astropy.cosmology.units import littleh

        unit = u.dimensionless_unscaled
        for q, p in used:
            unit = unit * (parsed[q].scale * littleh ** -parsed[q].h_div) ** p
        text = unit.to_string()
        if text.endswith(")"):  # a final "(...)" would read as a note: "km2 h Mpc-1 s-2"
            text = unit.to_string(fraction=False)
        return text.replace("littleh", "h").replace("solMass", "Msun")

    def term(q: str, p: int) -> str:
        text = without_note(base[q])
        if parsed[q].physical and re.search(r"[\s/]", text):
            text = f"({text})"
        return text if abs(p) == 1 else f"{text}^{abs(p)}"

    num = " * ".join(term(q, p) for q, p in used if p > 0) or "1"
    den = [term(q, p) for q, p in used if p < 0]
    if not den:
        return num
    return f"{num} / {den[0] if len(den) == 1 else '(' + ' * '.join(den) + ')'}"


def store_units(group, units: Mapping[str, str]) -> None:
    """Write ``units[name]`` as the ``units`` attribute of each stored array ``name``
    (``"sub/name"`` inside a subgroup) of an open Zarr group."""
    for name, unit in units.items():
        group[name].attrs.update({"units": str(unit)})
