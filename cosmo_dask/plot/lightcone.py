"""Figure of a light cone: a thin wedge of its crossings, distance from the observer on
the axes (Mpc/h) and the redshift of crossing on a second axis (drawn from arrays that
:meth:`cosmo_dask.simulation.lightcone.Lightcone.plot_wedge` prepares; axes from
:func:`cosmo_dask.plot.figure.new_axes`)."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["draw_wedge"]


def draw_wedge(ax, x, y, redshift, chi_table, z_table, *, length_unit: str = "Mpc/h",
               title: str | None = None, path: str | os.PathLike | None = None):
    """Scatter the crossings of a wedge, coloured by redshift, with a redshift axis on top.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    x, y : array-like
        In-plane coordinates relative to the observer (length units): ``x`` along the
        wedge's axis, ``y`` across it.
    redshift : array-like
        Redshift of crossing of each point.
    chi_table, z_table : array-like
        Increasing comoving distances and their redshifts (the top axis' conversion).
    length_unit : str
        Label of the length axes.
    title : str, optional
    path : str or path-like, optional
        Save the figure there (the format from the suffix).

    Returns
    -------
    matplotlib.axes.Axes
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    chi_t = np.asarray(chi_table, dtype=np.float64)
    z_t = np.asarray(z_table, dtype=np.float64)
    size = max(0.05, min(2.0, 2e4 / max(x.size, 1)))
    points = ax.scatter(x, y, c=np.asarray(redshift), s=size, lw=0, cmap="viridis",
                        rasterized=True)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel(f"comoving distance along the wedge [{length_unit}]")
    ax.set_ylabel(f"across [{length_unit}]")
    top = ax.secondary_xaxis("top", functions=(lambda c: np.interp(c, chi_t, z_t),
                                               lambda z: np.interp(z, z_t, chi_t)))
    top.set_xlabel("redshift")
    ax.figure.colorbar(points, ax=ax, label="redshift of crossing", shrink=0.8)
    if title:
        ax.set_title(title)
    if path is not None:
        ax.figure.savefig(os.fspath(path), dpi=120, bbox_inches="tight")
    return ax
