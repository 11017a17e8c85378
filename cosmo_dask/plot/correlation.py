"""The figure of a correlation function (:func:`plot_correlation_function`, public as
:func:`cosmo_dask.analysis.plot_correlation_function`)."""

from __future__ import annotations

import numpy as np


def plot_correlation_function(ds, path=None, *, ax=None, label=None):
    """``r^2 xi(r)`` against ``r`` (with ``mu`` bins: ``s^2 xi_l(s)`` of every multipole).

    Parameters
    ----------
    ds : xarray.Dataset
        From :func:`~cosmo_dask.analysis.correlation.correlation_function`.
    path : str or path, optional
        Save the figure there (format from the suffix).
    ax : matplotlib Axes, optional
    label : str, optional
        Label of the monopole's curve.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .figure import new_axes

    ax = new_axes(ax, path, (6.0, 4.5))
    fig = ax.figure
    r = ds["r"].values
    unit = ds["r"].attrs.get("units", "length")
    if "multipoles" in ds:
        for k, ell in enumerate(ds["ell"].values):
            ax.plot(r, r**2 * ds["multipoles"].values[k], marker=".",
                    label=label if (ell == 0 and label) else f"$\\ell = {int(ell)}$")
        ax.set_xlabel(f"s [{unit}]")
        ax.set_ylabel(f"s$^2$ $\\xi_\\ell$(s) [({unit})$^2$]")
    else:
        xi = ds["xi"].values
        ax.plot(r, r**2 * xi, marker=".", label=label or "$\\xi$(r)")
        ax.set_xlabel(f"r [{unit}]")
        ax.set_ylabel(f"r$^2$ $\\xi$(r) [({unit})$^2$]")
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_xlim(0, float(np.max(ds["r_max"].values)))
    ax.legend(frameon=False)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
