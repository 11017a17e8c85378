"""The figure of a subhalo mass function: the cumulative count of satellites above each
mass and the fitted power law (computed by
:func:`cosmo_dask.halos.subhalo_finder.plot_subhalo_mass_function`, which calls
:func:`cosmo_dask.plot.figure.new_axes` and :func:`draw_subhalo_mass_function`)."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["draw_subhalo_mass_function"]


def draw_subhalo_mass_function(ax, ds, *, path: str | os.PathLike | None = None):
    """Draw ``N(> m)`` (log-log steps) and the fitted power law of cumulative slope
    ``ds.attrs["slope"]`` truncated at the largest satellite.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    ds : xarray.Dataset
        ``mass`` and ``n_above`` over dim ``satellite`` with attributes ``slope``,
        ``slope_error``, ``n``, ``mass_min``, ``mass_unit``, as from
        :func:`cosmo_dask.halos.subhalo_finder.subhalo_mass_function`.
    path : str or path-like, optional
        Save the figure there as PNG.

    Returns
    -------
    matplotlib.axes.Axes
    """
    m = np.asarray(ds["mass"].values, np.float64)
    n = np.asarray(ds["n_above"].values)
    a = ds.attrs
    if m.size:
        ax.step(m, n, where="post", color="k", label=f"satellites ({m.size})")
        slope = a.get("slope", np.nan)
        if np.isfinite(slope):  # the truncated power law's N(> m) between its limits
            lo, hi = a["mass_min"], m.max()
            grid = np.geomspace(lo, hi, 50)
            if abs(slope) > 1e-9:
                curve = (grid**slope - hi**slope) / (lo**slope - hi**slope)
            else:
                curve = np.log(hi / grid) / np.log(hi / lo)
            n_fit = int((m >= lo).sum())
            ax.plot(grid[:-1], n_fit * curve[:-1], "--",
                    label=f"fit: slope {slope:.2f} ± {a.get('slope_error', np.nan):.2f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend()
    unit = a.get("mass_unit", "")
    ax.set_xlabel(f"bound mass m [{unit}]" if unit not in ("", "1") else
                  "bound mass m / M_host" if unit == "1" else "bound mass m")
    ax.set_ylabel("N(> m)")
    ax.set_title("subhalo mass function")
    if path is not None:
        ax.figure.savefig(path, dpi=120, bbox_inches="tight")
    return ax
