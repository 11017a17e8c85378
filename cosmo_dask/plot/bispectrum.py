"""The figure of a reduced bispectrum (:func:`plot_reduced_bispectrum`, public as
:func:`cosmo_dask.analysis.plot_reduced_bispectrum`): ``Q`` against the angle between
``k1`` and ``k2``, one curve per ``(k1, k2)`` bin pair."""

from __future__ import annotations

import numpy as np


def triangle_angle(k1, k2, k3):
    """The angle ``theta_12`` between ``k1`` and ``k2`` of a closed triangle
    ``k1 + k2 + k3 = 0`` of these sides: ``cos theta = (k3^2 - k1^2 - k2^2) / (2 k1 k2)``
    (radians, clipped to ``[0, pi]``)."""
    k1, k2, k3 = (np.asarray(k, dtype=np.float64) for k in (k1, k2, k3))
    c = (k3 * k3 - k1 * k1 - k2 * k2) / (2 * k1 * k2)
    return np.arccos(np.clip(c, -1.0, 1.0))


def plot_reduced_bispectrum(ds, path=None, *, ax=None, reference=None, pairs=None,
                            max_pairs: int = 6):
    """``Q`` (with its Gaussian error bars) against ``theta_12 / pi`` for bin pairs.

    Parameters
    ----------
    ds : xarray.Dataset
        From :func:`~cosmo_dask.analysis.bispectrum.bispectrum`.
    path : str or path, optional
        Save the figure there (format from the suffix).
    ax : matplotlib Axes, optional
    reference : xarray.Dataset, optional
        From :func:`~cosmo_dask.analysis.bispectrum.tree_level_bispectrum`: its
        ``reduced_tree`` is drawn dashed in the same colours.
    pairs : sequence of (int, int), optional
        The ``(bin1, bin2)`` pairs to draw; default the pairs with the most triangle
        bins, at most ``max_pairs``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .figure import new_axes

    ax = new_axes(ax, path, (6.0, 4.5))
    fig = ax.figure
    b1, b2 = ds["bin1"].values, ds["bin2"].values
    theta = triangle_angle(ds["k1"].values, ds["k2"].values, ds["k3"].values) / np.pi
    if pairs is None:
        keys, counts = np.unique(np.stack([b1, b2], 1), axis=0, return_counts=True)
        order = np.argsort(-counts, kind="stable")[:max_pairs]
        pairs = [tuple(int(v) for v in keys[o]) for o in sorted(order)]
    unit = ds["k"].attrs.get("units", "")
    kk = ds["k"].values
    for i, j in pairs:
        sel = np.flatnonzero((b1 == i) & (b2 == j))
        if sel.size == 0:
            continue
        sel = sel[np.argsort(theta[sel])]
        line = ax.errorbar(theta[sel], ds["reduced"].values[sel],
                           yerr=ds["reduced_error"].values[sel], marker="o", ms=3,
                           capsize=2, label=f"k1={kk[i]:.3g}, k2={kk[j]:.3g}")
        if reference is not None:
            ax.plot(theta[sel], reference["reduced_tree"].values[sel], ls="--",
                    color=line[0].get_color())
    if reference is not None:
        ax.plot([], [], ls="--", color="k", label="tree level")
    ax.set_xlabel("theta_12 / pi")
    ax.set_ylabel("Q(k1, k2, k3)" + (" (shot noise subtracted)"
                                     if ds.attrs.get("shot_noise_subtracted") else ""))
    ax.set_title(f"reduced bispectrum, k in {unit}", fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
