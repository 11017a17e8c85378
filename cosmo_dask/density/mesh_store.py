"""The store ``cosmo-dask density --method ngp|cic|tsc|pcs`` writes: a painted mesh.

Layout of ``OUT.zarr`` (Zarr v3 group, written atomically; attrs
``format="cosmo_dask.mesh"``, ``format_version=1``, ``box_size``, ``n_mesh``,
``scheme``, ``cell_size``, ``convention``, and the units ``mass_units``,
``box_size_units``, ``cell_size_units``, ``density_units``): one array ``mass``
(n, n, n), the mass per cell in the snapshot's mass unit (its ``units``
attribute), chunked in slabs along axis 0 (about 128 MiB of float64 each; the
painted mesh's slabs are rechunked to them as they are written). Cell ``i``
covers ``[i H, (i + 1) H)`` with ``H = box_size / n``; divide by ``H**3`` for a
density (in ``density_units``). Units come from :func:`~cosmo_dask.product_units.product_units`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import dask.array as da
import numpy as np
import zarr

from ..atomic import atomic_directory, local_path
from ..backend import host
from ..product_units import product_units, store_units
from ..zarr_read import open_product_group
from ..zarr_write import store_arrays

FORMAT = "cosmo_dask.mesh"
FORMAT_VERSION = 1


def write_mesh(path: str | os.PathLike, mesh: da.Array, *, box_size: float, scheme: str,
               overwrite: bool = False, attrs: dict | None = None,
               units: Mapping[str, str] | None = None) -> str:
    """Write a painted mesh (mass per cell) atomically; returns the path.

    Parameters
    ----------
    path : str or path-like
    mesh : dask.array.Array
        ``(n, n, n)`` mass per cell, e.g. from :func:`~cosmo_dask.density.paint`.
    box_size : float
        Side of the painted cube, in length units.
    scheme : str
        The mass-assignment scheme it was painted with.
    overwrite : bool
        Replace an existing mesh store.
    attrs : dict, optional
        More attributes of the store (``source``, ...).
    units : mapping, optional
        The painted snapshot's ``units`` (or their
        :func:`~cosmo_dask.product_units.product_units`); None: the "input
        mass" / "input length" labels.
    """
    n = int(mesh.shape[0])
    pu = product_units(units)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "box_size": float(box_size),
            "n_mesh": n, "scheme": scheme, "cell_size": float(box_size) / n,
            "convention": "mass per cell; cell i covers [i H, (i+1) H), H = box_size / n_mesh",
            "mass_units": pu["mass"], "box_size_units": pu["length"],
            "cell_size_units": pu["length"], "density_units": pu["density"], **(attrs or {})}
    slab = max(1, min(n, 2**24 // max(1, n * n)))  # about 128 MiB of float64 per chunk
    with atomic_directory(path, overwrite=overwrite, what="mesh store", fmt=FORMAT,
                          inputs=(meta.get("source"),)) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=meta)
        store_arrays(group, {"mass": mesh.astype(np.float64)}, root=tmp,
                     chunks={"mass": (slab, n, n)}, dims={"mass": ("x", "y", "z")},
                     compressors="auto", label=f"writing {path}")
        store_units(group, {"mass": pu["mass"]})
    return str(local_path(path))


def open_mesh(path: str | os.PathLike):
    """``(mass, attrs)``: the mesh as a lazy dask array and the store's attributes
    (``mass_units``, ``cell_size_units``, ... among them)."""
    group, attrs = open_product_group(path, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="mesh store")
    return da.from_zarr(group["mass"]), attrs


def plot_mesh_slice(mesh, box_size: float, *, axis: int = 2, index: int | None = None,
                    thickness: int = 1, path=None, ax=None):
    """Log-density image of a slab of a mesh (mass per cell), e.g. from :func:`open_mesh`.

    ``thickness`` cells along ``axis`` starting at ``index`` (default: the middle) are
    summed; the image is ``log10(1 + delta)`` of the slab. Returns the figure.
    """
    import matplotlib

    if ax is None and path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    n = int(mesh.shape[axis])
    start = n // 2 if index is None else int(index)
    sel = [slice(None)] * 3
    sel[axis] = slice(start, start + max(1, int(thickness)))
    slab = mesh[tuple(sel)].sum(axis=axis)
    slab = np.asarray(host(slab.compute() if hasattr(slab, "compute") else slab), np.float64)
    mean = slab.mean()
    image = np.log10(np.maximum(slab / mean, 1e-3)) if mean > 0 else slab
    fig = ax.figure if ax is not None else plt.figure(figsize=(5.5, 4.5))
    ax = ax if ax is not None else fig.add_subplot(111)
    shown = ax.imshow(image.T, origin="lower", extent=(0, box_size, 0, box_size),
                      cmap="magma")
    fig.colorbar(shown, ax=ax, label="log10(1 + delta)")
    names = [a for a in "xyz" if a != "xyz"[axis]]
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_title(f"{'xyz'[axis]} cells {start}-{start + max(1, int(thickness)) - 1} of {n}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
