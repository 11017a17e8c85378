"""HaloResult: labels + catalog, and their store (written atomically).

Store layout (Zarr v3 group)::

    halos.zarr/
      zarr.json      attrs: format="cosmo_dask.halos", format_version=1, parameters
                     (the snapshot's source path among them)
      labels  (N,)   int64, chunks like the snapshot
      catalog/       the catalog Dataset (xarray's Zarr layout, dims halo and axis;
                     every variable's attributes, ``units`` among them, kept)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_product_group, product_store
from ..store.zarr_write import plain_attrs, store_arrays, store_dataset
from ..units.products import store_units

FORMAT = "cosmo_dask.halos"
FORMAT_VERSION = 1


@dataclass
class HaloResult:
    """Friends-of-friends halos of a snapshot.

    Attributes
    ----------
    labels : dask.array.Array
        (N,) int64, aligned with the snapshot's particle order; halo id h is
        row h of the catalog; -1 for particles in no kept halo.
    catalog : xarray.Dataset
        Over dim ``halo`` (and ``axis``): ``n_members``, ``mass``,
        ``center_of_mass``, ``velocity``, ``r_max``, ``first_member_id`` and,
        when asked for, ``mbp_index``/``mbp_position``/``mbp_potential`` and
        ``mcp_index``/``mcp_position``/``mcp_friends``; each with a ``units``
        attribute (``"1"`` for counts, indices and ids), kept by the store.
    parameters : dict
        Everything the result depends on.
    """

    labels: da.Array
    catalog: xr.Dataset
    parameters: dict = field(default_factory=dict)

    @property
    def n_halos(self) -> int:
        return int(self.catalog.sizes.get("halo", 0))

    def _units(self) -> tuple[str | None, str | None]:
        """(length unit, mass unit) of the catalog (its attrs), None where unknown."""
        attrs = self.catalog.attrs
        return attrs.get("length_unit"), attrs.get("mass_unit")

    def variable_units(self) -> dict[str, str]:
        """The unit of each catalog variable: its ``units`` attribute, or for catalogs
        written before variables carried one, the catalog's length and mass units."""
        length, mass = self._units()
        fallback = {"mass": mass, "center_of_mass": length, "r_max": length,
                    "mbp_position": length, "mcp_position": length}
        out = {}
        for name, var in self.catalog.data_vars.items():
            unit = var.attrs.get("units") or fallback.get(name)
            if unit:
                out[name] = str(unit)
        return out

    def _linking_text(self, digits: int) -> str:
        from ..plot.html import signif, with_unit

        p = self.parameters
        b = p.get("linking_length", self.catalog.attrs.get("linking_length"))
        text = with_unit(b, self._units()[0], digits)
        b_in = p.get("linking_length_input")
        if b_in is not None and not p.get("absolute", False):
            text += f" (b = {signif(b_in, digits)} mean spacings)"
        return text

    def __repr__(self) -> str:
        """One line, numbers to 4 significant digits with the catalog's units."""
        from ..plot.html import with_unit

        length, mass = self._units()
        largest = ""
        if self.n_halos:
            largest = f" (largest {int(self.catalog['n_members'][0])} members"
            if "mass" in self.catalog:
                largest += f", mass {with_unit(float(self.catalog['mass'][0]), mass)}"
            largest += ")"
        extra = ""
        if self.parameters.get("min_members") is not None:
            extra = f", min {self.parameters['min_members']} members"
        return (f"<HaloResult {self.n_halos} halo{'s' * (self.n_halos != 1)}{largest}, "
                f"linking length {self._linking_text(4)}{extra}>")

    def _repr_html_(self) -> str:
        """Jupyter's rich display: summary, largest halos, catalog columns, parameters."""
        from ..plot.html import array_row, html_table, signif, with_unit

        digits = 6
        length, mass = self._units()
        units = self.variable_units()
        cat, p = self.catalog, self.parameters
        rows = [("halos", f"{self.n_halos:,}")]
        if self.n_halos:
            members = int(cat["n_members"].sum())
            n = int(self.labels.shape[0])
            frac = f" ({100 * members / n:.3g} %)" if n else ""
            rows.append(("particles in halos", f"{members:,} of {n:,}{frac}"))
            big = f"{int(cat['n_members'][0]):,} members"
            if "mass" in cat:
                big += f", mass {with_unit(float(cat['mass'][0]), mass, digits)}"
            if "r_max" in cat:
                big += f", r_max {with_unit(float(cat['r_max'][0]), length, digits)}"
            rows.append(("largest halo", big))
        rows.append(("linking length", self._linking_text(digits)))
        for key, label in (("min_members", "min members"), ("min_friends", "min friends")):
            if p.get(key) is not None:
                rows.append((label, p[key]))
        if cat.attrs.get("box_size") is not None:
            rows.append(("box", with_unit(cat.attrs["box_size"], length, digits)))
        if p.get("centers"):
            rows.append(("centres", ", ".join(map(str, p["centers"]))))
        if p.get("snapshot"):
            rows.append(("snapshot", p["snapshot"]))
        out = ["<div class='cosmo-dask-halos'>", "<b>cosmo_dask.halos.HaloResult</b>",
               html_table(rows), "<b>labels</b>",
               html_table([array_row("labels", self.labels)[:-1]],
                           ("name", "shape", "dtype", "chunking", "backend", "size"))]
        if self.n_halos:
            shown = min(self.n_halos, 5)
            cols = [c for c in ("n_members", "mass", "center_of_mass", "r_max") if c in cat]
            header = ["halo"] + [f"{c} [{units[c]}]" if units.get(c, "1") != "1" else c
                                 for c in cols]
            table = []
            for h in range(shown):
                cells = [h]
                for c in cols:
                    v = np.asarray(cat[c][h])
                    cells.append(", ".join(signif(x, 4) for x in v.ravel()) if v.ndim
                                 else signif(v[()], digits))
                table.append(cells)
            out += [f"<b>largest halos</b> ({shown} of {self.n_halos:,})",
                    html_table(table, header)]
        columns = [(name, f"({', '.join(map(str, var.dims))})", str(var.dtype),
                    units.get(name) or "") for name, var in cat.data_vars.items()]
        out += ["<b>catalog</b> (xarray.Dataset <code>.catalog</code>)",
                html_table(columns, ("variable", "dims", "dtype", "unit"))]
        if p:
            out += ["<b>parameters</b>", html_table(
                [(k, signif(v, digits) if not isinstance(v, (list, tuple)) else
                  ", ".join(signif(x, digits) for x in v)) for k, v in p.items()])]
        out.append("</div>")
        return "".join(out)

    def to_zarr(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write labels, catalog and parameters to a Zarr v3 store, atomically."""
        with atomic_directory(path, overwrite=overwrite, what="halo store", fmt=FORMAT,
                              inputs=(self.parameters.get("snapshot"),)) as tmp:
            attrs = {"format": FORMAT, "format_version": FORMAT_VERSION,
                     "parameters": plain_attrs(self.parameters)}
            group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=attrs)
            store_arrays(group, {"labels": self.labels.astype(np.int64)}, root=tmp,
                         fill_value=-1, label=f"writing {path}")
            store_units(group, {"labels": "1"})
            ds = self.catalog.drop_vars("axis", errors="ignore")  # strings: no stable v3 dtype
            ds.attrs = {k: plain_attrs(v) for k, v in ds.attrs.items()}
            store_dataset(ds, tmp / "catalog", label=f"writing {path}: catalog")
        return str(local_path(path))


def open_catalog(path: str | os.PathLike) -> HaloResult:
    """Open a halo store written by :meth:`HaloResult.to_zarr` (labels lazily)."""
    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION, what="halo store")
    labels = da.from_zarr(group["labels"])
    catalog = xr.open_zarr(product_store(p / "catalog"), consolidated=False).load()
    if "axis" in catalog.dims:
        catalog = catalog.assign_coords(axis=["x", "y", "z"])
    return HaloResult(labels, catalog, dict(attrs.get("parameters", {})))
