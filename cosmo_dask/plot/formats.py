"""The file formats a figure can be saved in (checked by the ``cosmo-dask`` commands'
``--plot`` before any work)."""

from __future__ import annotations

__all__ = ["figure_formats"]


def figure_formats() -> list[str]:
    """The suffixes (without the dot, sorted) matplotlib can write a figure as."""
    from matplotlib.figure import Figure

    return sorted(Figure().canvas.get_supported_filetypes())
