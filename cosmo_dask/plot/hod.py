"""The figure of a galaxy mock's halo occupation: the measured mean central and satellite
counts per halo-mass bin with Poisson errors, beside the model's curves (computed by
:func:`cosmo_dask.halos.hod.plot_occupation`, which calls
:func:`cosmo_dask.plot.figure.new_axes` and :func:`draw_occupation`)."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["draw_occupation"]


def draw_occupation(ax, ds, curves=(), *, mass_label: str = "M",
                    title: str = "halo occupation",
                    path: str | os.PathLike | None = None):
    """Draw measured mean occupations on ``ax`` (log-log <N> against M).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    ds : xarray.Dataset
        With ``mass``, ``mass_lo``, ``mass_hi`` (Msun/h), ``mean_ncen``, ``mean_nsat`` and
        their ``_error`` variables, as from :func:`cosmo_dask.halos.hod.mean_occupation`.
    curves : sequence of (mass, mean count, label)
        Model curves, masses in Msun/h.
    mass_label : str
        The mass definition, for the x-axis label.
    title : str
    path : str or path-like, optional
        Save the figure there (format from the suffix).

    Returns
    -------
    matplotlib.axes.Axes
    """
    mass = np.asarray(ds["mass"].values, dtype=np.float64)
    lo = np.asarray(ds["mass_lo"].values, dtype=np.float64)
    hi = np.asarray(ds["mass_hi"].values, dtype=np.float64)
    for key, label, marker in (("mean_ncen", "centrals", "o"), ("mean_nsat", "satellites", "s"),
                               ("mean_ntot", "all", "^")):
        if key not in ds:
            continue
        y = np.asarray(ds[key].values, dtype=np.float64)
        err = np.asarray(ds[f"{key}_error"].values, dtype=np.float64)
        ok = np.isfinite(y) & (y > 0)
        if not ok.any():
            continue
        lower = np.minimum(err[ok], y[ok] * (1.0 - 1e-3))  # stays positive on the log axis
        ax.errorbar(mass[ok], y[ok], yerr=[lower, err[ok]],
                    xerr=[mass[ok] - lo[ok], hi[ok] - mass[ok]], fmt=marker, ms=4,
                    capsize=2, label=f"{label} (measured)")
    for m_grid, n, label in curves:
        ax.plot(m_grid, n, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{mass_label} [Msun/h]")
    ax.set_ylabel("<N(M)>")
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False, fontsize="small")
    if path is not None:
        ax.figure.savefig(os.fspath(path), dpi=100, bbox_inches="tight")
    return ax
