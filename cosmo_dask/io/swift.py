"""Lazy import of SWIFT HDF5 snapshots (single files, multi-file sets, virtual files).

SWIFT (https://swift.strw.leidenuniv.nl) writes Gadget-like HDF5 files: a
``Header`` group, ``PartType{n}`` groups with ``Coordinates``, ``Velocities``,
``ParticleIDs`` and ``Masses``, plus the groups ``Units`` (the units of every
particle array), ``Cosmology`` and ``Parameters``, and on every dataset its unit
exponents. :func:`from_swift` is a third format of the Gadget readers' shared
assembly (:func:`cosmo_dask.io.gadget._assemble`): the file lookup, the checks of
the set, the lazy one-task-per-piece reading and the box wrap are theirs; this
module supplies what SWIFT says differently (see ``docs/swift.md``):

* **Box.** ``Header/BoxSize`` is a 3-vector; cubic boxes give ``box_size``,
  other boxes are an error. ``InitialConditions:periodic`` = 0 in ``Parameters``
  means isolated (no box); without that parameter the box is periodic.
* **Cosmology.** ``Cosmology/Cosmological run`` decides; the scale factor is
  ``Header/Scale-factor`` (``Header/Time`` is SWIFT's time, not ``a``).
* **Velocities.** SWIFT writes the peculiar velocity ``a dx/dt``; the dataset's
  ``a-scale exponent`` (0) says so. Velocities are multiplied by
  ``a ** exponent``, the factor SWIFT's ``Conversion factor to physical CGS``
  includes, so ``vel`` is peculiar like the Gadget readers' (1 for SWIFT files).
* **Units.** From the ``Units`` group, h-free: ``Mpc``, ``km/s``, ``1e10 Msun``
  when the values match astropy's to 1e-4, else the cgs values.
* **Masses.** Always per-particle (``Masses``); ``MassTable`` is not used.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import h5py

from ..core.errors import SnapshotError
from ..units import factor
from .gadget import (
    _EXTENSIONS,
    _HDF5,
    _SUBFILE,
    GADGET_FIELDS,
    _assemble,
    _box_size,
    _Conventions,
    _FileMeta,
    _Format,
    _py,
    _read_file_meta,
    _read_hdf5_rows,
    _scalar,
    _unit_name,
)
from .gadget import _num_files as _hdf5_num_files

#: SWIFT particle types 0..6 (``enum part_type``)
SWIFT_TYPES = ("gas", "dark matter", "background dark matter", "sinks", "stars",
               "black holes", "neutrinos")

#: the ``Units`` group's attributes read (cgs values of the snapshot's base units)
UNITS_ATTRIBUTES = {"U_L": "Unit length in cgs (U_L)", "U_M": "Unit mass in cgs (U_M)",
                    "U_t": "Unit time in cgs (U_t)"}

#: unit names tried for the ``Units`` values (astropy's values, to a relative 1e-4)
_NAMES = {"length": ("Mpc", "kpc", "pc"), "velocity": ("km/s",), "mass": ("1e10 Msun", "Msun")}
_CGS = {"length": "cm", "velocity": "cm/s", "mass": "g"}

_A_EXPONENT = "a-scale exponent"
_H_EXPONENT = "h-scale exponent"
#: the a-scale exponent each field must have in a cosmological run (velocities: any,
#: applied); positions are comoving like BoxSize
_EXPECTED_A = {"pos": 1.0, "ids": 0.0, "mass": 0.0}


def _number(value: Any) -> float | None:
    """An attribute (number, length-1 array or numeric string) as float, else None."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return _scalar({"v": value}, "v")


