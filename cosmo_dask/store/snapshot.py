"""The Snapshot: particle arrays as chunked dask arrays, stored as a Zarr v3 group.

Layout (see ``docs/format.md``)::

    snapshot.zarr/
      zarr.json   attrs: format="cosmo_dask.snapshot", format_version=1, box_size,
                  scale_factor, redshift, cosmology, units, particle_mass,
                  lagrangian_shape, G, n_particles, provenance (imports only),
                  los (redshift-space snapshots only)
      pos   (N, 3) float32|float64     chunks (C, 3)
      vel   (N, 3) float32|float64     optional
      ids   (N,)   int64|uint64        optional
      mass  (N,)   float32|float64     optional
      ptype (N,)   integer             optional (particle types of a multi-species snapshot)
      fields/<name> (N,) | (N, k) numeric  optional extra per-particle fields (InternalEnergy, ...)

Opening reads only ``zarr.json`` files; particle data are read by the dask
tasks that need them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

from ..core.backend import (
    as_dask_rows,
    check_device,
    default_chunk_size,
    device_of,
    large_store_rows,
    to_device,
)
from ..core.errors import ParameterError, SnapshotError
from ..core.version import __version__
from ..plot.html import array_row, html_table, signif, with_unit
from ..units.products import product_units
from .atomic import atomic_directory, is_remote, local_path, recover
from .chunk_manifest import check_chunks, checksum_problems, verify_default
from .validation import (
    ARRAY_SCHEMA,
    FIELDS_GROUP,
    FORMAT,
    FORMAT_VERSION,
    SUPPORTED_VERSIONS,
    ValidationReport,
    check_array_meta,
    check_field_meta,
    check_metadata,
    check_stored_length,
    checked_array,
    full_report,
    wrap_into_box,
    wrapped_positions,
)
from .zarr_read import read_array
from .zarr_write import plain_attrs

ARRAY_NAMES = tuple(ARRAY_SCHEMA)
ATTR_NAMES = (
    "box_size",
    "scale_factor",
    "redshift",
    "cosmology",
    "units",
    "particle_mass",
    "lagrangian_shape",
    "G",
    "provenance",  # where an import read the snapshot from (written only when known)
    "los",  # redshift space: the unit line of sight the positions were shifted along
)


def _number(value: Any) -> Any:
    """float(value) for real numbers; anything else unchanged, for validation to report."""
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    return float(value) if real else value


def _row_chunks(chunks: int | None) -> int:
    if chunks is None:
        return default_chunk_size()
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ParameterError(f"chunks must be a positive number of particles, got {chunks!r}")
    return int(chunks)


class Snapshot:
    """Particles of one simulation output as chunked dask arrays plus metadata.

    Create with :func:`open_snapshot`, :meth:`from_arrays`, the generators in
    :mod:`cosmo_dask.models` or :func:`cosmo_dask.io.from_gadget_hdf5`.

    Attributes
    ----------
    pos, vel : dask.array.Array
        (N, 3) positions (``units["length"]``) and velocities; ``vel`` may be None.
    ids : dask.array.Array or None
        (N,) integer ids; on a Lagrangian grid ``id = (i*ny + j)*nz + k``.
    mass : dask.array.Array or None
        (N,) masses; None when all particles share ``particle_mass``.
    fields : dict of str to dask.array.Array
        Extra per-particle arrays (``InternalEnergy``, ``Density``, ...), chunked like
        ``pos``; kept by every transform and by the store, their values unchecked and
        their units unknown (:meth:`to_units` leaves them as they are).
    """

    def __init__(
        self,
        arrays: Mapping[str, da.Array],
        attrs: Mapping[str, Any],
        *,
        source: str | None = None,
        unchecked: Mapping[str, da.Array] | None = None,
        fields: Mapping[str, da.Array] | None = None,
    ):
        self._arrays = {k: v for k, v in arrays.items() if v is not None}
        self._fields = dict(fields or {})
        self._attrs = {k: attrs.get(k) for k in ATTR_NAMES}
        self._source = source
        # arrays read without per-chunk value checks (stores only): full
        # validation counts every problem instead of stopping at the first
        self._unchecked = dict(unchecked) if unchecked is not None else None
        shapes = {k: (v.shape, v.dtype) for k, v in self._arrays.items()}
        field_shapes = {k: (v.shape, v.dtype) for k, v in self._fields.items()}
        self._n = check_metadata(shapes, self._attrs, source, field_shapes)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_arrays(
        cls,
        pos,
        vel=None,
        ids=None,
        mass=None,
        *,
        box_size=None,
        particle_mass=None,
        lagrangian_shape=None,
        scale_factor=None,
        cosmology=None,
        units=None,
        G=None,
        chunks=None,
        ptype=None,
        fields: Mapping[str, Any] | None = None,
    ) -> Snapshot:
        """Build a snapshot from in-memory (NumPy/CuPy) or dask arrays.

        Shapes, dtypes and attributes are checked here; values (finite, inside
        the box, positive masses) by :meth:`validate` with ``full=True`` and when
        written by :meth:`to_zarr`.

        Parameters
        ----------
        pos : array_like, (N, 3)
            Positions, in ``units["length"]``; periodic snapshots need [0, box_size).
        vel, ids, mass : array_like, optional
            (N, 3) velocities, (N,) integer ids, (N,) masses.
        box_size : float, optional
            Side of the periodic box; None (default) for an isolated system.
        particle_mass : float, optional
            Mass of every particle, when no ``mass`` array is given.
        lagrangian_shape : (int, int, int), optional
            Lagrangian grid the ids index (product must equal N).
        scale_factor : float, optional
            Cosmological scale factor a; ``redshift`` is 1/a - 1.
        cosmology, units : dict, optional
            ``{Omega_m, Omega_b, Omega_L, h, sigma8, n_s}`` and ``{length, velocity, mass}``.
        G : float, optional
            Gravitational constant in the snapshot's units.
        chunks : int, optional
            Particles per chunk (default: dask config ``cosmo_dask.chunk_size``);
            dask inputs keep their chunking unless this is given.
        ptype : array_like, optional
            (N,) integer particle types (Gadget/SWIFT ``PartType`` numbers) of a
            snapshot holding several species; analyses use every particle
            (friends-of-friends links all types together).
        fields : mapping of str to array_like, optional
            Extra per-particle arrays by name (``{"InternalEnergy": u}``): a name of
            letters, digits and ``_`` other than the arrays above, shape (N,) or (N, k),
            any float, integer or bool dtype; chunked like ``pos``. Their values are
            not checked and their units are not known.
        """
        rows = None if chunks is None else _row_chunks(chunks)
        if fields is not None and not isinstance(fields, Mapping):
            raise SnapshotError(f"snapshot: 'fields' must be a mapping of names to arrays, "
                                f"got {type(fields).__name__}")
        core = (("pos", pos), ("vel", vel), ("ids", ids), ("mass", mass), ("ptype", ptype))
        arrays, extra = {}, {}
        for kind, items in (("array", core), ("field", (fields or {}).items())):
            for name, x in items:
                if x is None:
                    continue
                if not hasattr(x, "shape"):
                    x = np.asarray(x)
                check = check_array_meta if kind == "array" else check_field_meta
                check(name, tuple(x.shape), x.dtype)
                (arrays if kind == "array" else extra)[name] = x
        if "pos" not in arrays:
            raise SnapshotError("snapshot: 'pos' is required: (N, 3) positions")
        n = arrays["pos"].shape[0]
        for name, x in [*arrays.items(), *extra.items()]:
            if x.shape[0] != n:
                what = f"array '{name}'" if name in arrays else f"field '{name}'"
                raise SnapshotError(
                    f"snapshot: {what} has {x.shape[0]} rows but 'pos' has {n}; "
                    "all particle arrays must have the same length"
                )
        if rows is None and not isinstance(arrays["pos"], da.Array):
            rows = default_chunk_size()
        pos_d = as_dask_rows(arrays["pos"], rows, "pos")
        rows = rows or pos_d.chunks[0][0]

        def on_pos_rows(name: str, x) -> da.Array:
            """``x`` as a dask array sharing pos's chunking along axis 0."""
            x = pos_d if name == "pos" else as_dask_rows(x, rows, name)
            same = x.chunks[0] == pos_d.chunks[0]
            return x if same else x.rechunk((pos_d.chunks[0],) + x.chunks[1:])

        darrays = {k: on_pos_rows(k, v) for k, v in arrays.items()}
        dfields = {k: on_pos_rows(k, v) for k, v in extra.items()}
        a = _number(scale_factor)
        mappings = {"cosmology": cosmology, "units": units}
        for key, value in mappings.items():
            if value is not None and not isinstance(value, Mapping):
                raise SnapshotError(f"snapshot: '{key}' must be a mapping, got {value!r}")
        attrs = {
            "box_size": _number(box_size),
            "scale_factor": a,
            "redshift": 1.0 / a - 1.0 if isinstance(a, float) and a > 0 else None,
            "cosmology": None if cosmology is None else plain_attrs(dict(cosmology)),
            "units": None if units is None else {str(k): str(v) for k, v in units.items()},
            "particle_mass": _number(particle_mass),
            "lagrangian_shape": None if lagrangian_shape is None else plain_attrs(lagrangian_shape),
            "G": _number(G),
        }
        return cls(darrays, attrs, fields=dfields)  # checks the attributes

    # ---------------------------------------------------------------- arrays
    @property
    def pos(self) -> da.Array:
        """(N, 3) positions, dask array (NumPy or CuPy chunks)."""
        return self._arrays.get("pos")

    @property
    def vel(self) -> da.Array | None:
        """(N, 3) velocities or None."""
        return self._arrays.get("vel")

    @property
    def ids(self) -> da.Array | None:
        """(N,) integer ids or None."""
        return self._arrays.get("ids")

    @property
    def mass(self) -> da.Array | None:
        """(N,) masses or None (then every particle has ``particle_mass``)."""
        return self._arrays.get("mass")

    @property
    def ptype(self) -> da.Array | None:
        """(N,) particle types of a multi-species snapshot, or None (one species)."""
        return self._arrays.get("ptype")

    def species(self) -> dict[int, int] | None:
        """Particles per type (``{1: 16777216, 4: 20315}``; computed from ``ptype``), or
        None for a single-species snapshot."""
        if self.ptype is None:
            return None
        from ..core.progress import compute

        (counts,) = compute(da.bincount(self.ptype.astype(np.int64), minlength=6),
                            label=None, show=False)
        return {t: int(c) for t, c in enumerate(np.asarray(counts)) if c}

    @property
    def arrays(self) -> dict[str, da.Array]:
        """The present particle arrays by name (pos, vel, ids, mass, ptype)."""
        return {k: self._arrays[k] for k in ARRAY_NAMES if k in self._arrays}

    @property
    def fields(self) -> dict[str, da.Array]:
        """The extra per-particle fields by name (``InternalEnergy``, ...; empty when none):
        (N,) or (N, k) dask arrays chunked like ``pos``, values unchecked, units unknown."""
        return dict(self._fields)

    def field(self, name: str) -> da.Array:
        """The extra per-particle field ``name`` (a SnapshotError listing them when absent)."""
        if name not in self._fields:
            have = ", ".join(self._fields) or "none"
            raise SnapshotError(f"{self._source or 'snapshot'}: no field {name!r}; its "
                                f"fields: {have}")
        return self._fields[name]

    def particle_masses(self) -> da.Array:
        """(N,) masses as a dask array: the ``mass`` array or ``particle_mass`` broadcast.

        Raises SnapshotError when the snapshot carries neither.
        """
        if self.mass is not None:
            return self.mass
        if self.particle_mass is None:
            raise SnapshotError(
                f"{self._source or 'snapshot'}: has no 'mass' array and no "
                "'particle_mass' attribute; masses are unknown"
            )
        pos = self._arrays["pos"]
        const = da.full(pos.shape[:1], self.particle_mass, dtype=pos.dtype, chunks=(pos.chunks[0],))
        return to_device(const, self.device)

    # ---------------------------------------------------------------- metadata
    @property
    def attrs(self) -> dict[str, Any]:
        """A copy of the snapshot attributes."""
        return json.loads(json.dumps(self._attrs))

    @property
    def source(self) -> str | None:
        """Path the snapshot was opened from (None for in-memory snapshots)."""
        return self._source

    @property
    def n_particles(self) -> int:
        return self._n

    @property
    def box_size(self) -> float | None:
        """Periodic box side; None for an isolated system."""
        return self._attrs["box_size"]

    @property
    def periodic(self) -> bool:
        return self.box_size is not None

    @property
    def scale_factor(self) -> float | None:
        return self._attrs["scale_factor"]

    @property
    def redshift(self) -> float | None:
        z = self._attrs.get("redshift")
        if z is None and self.scale_factor is not None:
            z = 1.0 / self.scale_factor - 1.0
        return z

    @property
    def cosmology(self) -> dict | None:
        c = self._attrs["cosmology"]
        return None if c is None else dict(c)

    @property
    def units(self) -> dict | None:
        u = self._attrs["units"]
        return None if u is None else dict(u)

    @property
    def particle_mass(self) -> float | None:
        return self._attrs["particle_mass"]

    @property
    def lagrangian_shape(self) -> tuple[int, int, int] | None:
        s = self._attrs["lagrangian_shape"]
        return None if s is None else tuple(int(v) for v in s)

    @property
    def G(self) -> float | None:  # noqa: N802 (physics symbol)
        return self._attrs["G"]

    @property
    def provenance(self) -> dict | None:
        """What the snapshot was imported from (``from_gadget_hdf5``, ``from_gadget_binary``,
        ``from_swift``): ``{files, format, part_types, n_per_type, header}``; kept by every
        transform and stored by :meth:`to_zarr`. None for other snapshots."""
        p = self._attrs["provenance"]
        return None if p is None else json.loads(json.dumps(p))

    @property
    def los(self) -> tuple[float, float, float] | None:
        """The unit line of sight along which :meth:`to_redshift_space` shifted the
        positions (a redshift-space snapshot), or None (real space)."""
        v = self._attrs["los"]
        return None if v is None else tuple(float(c) for c in v)

    @property
    def chunks(self) -> tuple[int, ...]:
        """Particles per chunk (the chunking of axis 0 shared by all arrays)."""
        return self._arrays["pos"].chunks[0]

    @property
    def device(self) -> str:
        """'gpu' when the arrays have CuPy chunks, else 'cpu'."""
        return device_of(self._arrays["pos"])

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in [*self._arrays.values(), *self._fields.values()]))

    def _unit(self, quantity: str) -> str | None:
        return (self.units or {}).get(quantity)

    def __repr__(self) -> str:
        """One line, numbers to 4 significant digits with the snapshot's units."""
        arrays = ", ".join(f"{k}{tuple(v.shape)} {v.dtype}" for k, v in self._arrays.items())
        if self._fields:
            arrays += f"; fields {', '.join(self._fields)}"
        parts = ["isolated" if self.box_size is None
                 else f"box {with_unit(self.box_size, self._unit('length'))}"]
        if self.redshift is not None:
            parts.append(f"z={signif(self.redshift)}")
        if self.particle_mass is not None:
            parts.append(f"particle mass {with_unit(self.particle_mass, self._unit('mass'))}")
        if self.los is not None:
            parts.append(f"redshift space along ({', '.join(signif(c) for c in self.los)})")
        n_chunks = len(self.chunks)
        src = f" from {self._source}" if self._source else ""
        return (
            f"<Snapshot N={self._n} {', '.join(parts)} [{arrays}] {n_chunks} "
            f"chunk{'s' * (n_chunks != 1)} on {self.device}{src}>"
        )

    def _repr_html_(self) -> str:
        """Jupyter's rich display: metadata and arrays as HTML tables."""
        digits = 6
        length, mass = self._unit("length"), self._unit("mass")
        rows = [("particles", f"{self._n:,}"),
                ("box", "isolated" if self.box_size is None
                 else with_unit(self.box_size, length, digits))]
        if self.redshift is not None or self.scale_factor is not None:
            rows.append(("redshift, scale factor",
                         f"z = {signif(self.redshift, digits)}, "
                         f"a = {signif(self.scale_factor, digits)}"))
        if self.particle_mass is not None:
            rows.append(("particle mass", with_unit(self.particle_mass, mass, digits)))
        elif self.mass is not None:
            rows.append(("particle mass", f"per particle ('mass' array, {mass or 'no unit'})"))
        if self.G is not None:
            rows.append(("G", signif(self.G, digits)))
        if self.lagrangian_shape is not None:
            rows.append(("Lagrangian grid", " × ".join(map(str, self.lagrangian_shape))))
        if self.units:
            rows.append(("units", ", ".join(f"{k}: {v}" for k, v in self.units.items())))
        rows.append(("chunks", f"{len(self.chunks)} along particles, up to "
                               f"{max(self.chunks) if self.chunks else 0:,} particles each, "
                               f"on {self.device}"))
        rows.append(("size", f"{self.nbytes / 2**20:.3g} MiB"))
        if self._source:
            rows.append(("source", self._source))
        units = {"pos": length, "vel": self._unit("velocity"), "mass": mass}
        arrays = [array_row(k, v, units.get(k)) for k, v in self.arrays.items()]
        arrays += [array_row(f"fields/{k}", v, "unknown") for k, v in self._fields.items()]
        out = ["<div class='cosmo-dask-snapshot'>",
               "<b>cosmo_dask.Snapshot</b>", html_table(rows),
               "<b>arrays</b>",
               html_table(arrays, ("name", "shape", "dtype", "chunking", "backend",
                                    "size", "unit"))]
        if self.cosmology:
            out += ["<b>cosmology</b>",
                    html_table([(k, signif(v, digits)) for k, v in self.cosmology.items()])]
        info = getattr(self, "gadget_info", None)
        if info is not None:
            several = isinstance(info.part_type, tuple)
            out += ["<b>Gadget import</b>", html_table([
                ("files", f"{len(info.files)} {info.format} ({os.path.basename(info.files[0])}"
                          f"{' ...' if len(info.files) > 1 else ''})"),
                ("particle types" if several else "particle type",
                 ", ".join(f"{t} ({n:,} particles)" for t, n in info.n_per_type.items())),
                ("cosmological", f"{info.cosmological} ({info.cosmological_rule})"),
                ("velocity factor", signif(info.velocity_factor, digits))])]
        out.append("</div>")
        return "".join(out)

    # ---------------------------------------------------------------- transforms
    def _map(self, fn) -> Snapshot:
        """The same snapshot with ``fn(array)`` applied to every array and field (lazy)."""
        unchecked = None
        if self._unchecked is not None:
            unchecked = {k: fn(v) for k, v in self._unchecked.items()}
        return Snapshot(
            {k: fn(v) for k, v in self._arrays.items()},
            self._attrs,
            source=self._source,
            unchecked=unchecked,
            fields={k: fn(v) for k, v in self._fields.items()},
        )

    def persist(self) -> Snapshot:
        """The same snapshot with every array computed and held in memory: on the workers
        of the active distributed client (in this process without one), for several
        analyses in a row without reading the store again. A chunk lost with a worker is
        recomputed (read again) by the scheduler."""
        import dask

        names, fields = list(self._arrays), list(self._fields)
        held = dask.persist(*(self._arrays[k] for k in names),
                            *(self._fields[k] for k in fields))
        return Snapshot(dict(zip(names, held[:len(names)], strict=True)), self._attrs,
                        source=self._source, unchecked=self._unchecked,
                        fields=dict(zip(fields, held[len(names):], strict=True)))

    def to_units(self, *, length: str | None = None, velocity: str | None = None,
                 mass: str | None = None) -> Snapshot:
        """The same snapshot in other units (lazy): positions and box in ``length``,
        velocities in ``velocity``, masses (per-particle and ``particle_mass``) in
        ``mass``, and ``G`` converted with them, so every analysis of the result is
        in the new units.

        Units are strings read by :mod:`cosmo_dask.units` (astropy.units with the
        ``/h`` convention): ``to_units(length="Mpc/h")`` on a kpc/h Gadget import,
        ``to_units(mass="Msun/h")``. Converting between ``/h`` and plain units
        (``"kpc/h"`` to ``"kpc"``) uses the cosmology's ``h``. A note such as
        ``(peculiar)`` is kept. Arrays keep their dtype. The extra per-particle
        :attr:`fields` are kept **unconverted**: their units are not known.

        Raises
        ------
        ParameterError
            The snapshot has no units, a unit is not one of its quantity, the
            units are labels (``"N-body length"``), or ``h`` is needed and unknown.
        """
        from ..units import factor, gravitational_constant, with_note

        current = self.units
        if current is None:
            raise ParameterError("to_units: the snapshot states no units (units=None); "
                                 "give them when creating it (Snapshot.from_arrays(units=...))")
        h = (self.cosmology or {}).get("h")
        new, f = dict(current), {}
        for q, target in (("length", length), ("velocity", velocity), ("mass", mass)):
            f[q] = 1.0
            if target is None:
                continue
            if q not in current:
                raise ParameterError(f"to_units: the snapshot states no {q} unit")
            f[q] = factor(current[q], target, q, h=h)
            new[q] = with_note(str(target), current[q])

        def scaled(v, k):
            return (v * np.float64(k)).astype(v.dtype) if k != 1.0 else v

        box = None if self.box_size is None else self.box_size * f["length"]
        arrays = {}
        for name, v in self._arrays.items():
            k = {"pos": f["length"], "vel": f["velocity"], "mass": f["mass"]}.get(name, 1.0)
            v = scaled(v, k)
            if name == "pos" and box is not None and k != 1.0:
                v = wrapped_positions(v, box)  # x < box can round to the new box exactly
            arrays[name] = v
        attrs = dict(self._attrs)
        attrs["units"] = new
        attrs["box_size"] = box
        if attrs["particle_mass"] is not None:
            attrs["particle_mass"] = attrs["particle_mass"] * f["mass"]
        if attrs["G"] is not None:
            attrs["G"] = attrs["G"] * f["length"] * f["velocity"] ** 2 / f["mass"]
        else:
            attrs["G"] = gravitational_constant(new, h=h)
        return Snapshot(arrays, attrs, source=self._source, fields=self._fields)

    def to_redshift_space(self, los="z") -> Snapshot:
        """The same snapshot in redshift space along ``los`` (lazy; NumPy or CuPy chunks
        alike): each position moved by its peculiar velocity along the line of sight,

        ``s = x + (v . n) n / (a H(a))``, wrapped into ``[0, box_size)``,

        in the snapshot's length unit (``units["length"]``; velocities are peculiar,
        ``v = a dx/dt``, in ``units["velocity"]``, as every generator and import writes
        them; :func:`cosmo_dask.units.hubble.velocity_to_comoving_length`). ``H(a) =
        H0 E(a)`` from the snapshot's cosmology (``Omega_m``, ``Omega_L``, curvature
        ``1 - Omega_m - Omega_L``; no radiation). The shift is computed in float64 and
        the positions keep their dtype. The result records the line of sight in its
        ``los`` attribute (:attr:`los`, stored by :meth:`to_zarr`), which
        :func:`cosmo_dask.analysis.power_spectrum` takes as its default for multipoles;
        velocities, ids, masses and fields are kept as they are.

        Parameters
        ----------
        los : {"x", "y", "z"}, {0, 1, 2} or array_like (3,)
            The line of sight: an axis or a non-zero vector (normalised), as
            ``power_spectrum``'s ``los`` (default ``"z"``, the plane-parallel
            approximation along the third axis).

        Returns
        -------
        Snapshot
            Redshift-space positions; ``attrs["los"]`` the unit line of sight.

        Raises
        ------
        ParameterError
            A bad ``los``; a snapshot without velocities, periodic box, scale factor,
            cosmology (``Omega_m``) or physical length and velocity units (the message
            names what is missing); one already in redshift space.
        """
        from ..core.checks import check_los
        from ..units.hubble import velocity_to_comoving_length

        what = "to_redshift_space"
        n = check_los(los, what)
        if self.los is not None:
            raise ParameterError(f"{what}: the snapshot is already in redshift space (along "
                                 f"{list(self.los)}); shift the real-space snapshot instead")
        if self.vel is None:
            raise ParameterError(f"{what}: the snapshot has no velocities ('vel'); the "
                                 "redshift-space shift is v_los / (a H(a))")
        if self.box_size is None:
            raise ParameterError(f"{what}: the snapshot is not periodic (no box_size); "
                                 "positions are wrapped into the periodic box")
        scale = velocity_to_comoving_length(self.units, self.scale_factor, self.cosmology,
                                            what=what)
        pos, vel, box = self.pos, self.vel, float(self.box_size)
        if vel.chunks != pos.chunks:
            vel = vel.rechunk(pos.chunks)
        direction = tuple(float(c) for c in n)
        token = dask.base.tokenize(pos, vel, direction, scale, box)
        shifted = da.map_blocks(_redshift_block, pos, vel, direction, scale, box,
                                dtype=pos.dtype, meta=pos._meta, name=f"redshift-space-{token}")
        attrs = dict(self._attrs)
        attrs["los"] = list(direction)
        arrays = dict(self._arrays)
        arrays["pos"] = shifted
        return Snapshot(arrays, attrs, source=self._source, fields=self._fields)

    def to_device(self, device: str) -> Snapshot:
        """The same snapshot with NumPy ('cpu') or CuPy ('gpu') chunks (lazy)."""
        device = check_device(device)
        return self._map(lambda v: to_device(v, device))

    def rechunk(self, chunks: int) -> Snapshot:
        """The same snapshot with ``chunks`` particles per chunk (lazy)."""
        rows = _row_chunks(chunks)
        return self._map(lambda v: v.rechunk((rows,) + v.shape[1:]))

    # ---------------------------------------------------------------- validation
    def validate(self, full: bool = False, *, raise_errors: bool = True) -> ValidationReport:
        """Check the snapshot.

        ``full=False`` checks what construction already checked (metadata: no
        data read). ``full=True`` also reads everything: finite values,
        positions inside [0, box_size) when periodic, masses > 0 and unique ids,
        and, for a store cosmo_dask wrote, that every chunk file still has the
        CRC-32 recorded when it was written (``chunk_manifest``).

        Raises
        ------
        SnapshotError
            Listing every problem found, unless ``raise_errors=False`` (then the
            report's ``problems`` holds them).
        """
        if full:
            # altered chunks first (every one listed): their values are not the data's,
            # and a verifying read of them would stop at the first
            altered = self._checksum_problems()
            if altered:
                report = ValidationReport(n_particles=self._n, full=True, problems=altered)
            else:
                raw = Snapshot(self._unchecked or self._arrays, self._attrs,
                               source=self._source)
                report = full_report(raw)
        else:
            report = ValidationReport(n_particles=self._n, full=False)
        if raise_errors and not report.ok:
            raise SnapshotError("; ".join(report.problems))
        return report

    def _checksum_problems(self) -> list[str]:
        """Chunk files of the store this snapshot was opened from whose CRC-32 differs
        from the one recorded when cosmo_dask wrote them (empty for other sources)."""
        src = self._source
        if not src or is_remote(src) or not (Path(src) / "zarr.json").is_file():
            return []
        try:
            group = zarr.open_group(src, mode="r")
            stored = {n: a for n, a in group.arrays() if n in ARRAY_NAMES}
            stored.update(_stored_fields(group))
        except Exception:  # not a group any more: opening it again says why
            return []
        return checksum_problems(stored, src)

    # ---------------------------------------------------------------- output
    def to_xarray(self):
        """An ``xarray.Dataset`` over dims (``particle``, ``axis``) holding the dask arrays,
        each with its ``units`` attribute (the snapshot's units; ``"1"`` for ids and
        types; labels when the snapshot states none). Extra ``fields`` are left out."""
        import xarray as xr

        pu = product_units(self.units)
        quantity = {"pos": "length", "vel": "velocity", "mass": "mass"}
        data = {}
        for name, arr in self.arrays.items():
            dims = ("particle", "axis") if arr.ndim == 2 else ("particle",)
            data[name] = (dims, arr, {"units": pu[quantity.get(name, "dimensionless")]})
        attrs = {k: v for k, v in self.attrs.items() if v is not None}
        return xr.Dataset(data, coords={"axis": ["x", "y", "z"]}, attrs=attrs)

    def store_attrs(self) -> dict[str, Any]:
        """The attributes written to ``zarr.json`` (format header included)."""
        attrs = {"format": FORMAT, "format_version": FORMAT_VERSION}
        attrs.update(plain_attrs(self._attrs))
        for key in ("provenance", "los"):  # stores of other snapshots stay as they were
            if attrs[key] is None:
                del attrs[key]
        attrs["n_particles"] = self._n
        attrs["created_by"] = f"cosmo_dask {__version__}"
        return attrs

    def to_zarr(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        compressor: str | None = None,
        progress: bool | None = None,
    ) -> str:
        """Write the snapshot as a Zarr v3 store, atomically.

        Values are checked while writing (finite, inside the box, masses > 0);
        a failed or interrupted write leaves nothing at ``path`` (and an existing
        store there untouched).

        Parameters
        ----------
        path : str or path-like
            Target directory (local or shared filesystem).
        overwrite : bool
            Replace an existing store at ``path`` (only once the new one is complete).
        compressor : {None, "zstd", "blosc"}
            Chunk compression. Default None: particle coordinates are nearly
            incompressible and uncompressed chunks read fastest.
        progress : bool, optional
            Show a progress bar (default: dask config ``cosmo_dask.progress``).

        Returns
        -------
        str
            The path written.
        """
        from .zarr_write import codecs_for, store_arrays

        compressors = codecs_for(compressor)
        sources = {name: checked_array(to_device(arr, "cpu"), name, self.box_size, self._source)
                   for name, arr in self._arrays.items()}
        fields = {f"{FIELDS_GROUP}/{k}": to_device(v, "cpu") for k, v in self._fields.items()}
        dims = {k: ("particle", "component")[:v.ndim] for k, v in fields.items()}
        # onto its own source is allowed (a rechunk in place): every read ends before the
        # new store is renamed in
        with atomic_directory(path, overwrite=overwrite, what="snapshot store",
                              fmt=FORMAT) as tmp:
            group = zarr.open_group(
                str(tmp), mode="w", zarr_format=3, attributes=self.store_attrs()
            )
            if fields:  # fields/<name>: written and recorded in the manifest like pos
                group.create_group(FIELDS_GROUP)
            store_arrays(group, {**sources, **fields}, root=tmp, dims=dims,
                         compressors=compressors, label=f"writing {path}", show=progress)
        return str(local_path(path))


