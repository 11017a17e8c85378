"""Figures of merger trees: median mass accretion histories against a fit, and one halo's
tree (drawn from arrays that :class:`cosmo_dask.halos.merger_trees.MergerTree` and
``cosmo-dask trees --plot`` prepare; axes from :func:`cosmo_dask.plot.figure.new_axes`)."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["draw_mass_accretion", "draw_tree"]


def draw_mass_accretion(ax, redshift, histories, medians, fits=(), *,
                        path: str | os.PathLike | None = None):
    """Draw log10 M(z)/M0 against z: thin lines per halo, the median per mass bin, fits.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    redshift : array-like
        The outputs' redshifts (n,).
    histories : array-like
        M(z)/M0 of individual halos, shape (n, h) (NaN where a branch has ended);
        drawn thin and grey (may have h = 0).
    medians : sequence of (array (n,), label)
        Median histories (NaN where undefined).
    fits : sequence of (z array, M/M0 array, label)
        Fitted curves (dashed).
    path : str or path-like, optional
        Save the figure there (the format from the suffix).

    Returns
    -------
    matplotlib.axes.Axes
    """
    z = np.asarray(redshift, dtype=np.float64)
    hist = np.asarray(histories, dtype=np.float64).reshape(z.size, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        for col in hist.T:
            ax.plot(z, np.log10(col), color="0.8", lw=0.5, zorder=1)
        for k, (med, label) in enumerate(medians):
            ax.plot(z, np.log10(np.asarray(med, dtype=np.float64)), "o-", color=f"C{k}",
                    label=label, zorder=3)
        for k, (zf, ratio, label) in enumerate(fits):
            ax.plot(zf, np.log10(np.asarray(ratio, dtype=np.float64)), "--", color=f"C{k}",
                    label=label, zorder=2)
    ax.set_xlabel("z")
    ax.set_ylabel("log10 M(z) / M(z=0)")
    ax.set_title("mass accretion histories")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False, fontsize="small")
    if path is not None:
        ax.figure.savefig(os.fspath(path), dpi=100, bbox_inches="tight")
    return ax


def draw_tree(ax, redshift, x, mass, parent, *, mass_unit: str = "",
              path: str | os.PathLike | None = None):
    """Draw one halo's merger tree: nodes at (x, z) sized by mass, lines to descendants.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    redshift, x, mass : array-like
        Per node (m,): its output's redshift, horizontal layout position, mass.
    parent : array-like
        Per node, the row of its descendant (-1 for the root).
    mass_unit : str
        For the legend of the marker size.
    path : str or path-like, optional
        Save the figure there.

    Returns
    -------
    matplotlib.axes.Axes
    """
    z = np.asarray(redshift, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    m = np.asarray(mass, dtype=np.float64)
    parent = np.asarray(parent, dtype=np.int64)
    for i in np.flatnonzero(parent >= 0):
        j = parent[i]
        ax.plot([x[i], x[j]], [z[i], z[j]], color="0.5", lw=0.7, zorder=1)
    size = 200.0 * (m / m.max()) ** 0.5 if m.size and m.max() > 0 else 10.0
    ax.scatter(x, z, s=size, c=np.log10(np.maximum(m, 1e-300)), cmap="viridis", zorder=2)
    ax.invert_yaxis()
    ax.set_xticks([])
    ax.set_ylabel("z")
    ax.set_title(f"merger tree ({m.size} halos; marker area ~ mass"
                 + (f" [{mass_unit}])" if mass_unit else ")"))
    if path is not None:
        ax.figure.savefig(os.fspath(path), dpi=100, bbox_inches="tight")
    return ax