def _read_groups(f: h5py.File, meta: _FileMeta) -> None:
    """Recognise a SWIFT file and keep its units, cosmology, periodicity and dataset
    exponents in ``meta.extra`` (called by :func:`_read_file_meta` with the file open)."""
    path, code = meta.path, str(meta.header.get("Code", "")).strip()
    if code != "SWIFT" and not ("Cosmology" in f and "Units" in f):
        raise SnapshotError(
            f"{path}: not a SWIFT snapshot (Header/Code is {code or 'absent'}, and it has "
            "no Cosmology and Units groups); use from_gadget_hdf5 for Gadget/AREPO HDF5 files"
        )

    def attrs(group: str) -> dict[str, Any]:
        return {k: _py(v) for k, v in f[group].attrs.items()} if group in f else {}

    units_cgs = None
    if "Units" in f:
        given, units_cgs = attrs("Units"), {}
        for key, name in UNITS_ATTRIBUTES.items():
            value = _number(given.get(name))
            if value is None or not (value > 0 and math.isfinite(value)):
                raise SnapshotError(f"{path}: Units/{name} is {given.get(name, 'absent')}; "
                                    "expected a positive number of cgs units")
            units_cgs[key] = value
    exponents = {}
    for name, spec in meta.specs.items():
        if name not in GADGET_FIELDS:  # extra fields are read as stored
            continue
        given = f[spec].attrs
        exponents[name] = {k: _number(_py(given[k])) for k in (_A_EXPONENT, _H_EXPONENT)
                           if k in given}
    meta.format = "swift"
    meta.extra.update(units_cgs=units_cgs, cosmology=attrs("Cosmology"),
                      periodic=_py(f["Parameters"].attrs.get("InitialConditions:periodic"))
                      if "Parameters" in f else None,
                      exponents=exponents)


def _read_meta(path: str, part_type: int) -> _FileMeta:
    """``_Format.read_meta`` of SWIFT: the HDF5 metadata plus :func:`_read_groups`."""
    return _read_file_meta(path, part_type, _SWIFT, _read_groups)


def _num_files(path: str) -> int:
    return _hdf5_num_files(path, _SWIFT)


@functools.cache
def _named_units(quantity: str) -> dict[float, str]:
    """{cgs value: name} of the unit names tried for ``quantity`` (astropy's values)."""
    return {factor(name, _CGS[quantity], quantity): name for name in _NAMES[quantity]}


def _units(units_cgs: Mapping[str, float], cosmological: bool) -> dict[str, str]:
    """Unit strings of the ``Units`` group's U_L, U_M, U_t (h-free)."""
    values = {"length": units_cgs["U_L"], "velocity": units_cgs["U_L"] / units_cgs["U_t"],
              "mass": units_cgs["U_M"]}
    units = {q: _unit_name(v, _named_units(q), _CGS[q], rel_tol=1e-4, digits=10)
             for q, v in values.items()}
    if cosmological:
        units["velocity"] += " (peculiar)"
    return units


def _velocity_exponent(metas: list[_FileMeta], cosmological: bool) -> tuple[float, str]:
    """The ``a-scale exponent`` of ``Velocities`` (equal in every file; 0 when absent)
    and where it came from; checks the ``h-scale exponent`` of every field (0) and, in
    cosmological runs, the a-scale exponents of positions (1), ids and masses (0)."""
    found: dict[str, float] = {}
    for m in metas:
        for name, attrs in m.extra["exponents"].items():
            where = f"{m.path}: {m.specs[name]}"
            if _H_EXPONENT in attrs and attrs[_H_EXPONENT] != 0:
                raise SnapshotError(f"{where} has h-scale exponent {attrs[_H_EXPONENT]}; SWIFT "
                                    "units are h-free (0) and other values are not supported")
            a_exp = attrs.get(_A_EXPONENT)
            if _A_EXPONENT in attrs and a_exp is None:
                raise SnapshotError(f"{where} has an a-scale exponent that is not a number")
            if name == "vel":
                if a_exp is not None:
                    found[m.path] = a_exp
            elif cosmological and a_exp is not None and a_exp != _EXPECTED_A[name]:
                raise SnapshotError(
                    f"{where} has a-scale exponent {a_exp:g}; expected {_EXPECTED_A[name]:g} "
                    "(comoving positions, like BoxSize; masses and ids without a factor)"
                )
    if len(set(found.values())) > 1:
        raise SnapshotError(f"{metas[0].path}: the a-scale exponent of Velocities differs "
                            f"between the files of the set: {found}")
    if not found:
        return 0.0, "no a-scale exponent on Velocities: 0 assumed (SWIFT writes a dx/dt)"
    exponent = next(iter(found.values()))
    return exponent, f"a-scale exponent of Velocities = {exponent:g}"


