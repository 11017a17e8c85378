"""Direct-summation gravity as a Dask graph of block pairs (``method="direct"``).

Graph: with the particle rows in ``B`` chunks, one ``gravity-direct`` task per
(target chunk ``i``, source chunk ``j``) pair computes the pull of chunk ``j``
on chunk ``i`` (the contract :data:`cosmo_dask.gravity.dispatch.p2p_block`:
:func:`~cosmo_dask.gravity.p2p_kernels.p2p_block` on NumPy chunks,
:func:`~cosmo_dask.gravity.p2p_kernels_gpu.p2p_block_gpu` on CuPy chunks); the
``B`` partial results of target chunk ``i`` are summed by a fixed tree (fan-in 8,
``gravity-direct-sum`` tasks), so the summation order, and with it the result, does
not depend on scheduling. ``B**2`` pair tasks: choose chunks so that ``B`` stays
below a few hundred (a pair of 2**20-row chunks is ~1e12 interactions: about a second on one GPU,
hours on a CPU core; benchmarks/RESULTS.md, Gravity, part (a)).

Self pairs are excluded by index in the diagonal blocks; zero separations
with zero softening (coincident distinct particles) contribute nothing.
Nothing global is gathered: each pair task reads two chunks.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, resolve_precision
from ..core.errors import ParameterError
from ..core.task_graph import TaskGraph
from .dispatch import p2p_block
from .p2p_kernels import check_kernel_params

__all__ = ["direct_accelerations"]

_FANIN = 8


def _pair_task(tpos, spos, smass, same: bool, params: dict):
    """Partial (acc, pot) of one target chunk due to one source chunk."""
    return p2p_block(tpos, spos, smass, exclude="index" if same else "none", **params)


def _sum_parts(*parts):
    """Sum partial (acc, pot) tuples in the given (fixed) order."""
    acc = parts[0][0].copy()
    pot = None if parts[0][1] is None else parts[0][1].copy()
    for a, p in parts[1:]:
        acc += a
        if pot is not None:
            pot += p
    return acc, pot


def _check_pos(pos) -> da.Array:
    if not isinstance(pos, da.Array):
        if not hasattr(pos, "shape") or not hasattr(pos, "dtype"):
            raise ParameterError(f"pos must be an (N, 3) dask array, got {type(pos).__name__}")
        pos = da.from_array(pos, chunks=(max(int(pos.shape[0]), 1), 3),
                            asarray=array_module(pos) is np)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ParameterError(f"pos must have shape (N, 3), got {pos.shape}")
    if not np.issubdtype(pos.dtype, np.floating):
        raise ParameterError(f"pos must hold floating-point positions, got dtype {pos.dtype}")
    if any(np.isnan(c) for c in pos.chunks[0]):
        raise ParameterError("pos must have known row chunk sizes (call compute_chunk_sizes)")
    if len(pos.chunks[1]) != 1:
        pos = pos.rechunk({1: 3})
    return pos


def _check_mass(mass, pos: da.Array):
    if isinstance(mass, da.Array):
        if mass.shape != (pos.shape[0],):
            raise ParameterError(f"mass must have shape ({pos.shape[0]},), got {mass.shape}")
        if mass.chunks[0] != pos.chunks[0]:
            mass = mass.rechunk((pos.chunks[0],))
        return mass
    if np.ndim(mass) == 0 and not isinstance(mass, (bool, np.bool_)):
        try:
            m = float(mass)
        except (TypeError, ValueError):
            m = np.nan
        if np.isfinite(m):
            return m
    raise ParameterError(f"mass must be an (N,) dask array or one finite particle mass, "
                         f"got {mass!r}")


def direct_accelerations(pos, mass, *, G: float, softening: float = 0.0,
                         softening_kernel: str = "plummer", precision: str = "float64",
                         potential: bool = True, box_size: float | None = None,
                         rs: float | None = None, r_cut: float | None = None,
                         table_level: int | None = None):
    """Gravitational accelerations and potentials by direct summation over all pairs.

    ``a_i = -G sum_{j != i} m_j K(r_ij) (x_i - x_j)``,
    ``phi_i = -G sum_{j != i} m_j P(r_ij)`` (conventions of the gravity issue).

    Parameters
    ----------
    pos : dask.array.Array
        Positions, shape ``(N, 3)`` (length units), NumPy or CuPy chunks;
        the row chunks set the block pairs.
    mass : dask.array.Array or float
        Masses, shape ``(N,)`` (mass units), or the one particle mass.
    G : float
        Gravitational constant (length^3 / (mass time^2)).
    softening : float
        Softening length ``eps >= 0`` (length units); 0 is Newtonian.
    softening_kernel : {"plummer", "spline"}
        Plummer, or the Gadget-2 cubic spline of support ``2.8 eps``.
    precision : {"float32", "float64"}
        Pair arithmetic and output dtype (positions are taken relative to
        the target chunk's centre in float64 before the cast).
    potential : bool
        Also compute the specific potential.
    box_size : float, optional
        Periodic box side (length units): minimum-image pairs (no Ewald sum).
    rs, r_cut, table_level : optional
        Truncated short-range kernel (TreePM): split scale ``rs``, cutoff
        ``r_cut`` (default ``4.5 rs``), Taylor level 0..4 of the ``T``
        table (None = exact erfc). Extensions beyond the agreed signature.

    Returns
    -------
    acc : dask.array.Array
        ``(N, 3)`` accelerations (length / time^2), row chunks of ``pos``,
        dtype ``precision``, chunk type of ``pos``.
    pot : dask.array.Array or None
        ``(N,)`` potentials (length^2 / time^2), or None.

    Raises
    ------
    ParameterError
        Bad shapes or dtypes, negative softening, unknown kernel or
        precision, non-positive ``box_size``/``rs``/``r_cut``.
    """
    dtype = resolve_precision(precision)
    kp = check_kernel_params(G=G, softening=softening, softening_kernel=softening_kernel,
                             box_size=box_size, rs=rs, r_cut=r_cut, table_level=table_level)
    pos = _check_pos(pos)
    mass = _check_mass(mass, pos)
    params = dict(kp, precision=dtype.name, potential=bool(potential))

    token = tokenize(pos, mass, params)
    pair_name = f"gravity-direct-{token}"
    sum_name = f"gravity-direct-sum-{token}"
    nb = pos.numblocks[0]
    mass_is_array = isinstance(mass, da.Array)
    g = TaskGraph([pos] + ([mass] if mass_is_array else []))
    finals = []
    for i in range(nb):
        keys = []
        for j in range(nb):
            smass = g.chunk(mass, j) if mass_is_array else mass
            keys.append(g.add((pair_name, i, j), _pair_task, g.chunk(pos, i, 0),
                              g.chunk(pos, j, 0), smass, i == j, params))
        level = 0
        while len(keys) > 1:
            keys = [g.add((sum_name, i, level, k // _FANIN), _sum_parts, *keys[k:k + _FANIN])
                    for k in range(0, len(keys), _FANIN)]
            level += 1
        finals.append(keys[0].key)

    xp = array_module(pos)
    outputs = [(f"gravity-direct-acc-{token}", 0, (3,), xp.empty((0, 3), dtype=dtype))]
    if potential:
        outputs.append((f"gravity-direct-pot-{token}", 1, (), xp.empty((0,), dtype=dtype)))
    arrays = g.item_arrays(finals, pos.chunks[0], outputs)
    return arrays[0], (arrays[1] if potential else None)
