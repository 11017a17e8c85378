"""Perturbed lattice in a periodic box (a glass-free, shot-noise-free test load)."""

from __future__ import annotations

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import resolve_precision
from ..core.checks import check_positive, check_positive_int, check_seed
from ..store.validation import wrap_into_box
from .blocks import generate
from .parameters import LATTICE_AMPLITUDE_DEFAULT, SEED_DEFAULT

LATTICE_UNITS = {"length": "box units", "velocity": "box units", "mass": "total mass 1"}


def lattice_sites(first: int, size: int, n_side: int, cell: float) -> np.ndarray:
    """(size, 3) float64 cell centres ``(i + 0.5) * cell`` of ids ``first .. first+size-1``.

    The id of grid site ``(i, j, k)`` (i along x) is ``(i * n_side + j) * n_side + k``.
    """
    ids = np.arange(first, first + size, dtype=np.int64)
    i, rest = np.divmod(ids, n_side * n_side)
    j, k = np.divmod(rest, n_side)
    return (np.stack([i, j, k], axis=1) + 0.5) * cell


def _lattice_block(rng, first, size, *, n_side, box_size, amplitude, dtype):
    cell = box_size / n_side
    offsets = rng.uniform(-amplitude, amplitude, size=(size, 3)) * cell
    pos = wrap_into_box(lattice_sites(first, size, n_side, cell) + offsets, box_size, dtype)
    return (pos,)


def perturbed_lattice(n_side: int, *, box_size: float, amplitude: float = LATTICE_AMPLITUDE_DEFAULT,
                      seed: int = SEED_DEFAULT,
                      precision=None, chunks: int | None = None):
    """Cubic lattice of ``n_side^3`` particles with uniform random offsets, in a periodic box.

    Particle ``(i, j, k)`` sits at the cell centre ``((i, j, k) + 0.5) * box_size / n_side``
    plus an offset drawn uniformly in ``[-amplitude, amplitude]`` cells on each
    axis independently, wrapped into ``[0, box_size)`` (no coordinate equals
    ``box_size`` after rounding to the output precision). No velocities.

    Parameters
    ----------
    n_side : int
        Particles per side, >= 1 (N = n_side^3).
    box_size : float
        Side of the periodic box (box units), > 0.
    amplitude : float
        Maximum offset per axis in units of the lattice spacing, >= 0.
    seed : int
        Non-negative seed; the realisation does not depend on ``chunks``.
    precision : {"float32", "float64"}, optional
        Dtype of pos (default: dask config ``cosmo_dask.precision``).
    chunks : int, optional
        Particles per dask chunk (default: ``default_chunk_size()``).

    Returns
    -------
    Snapshot
        Periodic (``box_size``), ``pos`` (N, 3), no ``vel``, ids on the Lagrangian
        grid ``id = (i*n_side + j)*n_side + k`` (int64, equal to ``arange(N)``),
        ``lagrangian_shape = (n_side,)*3``, ``particle_mass = 1/N`` (total mass 1).
    """
    from ..store.snapshot import Snapshot

    n_side = check_positive_int(n_side, "n_side")
    box_size = check_positive(box_size, "box_size")
    amplitude = check_positive(amplitude, "amplitude", allow_zero=True)
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    n = n_side**3
    token = tokenize("lattice", n_side, box_size, amplitude, seed, dtype.name, chunks)
    arrays = generate("lattice", token, _lattice_block, n=n, seed=seed, chunks=chunks,
                      outputs=[("pos", (3,), dtype)], n_side=n_side, box_size=box_size,
                      amplitude=amplitude, dtype=dtype)
    ids = da.arange(n, chunks=arrays["pos"].chunks[0], dtype=np.int64)
    return Snapshot.from_arrays(
        arrays["pos"], None, ids, None, box_size=box_size, particle_mass=1.0 / n,
        lagrangian_shape=(n_side, n_side, n_side), units=dict(LATTICE_UNITS),
    )