def _conventions(metas: list[_FileMeta], fmt: _Format) -> _Conventions:
    """``_Format.conventions`` of SWIFT (see the module docs)."""
    first = metas[0]
    header, cosmo = first.header, first.extra["cosmology"]
    dimension = _scalar(header, "Dimension")
    if dimension is not None and dimension != 3:
        raise SnapshotError(f"{first.path}: Header/Dimension is {dimension:g}; only "
                            "3-dimensional snapshots are read")
    a = _scalar(header, "Scale-factor")
    if a is None:
        a = _scalar(cosmo, "Scale-factor")
    omega_m = _scalar(cosmo, "Omega_m")
    if omega_m is None and None not in (_scalar(cosmo, "Omega_cdm"), _scalar(cosmo, "Omega_b")):
        omega_m = _scalar(cosmo, "Omega_cdm") + _scalar(cosmo, "Omega_b")
    flag = _number(cosmo.get("Cosmological run"))
    if flag is not None:
        cosmological, rule = bool(flag), f"Cosmology/Cosmological run = {flag:g}"
    else:
        cosmological = a is not None and 0 < a <= 1 and omega_m is not None and omega_m > 0
        rule = (f"0 < Header/Scale-factor <= 1 and Cosmology/Omega_m > 0 (Scale-factor = "
                f"{a}, Omega_m = {omega_m})")
    if cosmological and not (a is not None and a > 0):
        raise SnapshotError(f"{first.path}: a cosmological run ({rule}) but Header/"
                            f"Scale-factor is {a}; expected a positive scale factor")
    exponent, source = _velocity_exponent(metas, cosmological)
    velocity_factor = a**exponent if cosmological else 1.0
    velocity_rule = (f"a**{exponent:g} with a = Header/Scale-factor = {a} ({source})"
                     if cosmological else "as stored (not a cosmological run)")
    box_size = _box_size(first, fmt.header)
    periodic = _number(first.extra["periodic"])
    if periodic == 0:  # the run's InitialConditions:periodic: an isolated run
        box_size = None
    cosmology = None
    if cosmological:
        cosmology = {"Omega_m": omega_m, "Omega_b": _scalar(cosmo, "Omega_b"),
                     "Omega_L": _scalar(cosmo, "Omega_lambda"), "h": _scalar(cosmo, "h"),
                     "sigma8": None, "n_s": None}
    units_cgs = first.extra["units_cgs"]
    return _Conventions(
        box_size=box_size, cosmological=cosmological, rule=rule,
        scale_factor=a if cosmological else None, velocity_factor=velocity_factor,
        cosmology=cosmology, units={} if units_cgs is None else _units(units_cgs, cosmological),
        velocity_rule=velocity_rule,
        no_units="no 'Units' group, so the units of the particle arrays are unknown",
    )


_SWIFT = _Format(
    kind="SWIFT HDF5", subfile=_SUBFILE, extensions=_EXTENSIONS, num_files=_num_files,
    read_meta=_read_meta, header="Header/", read_rows=_read_hdf5_rows, labels=_HDF5.labels,
    no_masses="PartType{t} has no 'Masses' dataset (SWIFT writes per-particle masses)",
    family="SWIFT", types=SWIFT_TYPES, conventions=_conventions, mass_table=False,
    not_hdf5="from_swift reads SWIFT HDF5 snapshots",
    no_header="not a SWIFT snapshot (expected groups Header, Units, Cosmology and "
              "PartType0..PartType6)",
)


