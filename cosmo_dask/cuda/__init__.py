"""CUDA device math shared by the package's RawModule / RawKernel sources.

The headers of this folder hold the device functions that more than one kernel source
needs, each written once:

* ``periodic.cuh``: ``cd_rint`` (float/double), the minimum image of a separation
  ``cd_min_image`` / ``cd_min_image_if`` (``d - box rint(d / box)``), and the wrap of a
  coordinate into ``[0, L)`` ``cd_wrap_box`` (``x - L floor(x / L)`` when outside);
* ``softening.cuh``: ``cd_rsqrt`` (float/double) and the pair factors of the softened
  potentials, ``a = -G m K r_vec``, ``phi = -G m P``: ``cd_inv_kp`` (Plummer, and the
  Newtonian part of the spline, from ``1 / sqrt(s2)``) and ``cd_spline_kp`` (the Gadget-2
  cubic spline inside its support);
* ``tet_clip.cuh``: the clip of a tetrahedron against a cube (``Tet``, ``tet_setup``,
  ``fast_volume``, ``slow_volume``, ``clip_volume``) of the GPU tetrahedron-cube volumes
  and of the per-cell clip deposits kept for comparison in ``benchmarks/``; the including
  source typedefs ``real``.

A kernel source includes what it needs (``#include "periodic.cuh"``) and is compiled with
:func:`include_options` among its NVRTC options. The numba twins of the softening
functions are :mod:`cosmo_dask.gravity.softening_kernels`; the truncated TreePM factors
stay in :mod:`cosmo_dask.gravity.truncated` (its ``CUDA_SOURCE`` / ``CUDA_FIT_SOURCE``,
generated from its fit coefficients).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["HEADER_DIR", "HEADERS", "include_options", "header_text"]

#: the folder holding the ``.cuh`` headers (installed with the package)
HEADER_DIR = Path(__file__).resolve().parent
#: the shared headers
HEADERS = ("periodic.cuh", "softening.cuh", "tet_clip.cuh")


def header_text(name: str) -> str:
    """The text of one shared header (``name`` one of :data:`HEADERS`)."""
    if name not in HEADERS:
        from ..errors import ParameterError

        raise ParameterError(f"name must be one of {HEADERS}, got {name!r}")
    return (HEADER_DIR / name).read_text()


@functools.cache
def include_options() -> tuple[str, ...]:
    """NVRTC options that make the shared headers includable: ``-I<HEADER_DIR>`` and a
    define carrying a digest of the headers' text.

    CuPy's kernel cache keys a module by its source and options, not by the files it
    includes; the digest makes an edited header compile afresh instead of reusing a
    stale cached binary.
    """
    digest = hashlib.sha256("".join(header_text(h) for h in HEADERS).encode()).hexdigest()
    return (f"-I{HEADER_DIR}", f"-DCOSMO_DASK_CUDA_HEADERS=0x{digest[:12]}")
