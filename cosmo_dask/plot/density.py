"""Density images: a slice of a :class:`~cosmo_dask.density.octree_model.DensityOctree`
(:func:`plot_slice`: log10 density sampled on a plane, with the leaf edges) and a slab of
a mesh (:func:`plot_mesh_slice`)."""

from __future__ import annotations

import numpy as np

from ..core.backend import host
from ..core.errors import ParameterError


def plot_slice(tree, *, axis: int = 2, position: float | None = None,
               resolution: int | None = None, leaf_edges: bool = True, path=None, ax=None):
    """Image of log10 density on the plane ``x[axis] = position``.

    Parameters
    ----------
    axis : {0, 1, 2}
        Normal of the plane.
    position : float, optional
        Coordinate of the plane; default the root's centre. Wrapped into
        the box for periodic trees; must lie in the root otherwise.
    resolution : int, optional
        Pixels per side; default the finest leaf-cell resolution
        (:attr:`effective_resolution`) capped at 1024.
    leaf_edges : bool
        Draw the boundaries of the leaves cut by the plane (skipped above
        20000 of them).
    path : str or path-like, optional
        Save the figure there (an Agg figure outside pyplot when no window can open).
    ax : matplotlib Axes, optional
        Draw into it instead of a new figure.

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib

    if axis not in (0, 1, 2) or isinstance(axis, bool):
        raise ParameterError(f"DensityOctree.plot_slice: axis must be 0, 1 or 2, got {axis!r}")
    lo, size = tree.root_lo, tree.root_size
    if position is None:
        position = float(lo[axis] + 0.5 * size)
    position = float(position)
    if tree.box_size is not None:
        position = position % tree.box_size
    if not (lo[axis] <= position <= lo[axis] + size) or (
            tree.box_size is not None and position >= lo[axis] + size):
        raise ParameterError(f"DensityOctree.plot_slice: position {position} is outside "
                             f"the root [{lo[axis]}, {lo[axis] + size}) along axis {axis}")
    if resolution is None:
        resolution = min(tree.effective_resolution, 1024)
    if isinstance(resolution, bool) or not isinstance(resolution, (int, np.integer)) \
            or resolution <= 0:
        raise ParameterError(f"DensityOctree.plot_slice: resolution must be a positive "
                             f"integer, got {resolution!r}")
    res = int(resolution)
    from matplotlib.collections import LineCollection

    from .figure import new_axes

    a, b = [d for d in range(3) if d != axis]
    centres = (np.arange(res) + 0.5) / res * size
    pts = np.empty((res, res, 3))
    pts[..., axis] = position
    pts[..., a] = lo[a] + centres[:, None]
    pts[..., b] = lo[b] + centres[None, :]
    dens = tree.sample(pts.reshape(-1, 3)).reshape(res, res)
    with np.errstate(divide="ignore", invalid="ignore"):
        image = np.where(dens > 0, np.log10(np.where(dens > 0, dens, 1.0)), np.nan)
    ax = new_axes(ax, path, (5.5, 4.5))
    fig = ax.figure
    cmap = matplotlib.colormaps["magma"].with_extremes(bad="black")
    extent = (lo[a], lo[a] + size, lo[b], lo[b] + size)
    shown = ax.imshow(image.T, origin="lower", extent=extent, cmap=cmap,
                      interpolation="nearest")
    fig.colorbar(shown, ax=ax, label="log10 density")
    leaf_lo, leaf_size = tree.leaf_lo, tree.leaf_size
    cut = (leaf_lo[:, axis] <= position) & (position < leaf_lo[:, axis] + leaf_size)
    if tree.box_size is None and position == lo[axis] + size:
        cut = leaf_lo[:, axis] + leaf_size >= position
    ids = np.flatnonzero(cut)
    if leaf_edges and 0 < ids.size <= 20000:
        x0, y0 = leaf_lo[ids, a], leaf_lo[ids, b]
        x1, y1 = x0 + leaf_size[ids], y0 + leaf_size[ids]
        segs = np.stack([np.stack([np.column_stack([x0, y0]), np.column_stack([x1, y0])], 1),
                         np.stack([np.column_stack([x0, y0]), np.column_stack([x0, y1])], 1)],
                        1).reshape(-1, 2, 2)
        ax.add_collection(LineCollection(segs, colors="white", linewidths=0.4, alpha=0.45))
        ax.set_xlim(extent[0], extent[1])
        ax.set_ylim(extent[2], extent[3])
    names = "xyz"
    ax.set_xlabel(names[a])
    ax.set_ylabel(names[b])
    levs = tree.level[ids] if ids.size else tree.level
    ax.set_title(f"{names[axis]} = {position:.4g}: {ids.size} leaves, levels "
                 f"{int(levs.min())}-{int(levs.max())}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_mesh_slice(mesh, box_size: float, *, axis: int = 2, index: int | None = None,
                    thickness: int = 1, path=None, ax=None):
    """Log-density image of a slab of a mesh (mass per cell), e.g. from :func:`open_mesh`.

    ``thickness`` cells along ``axis`` starting at ``index`` (default: the middle) are
    summed; the image is ``log10(1 + delta)`` of the slab. Returns the figure.
    """
    from .figure import new_axes

    n = int(mesh.shape[axis])
    start = n // 2 if index is None else int(index)
    sel = [slice(None)] * 3
    sel[axis] = slice(start, start + max(1, int(thickness)))
    slab = mesh[tuple(sel)].sum(axis=axis)
    slab = np.asarray(host(slab.compute() if hasattr(slab, "compute") else slab), np.float64)
    mean = slab.mean()
    image = np.log10(np.maximum(slab / mean, 1e-3)) if mean > 0 else slab
    ax = new_axes(ax, path, (5.5, 4.5))
    fig = ax.figure
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