def from_swift(path_or_pattern: str | os.PathLike, part_type: int | Sequence[int] | str = 1,
               *, chunks: int | None = None, units: Mapping[str, str] | None = None,
               fields: Sequence[str] | None = None):
    """Open one or several particle types of a SWIFT HDF5 snapshot as a lazy Snapshot.

    Only metadata (``Header``, ``Units``, ``Cosmology``, the datasets' shapes,
    dtypes and unit exponents) are read here; particle data are read by dask
    tasks (``gadget-read-<token>``) that each open one file, read a row slice and
    close it, as for :func:`~cosmo_dask.io.from_gadget_hdf5`.

    Parameters
    ----------
    path_or_pattern : str or path-like
        A single file ``snap_0000.hdf5`` (also SWIFT's virtual file over a
        distributed snapshot: its datasets are HDF5 virtual datasets, and each
        task reads a row slice of them); any file of a multi-file set
        ``snap_0000.N.hdf5`` (the whole set, per ``Header/NumFilesPerSnapshot``);
        the base name ``snap_0000`` (the single or virtual file first, else the
        set); or a glob pattern.
    part_type : int, list of int or "all"
        SWIFT particle type 0..6 (default 1, dark matter; 4 stars, 6 neutrinos); a
        list of types or ``"all"`` give one snapshot of those types, with a ``ptype``
        array, as for :func:`~cosmo_dask.io.from_gadget_hdf5`.
    chunks : int, optional
        Maximum particles per dask chunk (default: dask config
        ``cosmo_dask.chunk_size``). Chunks never span two files.
    units : dict, optional
        ``{length, velocity, mass}`` strings replacing those of the ``Units``
        group; required (all three) when the file has no ``Units`` group.
    fields : list of str, optional
        The other datasets of ``PartType{n}`` read as extra per-particle fields, as
        for :func:`~cosmo_dask.io.from_gadget_hdf5`: None (default) all, ``()``
        none, or a list of names. They are read as stored (comoving values: their
        ``a-scale exponent`` is not applied).

    Returns
    -------
    Snapshot
        ``pos`` (``Coordinates``: comoving, wrapped into [0, BoxSize)), ``vel``
        (``Velocities`` times ``a ** (a-scale exponent)``: peculiar velocities),
        ``ids`` (``ParticleIDs``), ``mass`` (``Masses``); ``box_size`` (the cubic
        ``Header/BoxSize``; None when ``InitialConditions:periodic`` is 0);
        for cosmological runs ``scale_factor`` (``Header/Scale-factor``) and
        ``cosmology`` (Omega_m, Omega_b, Omega_L from Omega_lambda, h; sigma8 and
        n_s None); ``units`` h-free (e.g. Mpc, km/s (peculiar), 1e10 Msun) and
        ``G`` in them. ``gadget_info`` (:class:`~cosmo_dask.io.GadgetInfo`) has
        ``format="swift"`` and says how the velocity factor was found.

    Raises
    ------
    ParameterError
        ``part_type`` outside 0..6 (or a list naming one), bad ``chunks``, ``units`` or
        ``fields``.
    SnapshotError
        As :func:`~cosmo_dask.io.from_gadget_hdf5` (files, set and dataset
        checks), and: a file is not a SWIFT snapshot (no ``Header/Code`` 'SWIFT'
        and no ``Cosmology`` and ``Units`` groups); a non-cubic box; no ``Units``
        group and no ``units=``; no ``Masses``; an ``h-scale exponent`` other
        than 0, positions not comoving in a cosmological run, or a velocity
        ``a-scale exponent`` differing between files; a virtual dataset whose
        source file is missing; ``Header/Dimension`` other than 3; several types
        whose velocity factors (``a-scale exponent``) differ.
    """
    return _assemble(path_or_pattern, part_type, chunks, units, _SWIFT, fields)
