"""The figure of a power spectrum (:func:`plot_power_spectrum`, public as
:func:`cosmo_dask.analysis.plot_power_spectrum`)."""

from __future__ import annotations

import numpy as np


def plot_power_spectrum(ds, path=None, *, ax=None, reference=None, label=None):
    """Log-log plot of ``ds.power`` (and multipoles) with the shot-noise level.

    Parameters
    ----------
    ds : xarray.Dataset
        From :func:`~cosmo_dask.analysis.power.power_spectrum`.
    path : str or path, optional
        Save the figure there (format from the suffix).
    ax : matplotlib Axes, optional
    reference : callable, optional
        ``P(k)`` to overplot (e.g. ``lambda k: cosmo.power_spectrum(k) * D**2``).
    label : str, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .figure import new_axes

    ax = new_axes(ax, path, (6.0, 4.5))
    fig = ax.figure
    k = ds["k"].values
    good = ds["n_modes"].values > 0
    ax.loglog(k[good], ds["power"].values[good], label=label or "P(k)")
    if "multipoles" in ds:
        for ell in ds["ell"].values:
            if ell == 0:
                continue
            p = ds["multipoles"].sel(ell=ell).values
            ax.loglog(k[good], np.abs(p[good]), ls="--", label=f"|P_{ell}(k)|")
    sn = float(ds["shot_noise"])
    if np.isfinite(sn):
        ax.axhline(sn, color="0.5", ls=":", label="shot noise")
    if reference is not None:
        ax.loglog(k[good], reference(k[good]), color="k", lw=0.8,
                  label=getattr(reference, "label", "reference"))
    ax.axvline(float(ds.attrs["k_nyquist"]), color="0.7", lw=0.8)
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap
    ax.set_xlabel(f"k [{ds['k'].attrs.get('units', '1 / box length')}]")
    ax.set_ylabel(f"P(k) [{ds['power'].attrs.get('units', 'box length^3')}]")
    ax.legend(frameon=False)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
