"""The figure of a halo mass function: the measurement with Poisson errors and the
fitting functions' curves (computed by :func:`cosmo_dask.halos.plot_mass_function`,
which checks the input, makes the curves and calls
:func:`cosmo_dask.plot.figure.new_axes` and :func:`draw_mass_function`)."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["draw_mass_function"]


def draw_mass_function(ax, ds, curves=(), *, mass_unit: str, density_unit: str,
                       redshift: float = 0.0, path: str | os.PathLike | None = None):
    """Draw a measured mass function on ``ax`` (log-log ``dn/dlnM`` against M).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    ds : xarray.Dataset
        With ``mass``, ``mass_lo``, ``mass_hi``, ``dn_dlnM``, ``dn_dlnM_error`` (and
        ``counts``), as from :func:`cosmo_dask.halos.mass_function`.
    curves : sequence of (mass, dn_dlnM, label)
        Model curves, already in the units of ``ds``.
    mass_unit, density_unit : str
        Axis labels' units (of M and of ``dn/dlnM``).
    redshift : float
        For the title.
    path : str or path-like, optional
        Save the figure there as PNG.

    Returns
    -------
    matplotlib.axes.Axes
    """
    mass = np.asarray(ds["mass"].values, dtype=np.float64)
    dn = np.asarray(ds["dn_dlnM"].values, dtype=np.float64)
    err = np.asarray(ds["dn_dlnM_error"].values, dtype=np.float64)
    lo = np.asarray(ds["mass_lo"].values, dtype=np.float64)
    hi = np.asarray(ds["mass_hi"].values, dtype=np.float64)
    filled = dn > 0
    if np.any(filled):
        # lower error bar clipped so it stays positive on the log axis
        lower = np.minimum(err[filled], dn[filled] * (1.0 - 1e-3))
        ax.errorbar(
            mass[filled],
            dn[filled],
            yerr=[lower, err[filled]],
            xerr=[mass[filled] - lo[filled], hi[filled] - mass[filled]],
            fmt="o",
            ms=4,
            color="k",
            capsize=2,
            label=f"measured ({int(ds['counts'].sum()) if 'counts' in ds else '?'} halos)",
        )
    for m_grid, dn_fit, label in curves:
        ax.plot(m_grid, dn_fit, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"M [{mass_unit}]")
    ax.set_ylabel(f"dn/dlnM [{density_unit}]")
    ax.set_title(f"halo mass function (z = {float(redshift):g})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False)
    if path is not None:
        ax.figure.savefig(os.fspath(path), format="png", dpi=100, bbox_inches="tight")
    return ax
