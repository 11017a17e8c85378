"""Chunk-by-chunk generation of particle arrays, independent of the dask chunking.

Random numbers are drawn in fixed *generation blocks* of :data:`GEN_BLOCK`
particles: block ``b`` holds particles ``[b*GEN_BLOCK, (b+1)*GEN_BLOCK)`` and draws
from ``np.random.default_rng(np.random.SeedSequence([seed, b, tag]))``, where
``tag`` is a small constant per model (so that two models with the same seed
use unrelated streams). A dask chunk ``[start, stop)`` generates every block it
overlaps and keeps the rows it owns, so the values do not depend on the chunk
size, and no task ever holds more than one chunk plus one block. (The LPT
initial conditions draw their white noise per lattice plane instead, with the
same ``SeedSequence([seed, plane, tag])`` construction: see ``lpt_fields``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import dask.array as da
import numpy as np

from ..core.backend import default_chunk_size, large_store_rows
from ..core.checks import check_chunk_count, check_chunk_memory, check_positive_int
from ..core.task_graph import TaskGraph

#: particles per generation block (fixed: changing it changes every realisation)
GEN_BLOCK = 2**16

#: per-model stream tags mixed into the seed sequence
TAGS = {"plummer": 1, "hernquist": 2, "ferrers": 3, "lattice": 4, "zeldovich": 5, "blobs": 6}

BlockFn = Callable[..., tuple[np.ndarray, ...]]


# --------------------------------------------------------------------------- random streams
def block_rng(seed: int, block: int, tag: int) -> np.random.Generator:
    """The generator of generation block ``block`` of a model with stream ``tag``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(block), int(tag)]))


def uniform_open(rng: np.random.Generator, size) -> np.ndarray:
    """Uniform deviates in the open interval (0, 1) (53-bit, never 0 or 1)."""
    return (rng.integers(0, 2**53, size=size, dtype=np.int64) + 0.5) * 2.0**-53


def isotropic_directions(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 3) unit vectors uniformly distributed on the sphere."""
    cos_t = rng.uniform(-1.0, 1.0, n)
    phi = rng.uniform(0.0, 2.0 * np.pi, n)
    sin_t = np.sqrt(np.maximum(1.0 - cos_t * cos_t, 0.0))
    return np.stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t], axis=1)


# --------------------------------------------------------------------------- chunking
def chunk_lengths(n: int, chunks: int | None) -> tuple[int, ...]:
    """Lengths of the dask chunks along the particle axis: ``chunks`` rows, by default
    ``default_chunk_size()`` rows, or whole multiples of it for more than
    ``MAX_READ_CHUNKS`` (512) such chunks, as a store is read (2^24 rows at 2048^3)."""
    size = (large_store_rows(default_chunk_size(), n) if chunks is None
            else check_positive_int(chunks, "chunks"))
    check_chunk_count(n, size)  # before a task per chunk is made
    check_chunk_memory(size, 12, n)  # 12 bytes a row: float32 positions, the least
    full, rest = divmod(n, size)
    return (size,) * full + ((rest,) if rest else ())


def _generate_chunk(block_fn: BlockFn, n: int, tag: int, seed: int, start: int, stop: int,
                    kwargs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """Rows ``[start, stop)`` of every output of ``block_fn``, via whole generation blocks."""
    pieces: list[tuple[np.ndarray, ...]] = []
    for b in range(start // GEN_BLOCK, (stop - 1) // GEN_BLOCK + 1):
        b0 = b * GEN_BLOCK
        size = min(GEN_BLOCK, n - b0)
        out = block_fn(block_rng(seed, b, tag), b0, size, **kwargs)
        lo, hi = max(start, b0) - b0, min(stop, b0 + size) - b0
        pieces.append(tuple(o[lo:hi] for o in out))
    if len(pieces) == 1:
        return tuple(np.ascontiguousarray(o) for o in pieces[0])
    return tuple(np.concatenate(parts, axis=0) for parts in zip(*pieces, strict=True))


def generate(label: str, token: str, block_fn: BlockFn, *, n: int, seed: int, chunks: int | None,
             outputs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
             **kwargs: Any) -> dict[str, da.Array]:
    """Lazy arrays of ``n`` particles produced by ``block_fn`` one generation block at a time.

    Parameters
    ----------
    label, token : str
        Task names are ``"{label}-gen-{token}"`` (one task per chunk, returning a
        tuple) and ``"{label}-{output}-{token}"`` (the arrays).
    block_fn : callable
        ``block_fn(rng, first, size, **kwargs)`` returns a tuple of arrays with
        ``size`` rows for particles ``[first, first + size)``, one per output.
    n, seed, chunks : int
        Number of particles, seed, particles per dask chunk (None: default).
    outputs : sequence of (name, trailing shape, dtype)
        The arrays returned, in the order ``block_fn`` returns them.
    """
    lengths = chunk_lengths(n, chunks)
    gen_name = f"{label}-gen-{token}"
    tag = TAGS[label]
    g = TaskGraph()
    start = 0
    for i, length in enumerate(lengths):
        g.add((gen_name, i), partial(_generate_chunk, block_fn, n, tag, seed, start,
                                     start + length, kwargs))
        start += length
    arrays = g.item_arrays(
        [(gen_name, i) for i in range(len(lengths))], lengths,
        [(f"{label}-{out}-{token}", k, tuple(trailing), np.empty((0,) + tuple(trailing), dtype))
         for k, (out, trailing, dtype) in enumerate(outputs)])
    return {out: arr for (out, _, _), arr in zip(outputs, arrays, strict=True)}
