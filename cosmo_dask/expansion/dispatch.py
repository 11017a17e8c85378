"""The expansion kernels' contracts: one :class:`~cosmo_dask.core.dispatch.KernelDispatch` per
computation, chosen by the type of the chunk it is given.

The CPU kernels (numba, :mod:`.scf_kernels`, :mod:`.mex_kernels`) are registered here for
``numpy.ndarray``; the GPU kernels (CUDA via CuPy, :mod:`.scf_kernels_gpu`,
:mod:`.mex_kernels_gpu`) are named and imported on the first CuPy chunk. Both take the
same arguments in the same order, the chunk first, and return NumPy or CuPy arrays
following it. The graph code (:mod:`.scf`, :mod:`.mex`) calls these objects and is the
only caller; this is the only module of the package that names a ``*_gpu`` module.

Adding a GPU kernel: write it in ``<name>_gpu.py`` with the CPU kernel's signature and
results, name it here with ``gpu="cosmo_dask.expansion.<name>_gpu:<function>"``, and add
its backend to the contract's test in ``tests/expansion/test_kernel_contracts.py``.
"""

from __future__ import annotations

from ..core.dispatch import KernelDispatch
from . import mex_kernels, scf_kernels

__all__ = ["mex_evaluate", "mex_terms_scan", "scf_coefficient_sums", "scf_evaluate"]

#: ``(pos (N, 3), mass (N,), nmax, lmax, r_s) -> float64 (4 (nmax+1) (lmax+1)^2 + 2,)``:
#: one chunk's SCF coefficient sums, their squares, mass sum and count
#: (:func:`~cosmo_dask.expansion.scf_kernels.pack_sums`)
scf_coefficient_sums = KernelDispatch(
    "scf_coefficient_sums", scf_kernels.scf_coefficient_sums,
    gpu="cosmo_dask.expansion.scf_kernels_gpu:scf_coefficient_sums_gpu")

#: ``(pos (N, 3), S, T, r_s, GM, what) -> (N,) or (N, 3)`` in pos's dtype: the potential,
#: acceleration or density of an SCF expansion (``what``) at the points
scf_evaluate = KernelDispatch(
    "scf_evaluate", scf_kernels.scf_evaluate,
    gpu="cosmo_dask.expansion.scf_kernels_gpu:scf_evaluate_gpu")

#: ``(pos (n, 3), mass (n,), lmax, eps2, dtype=None) -> (Q, P)``, each ``(n + 1, (lmax+1)^2)``:
#: the inner and outer cumulative multipole sums of radius-sorted particles
mex_terms_scan = KernelDispatch(
    "mex_terms_scan", mex_kernels.terms_scan,
    gpu="cosmo_dask.expansion.mex_kernels_gpu:terms_scan_gpu")

#: ``(pos (n, 3), Q, P, iq (n,), ip (n,), lmax, eps2) -> (acc (n, 3), phi (n,))``: MEX
#: accelerations and potentials at points from the sums rows ``iq`` (inner), ``ip`` (outer)
mex_evaluate = KernelDispatch(
    "mex_evaluate", mex_kernels.evaluate,
    gpu="cosmo_dask.expansion.mex_kernels_gpu:evaluate_gpu")
