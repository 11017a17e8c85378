"""What an expansion is fitted to: positions about a centre, masses and G.

Shared by :mod:`~cosmo_dask.expansion.scf` and :mod:`~cosmo_dask.expansion.mex`.
Accepts a :class:`~cosmo_dask.Snapshot` or raw positions (NumPy, CuPy or dask
arrays, shape ``(N, 3)``) with masses, checks them and returns dask arrays
(chunks follow the input; NumPy or CuPy chunks alike) of the positions
relative to the centre.

Centres: ``"com"`` (mass-weighted mean, one reduction), an explicit point, or a
caller-supplied finder (the SCF module's ``"potential_min"``). Expansions need
an isolated system: a periodic snapshot is refused unless an explicit centre is
given, in which case positions are unwrapped to the minimum image about it.
"""

from __future__ import annotations

from dataclasses import dataclass

import dask.array as da
import numpy as np

from ..core.backend import (
    array_module,
    chunk_ranges,
    host,
    particle_rows,
    resolve_precision,
    value_ranges,
)
from ..core.errors import ParameterError
from ..core.progress import compute


@dataclass
class ExpansionInput:
    """Positions relative to ``center`` (dask, (N, 3), the working precision), masses
    (dask, (N,), same dtype), the centre (host float64 (3,)), G and the source name."""

    pos: da.Array
    mass: da.Array
    center: np.ndarray
    G: float
    source: str | None
    #: ``(table,)``, the lazy per-chunk ranges of the positions and the masses
    #: (:func:`~cosmo_dask.core.backend.chunk_ranges`), when the checks were deferred
    #: (``defer_checks=True``): compute it with the first pass over the data and hand
    #: the value to :meth:`verify`; empty when already checked
    checks: tuple = ()
    what: str = "expansion"

    @property
    def n_particles(self) -> int:
        return int(self.pos.shape[0])

    def verify(self, values) -> None:
        """Raise ``ParameterError`` unless the computed ``checks`` values pass."""
        _verify(self.what, *values)


def _verify(what, table) -> None:
    """Raise ``ParameterError`` unless the computed ranges table of positions and masses
    (:func:`~cosmo_dask.core.backend.chunk_ranges`) passes; one copy to the host."""
    (p_min, p_max), (m_min, m_max) = value_ranges(table)
    if not (np.isfinite(m_min) and np.isfinite(m_max) and m_min > 0):
        raise ParameterError(f"{what}: masses must be positive and finite (smallest "
                             f"{m_min:g}, largest {m_max:g})")
    if not (np.isfinite(p_min) and np.isfinite(p_max)):  # NaN, inf reach the min or max
        raise ParameterError(f"{what}: positions contain non-finite values")


def expansion_input(snap_or_pos, mass=None, *, center="com", G=None, precision="float64",
                    what: str = "expansion", defer_checks: bool = False) -> ExpansionInput:
    """Check and prepare the particles an expansion is fitted to.

    Parameters
    ----------
    snap_or_pos : Snapshot or array (N, 3)
    mass : array (N,) or float, optional
        Required with raw positions (a float is every particle's mass); with a
        snapshot, its ``mass`` array or ``particle_mass``.
    center : "com", array of 3 floats, or callable
        A callable gets ``(pos, mass)`` (dask, box-frame) and returns 3 floats.
    G : float, optional
        Default: the snapshot's ``G`` attribute, else 1.
    precision : "float64" or "float32"
    defer_checks : bool
        With an explicit centre, do not read the data here: the mass and
        finiteness checks come back lazily in ``checks``, to be computed with
        the caller's first pass (saves one pass over the data) and passed to
        :meth:`ExpansionInput.verify`. Other centres need a pass anyway.

    Raises
    ------
    ParameterError
        No particles, wrong shapes, masses not all positive and finite,
        positions not finite, a periodic snapshot without an explicit centre,
        an invalid centre or precision.
    """
    from ..store.snapshot import Snapshot

    dtype = resolve_precision(precision)
    box = None
    source = None
    if isinstance(snap_or_pos, Snapshot):
        snap = snap_or_pos
        source = snap.source
        pos = snap.pos
        m = snap.particle_masses() if mass is None else mass
        box = snap.box_size
        G = snap.G if G is None else G
    else:
        pos = snap_or_pos
        m = mass
        if m is None:
            raise ParameterError(f"{what}: raw positions need masses: pass mass= (an array "
                                 "of N masses or one mass for every particle)")
    pos, m, n = particle_rows(pos, m, what)
    if not isinstance(m, da.Array):  # one mass for all, in chunks of the positions' kind
        m = pos[:, 0].map_blocks(_filled, m, dtype=np.float64,
                                 meta=array_module(pos).empty((0,), dtype=np.float64))
    G = 1.0 if G is None else float(G)
    if not (np.isfinite(G) and G > 0):
        raise ParameterError(f"{what}: G must be a positive number, got {G!r}")

    explicit = not (isinstance(center, str) or callable(center))
    if box is not None and not explicit:
        raise ParameterError(
            f"{what}: {source or 'the snapshot'} is a periodic box (box_size={box:g}); an "
            "expansion needs an isolated system. Pass center=(x, y, z) to expand about that "
            "point with positions unwrapped to the nearest periodic image")
    pos = pos.astype(np.float64)
    m64 = m.astype(np.float64)
    lazy = chunk_ranges(pos, m64)  # the checks: one task per chunk, not three reductions
    checks = ()
    if explicit and defer_checks:
        checks = (lazy,)
    else:
        table, m_tot, mx = compute(lazy, m64.sum(), (pos * m64[:, None]).sum(axis=0),
                                   label=None)
        _verify(what, table)

    if isinstance(center, str):
        if center != "com":
            raise ParameterError(f"{what}: center must be 'com', a point (x, y, z) or a "
                                 f"finder, got {center!r}")
        c = np.asarray(host(mx), dtype=np.float64) / float(m_tot)
    elif callable(center):
        c = np.asarray(center(pos, m64), dtype=np.float64)
    else:
        c = np.asarray(center, dtype=np.float64)
    if c.shape != (3,) or not np.all(np.isfinite(c)):
        raise ParameterError(f"{what}: center must be 3 finite numbers, got {center!r}")

    rel = pos.map_blocks(_shift, c, dtype=pos.dtype, meta=pos._meta)  # c to the chunks'
    # module; meta given: no trial call of _shift on an empty chunk
    if box is not None:  # explicit centre in a periodic box: minimum image about it
        rel = rel - box * da.round(rel / box)
    return ExpansionInput(rel.astype(dtype), m64.astype(dtype), c, G, source, checks, what)


def _shift(block, c):
    return block - array_module(block).asarray(c)


def _filled(block, value):
    return array_module(block).full(block.shape[0], value, dtype=np.float64)


