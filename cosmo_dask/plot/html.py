"""Text and HTML formatting of numbers, units and arrays for reprs (``Snapshot``,
``HaloResult``): rounding to significant digits, a value with its unit, an HTML table,
one table row describing a dask array. Formatting only: reads nothing, computes
nothing."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.backend import device_of

__all__ = ["array_row", "html_table", "signif", "with_unit"]


def signif(value: Any, digits: int = 4) -> str:
    """A number rounded to ``digits`` significant digits ("100", "0.3111", "2.108e+05")."""
    if value is None:
        return "None"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)
    if isinstance(value, (int, np.integer)) and abs(int(value)) < 10**digits:
        return str(int(value))
    return f"{float(value):.{digits}g}"


def with_unit(value: Any, unit: str | None, digits: int = 4) -> str:
    """``signif(value)`` followed by its unit ("100 Mpc/h"; "2108 × 1e10 Msun/h")."""
    text = signif(value, digits)
    if not unit:
        return text
    times = unit[:1].isdigit() or unit.startswith(("1e", "10^"))
    return f"{text} × {unit}" if times else f"{text} {unit}"


def html_table(rows, header=None) -> str:
    """An HTML table of already formatted cells (escaped here); ``header`` for column names."""
    from html import escape

    style = "text-align:left; padding:1px 8px 1px 0; vertical-align:top"
    out = ["<table style='border-collapse:collapse; margin:2px 0 6px 0'>"]
    if header:
        out.append("<tr>" + "".join(f"<th style='{style}'>{escape(str(h))}</th>"
                                    for h in header) + "</tr>")
    for row in rows:
        first, *rest = row
        out.append(f"<tr><th style='{style}'>{escape(str(first))}</th>" + "".join(
            f"<td style='{style}'>{escape(str(c))}</td>" for c in rest) + "</tr>")
    out.append("</table>")
    return "".join(out)


def array_row(name: str, arr, unit: str | None = None) -> tuple:
    """(name, shape, dtype, chunking, backend, size[, unit]) of a dask array, for a table."""
    chunks = getattr(arr, "chunks", None)
    if chunks:
        n_chunks = int(np.prod([len(c) for c in chunks]))
        chunking = f"{n_chunks} chunk{'s' * (n_chunks != 1)} of {tuple(arr.chunksize)}"
    else:
        chunking = "in memory"
    backend = "cupy" if device_of(arr) == "gpu" else "numpy"
    size = f"{arr.nbytes / 2**20:.3g} MiB"
    return (name, str(tuple(arr.shape)), str(arr.dtype), chunking, backend, size,
            unit or "")