def _redshift_block(pos, vel, direction, scale: float, box: float):
    """One chunk's redshift-space positions: ``pos + (vel . n) n scale`` in float64,
    wrapped into the box and cast back to ``pos``'s dtype (NumPy or CuPy)."""
    shift = sum(vel[:, j].astype(np.float64) * c for j, c in enumerate(direction) if c != 0.0)
    out = pos.astype(np.float64)
    for j, c in enumerate(direction):
        if c != 0.0:
            out[:, j] += shift * (c * scale)
    return wrap_into_box(out, box, pos.dtype)


# ------------------------------------------------------------------------------- open
def _check_store_path(path) -> None:
    p = local_path(path)
    if not p.exists():
        recover(p)  # a replace of the store interrupted between its two renames
    if not p.exists():
        raise SnapshotError(f"{p}: no such snapshot store (path does not exist)")
    if p.is_file():
        raise SnapshotError(f"{p}: is a file; a snapshot store is a Zarr v3 directory")
    if (p / ".zgroup").exists() or (p / ".zarray").exists():
        raise SnapshotError(
            f"{p}: is a Zarr v2 store; cosmo_dask reads Zarr v3 snapshot stores "
            "(convert with zarr 3, or re-create it with cosmo_dask)"
        )
    if not (p / "zarr.json").exists():
        raise SnapshotError(
            f"{p}: not a cosmo_dask snapshot store (no zarr.json: not a Zarr v3 group)"
        )


def _stored_fields(group) -> dict[str, Any]:
    """``{"fields/<name>": zarr array}`` of a store's ``fields`` subgroup (empty without
    one; stores written before fields existed have none), by name."""
    sub = group.get(FIELDS_GROUP) if FIELDS_GROUP in group else None
    if not isinstance(sub, zarr.Group):  # absent, or a foreign member: ignored
        return {}
    return {f"{FIELDS_GROUP}/{n}": a for n, a in sorted(sub.arrays())}


def _json_ok(path: Path) -> bool:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


#: rows per dask chunk at least, when a store is opened on the GPU without ``chunks``: with
#: 2^20-row chunks, info's full validation of a 512^3 store spends most of its time
#: scheduling the duplicate-id split of its 128 chunks, and takes about 9 times longer
#: than with 2^24 (benchmarks/RESULTS.md, CLI pipeline on one GPU)
GPU_READ_ROWS = 1 << 24


def gpu_read_rows(store_rows: int) -> int:
    """Rows per chunk on the GPU: whole store chunks, at least :data:`GPU_READ_ROWS` rows."""
    return store_rows * max(1, GPU_READ_ROWS // max(1, store_rows))


def open_snapshot(
    path: str | os.PathLike,
    *,
    device: str = "cpu",
    chunks: int | None = None,
    wrap: bool = False,
    check: bool = True,
    storage_options: dict | None = None,
    allow_missing_chunks: bool = False,
    verify: bool | None = None,
) -> Snapshot:
    """Open a snapshot store lazily (reads metadata only).

    The extra per-particle fields of the store's ``fields`` subgroup, if any, come
    back as :attr:`Snapshot.fields`, read lazily and chunk-checked like the core
    arrays (their values are not checked).

    Parameters
    ----------
    path : str or path-like
        The store directory (or an fsspec URL, read through zarr).
    device : {"cpu", "gpu"}
        Chunk type of the returned arrays: NumPy or CuPy.
    chunks : int, optional
        Particles per dask chunk; default: dask config ``cosmo_dask.read_chunk_size``
        when set, else the store's own chunks on the CPU and whole store chunks of
        at least :data:`GPU_READ_ROWS` (2^24) particles on the GPU, where fewer,
        larger tasks are much faster; in both cases whole store chunks enough for
        at most :data:`~cosmo_dask.core.backend.MAX_READ_CHUNKS` (512) dask chunks
        (:func:`~cosmo_dask.core.backend.large_store_rows`: 2^24 rows for a 2048^3 store of
        2^20-row chunks).
    wrap : bool
        Wrap periodic positions into [0, box_size) while reading (instead of
        raising for positions outside the box).
    check : bool
        Check each chunk's values when it is computed (finite, inside the box,
        masses > 0); a bad chunk raises SnapshotError naming the particle.
    allow_missing_chunks : bool
        Every chunk file of a local store is checked on opening: stores that
        cosmo_dask wrote carry a manifest (each chunk's size), and a missing or
        resized chunk is always a SnapshotError. In a store of another writer
        without a manifest a missing chunk is an error too, unless this is True
        (then it reads as the array's fill value, as zarr does).
    verify : bool, optional
        Check every chunk file read against the CRC-32 its manifest recorded when
        cosmo_dask wrote it, as it is read (no second read; a mismatch raises
        :class:`~cosmo_dask.core.errors.ChecksumError` naming the store, array and chunk).
        Default: dask config ``cosmo_dask.verify`` (True). ``False`` reads
        altered chunks as they are.

    Raises
    ------
    SnapshotError
        Missing path, a file, a Zarr v2 store, not a cosmo_dask store, an
        unknown format_version, missing ``pos``, wrong shapes/dtypes/lengths,
        shapes that disagree with the ``n_particles`` attribute or the chunk
        manifest, or inconsistent attributes.
    """
    device = check_device(device)
    if chunks is None:
        chunks = dask.config.get("cosmo_dask.read_chunk_size", None)
    rows = None if chunks is None else _row_chunks(chunks)
    remote = is_remote(path)
    if not remote:
        _check_store_path(path)
    src = str(path) if remote else str(local_path(path))
    try:
        group = zarr.open_group(src, mode="r", storage_options=storage_options)
    except Exception as exc:  # zarr raises many types for unreadable stores
        raise SnapshotError(f"{src}: not a readable Zarr v3 group ({exc})") from None
    if not isinstance(group, zarr.Group):
        raise SnapshotError(f"{src}: is a Zarr array, not a cosmo_dask snapshot group")
    attrs = dict(group.attrs)
    fmt = attrs.get("format")
    if fmt != FORMAT:
        raise SnapshotError(
            f"{src}: not a cosmo_dask snapshot store (attribute 'format' is {fmt!r}, "
            f"expected {FORMAT!r})"
        )
    version = attrs.get("format_version")
    if version not in SUPPORTED_VERSIONS:
        raise SnapshotError(
            f"{src}: format_version {version!r} is not supported; this cosmo_dask reads "
            f"version(s) {', '.join(map(str, SUPPORTED_VERSIONS))} (upgrade cosmo_dask?)"
        )
    try:
        found = dict(group.arrays())
        stored_fields = _stored_fields(group)
    except Exception as exc:  # an array's zarr.json that zarr cannot parse
        names = [*ARRAY_NAMES, *(f"{FIELDS_GROUP}/{m.parent.name}" for m in
                                 sorted((Path(src) / FIELDS_GROUP).glob("*/zarr.json")))]
        bad = next((n for n in names if (Path(src) / n / "zarr.json").is_file()
                    and not _json_ok(Path(src) / n / "zarr.json")), None)
        where = f"{src}/{bad}/zarr.json" if bad else src
        raise SnapshotError(f"{where}: unreadable array metadata ({type(exc).__name__}: "
                            f"{exc}); restore the file or re-create the store") from None
    provenance = attrs.get("provenance")
    if provenance is not None and not isinstance(provenance, Mapping):
        raise SnapshotError(f"{src}: attribute 'provenance' must be a mapping or absent, got "
                            f"{type(provenance).__name__}")
    members = {name: found[name] for name in ARRAY_NAMES if name in found}
    shapes = {k: (tuple(a.shape), a.dtype) for k, a in members.items()}
    field_shapes = {k.partition("/")[2]: (tuple(a.shape), a.dtype)
                    for k, a in stored_fields.items()}
    n = check_metadata(shapes, attrs, src, field_shapes)
    check_stored_length(n, attrs, src)  # an edited shape, before any chunk is listed
    for name, arr in {**members, **stored_fields}.items():
        check_chunks(arr, name, src, allow_missing=allow_missing_chunks)
    box = attrs.get("box_size")
    check_box = None if wrap else box  # with wrap=True: check finiteness, then wrap
    if rows is None:
        store_rows = members["pos"].chunks[0]
        rows = large_store_rows(store_rows, members["pos"].shape[0])
        if device == "gpu":
            rows = max(rows, gpu_read_rows(store_rows))
        if rows == store_rows:
            rows = None  # the store's own chunks
    verify = verify_default(verify)
    arrays = {n: read_array(a, n, src, rows, check=check, box_size=check_box, device=device,
                            verify=verify)
              for n, a in members.items()}
    unchecked = None
    if check:
        unchecked = {n: read_array(a, n, src, rows, device=device, verify=verify)
                     for n, a in members.items()}
    if wrap and box is not None:
        arrays["pos"] = wrapped_positions(arrays["pos"], float(box))
        if unchecked is not None:
            unchecked["pos"] = wrapped_positions(unchecked["pos"], float(box))
    fields = {k.partition("/")[2]: read_array(a, k, src, rows, device=device, verify=verify)
              for k, a in stored_fields.items()}
    # every array was read on ``device`` (zarr_read.read_array)
    return Snapshot(arrays, attrs, source=src, unchecked=unchecked, fields=fields)


__all__ = ["Snapshot", "open_snapshot", "ARRAY_NAMES"]


def particles_of(snap_or_pos, mass=None, box_size=None, *, what: str):
    """``(pos, mass, box_size, snapshot or None)`` of a Snapshot or of raw positions.

    For a Snapshot: its positions; ``mass`` unless given is its ``mass`` array,
    else its ``particle_mass``, else None; ``box_size`` unless given is its own
    (a different one given is a ParameterError naming ``what``). Raw positions
    come back as they are, with the given ``mass`` and ``box_size``. Nothing is
    read; each caller applies its own rules for a missing box or mass.
    """
    if not isinstance(snap_or_pos, Snapshot):
        return snap_or_pos, mass, box_size, None
    snap = snap_or_pos
    if box_size is not None and snap.box_size is not None:
        try:
            same = math.isclose(float(box_size), snap.box_size, rel_tol=1e-12)
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ParameterError(f"{what}: box_size={box_size!r} differs from the snapshot's "
                                 f"box_size={snap.box_size:g}; leave box_size=None")
    if mass is None:
        mass = snap.mass if snap.mass is not None else snap.particle_mass
        mass = float(mass) if mass is not None and np.ndim(mass) == 0 else mass
    box = snap.box_size if box_size is None else box_size
    return snap.pos, mass, box, snap
