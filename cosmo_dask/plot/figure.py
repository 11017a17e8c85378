"""New axes for every figure of the package: drawn with the Agg canvas, leaving pyplot's
state alone, when the figure is only saved and no window can open; pyplot's otherwise."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["has_display", "new_axes"]


def has_display() -> bool:
    """Whether a window can open (Windows, macOS, or an X11/Wayland display)."""
    if sys.platform.startswith(("win", "darwin")):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def new_axes(ax: Any = None, path: str | os.PathLike | None = None,
             figsize: tuple[float, float] = (6.0, 4.5)):
    """``ax``, or the axes of a new ``figsize`` figure (inches): an Agg figure outside
    pyplot when saving to ``path`` without a display, a pyplot figure otherwise."""
    if ax is not None:
        return ax
    if path is not None and not has_display():
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        return fig.add_subplot()
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax
