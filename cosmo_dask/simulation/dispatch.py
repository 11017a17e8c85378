"""The simulation's kernel contracts: one :class:`~cosmo_dask.core.dispatch.KernelDispatch`
per per-chunk update of the integrator, chosen by the type of the chunk it is given (CPU:
:mod:`.integrator_kernels`; GPU: :mod:`.integrator_kernels_gpu`, imported on the first
CuPy chunk). This is the only module of the package that names a ``*_gpu`` module."""

from __future__ import annotations

from ..core.dispatch import KernelDispatch
from . import integrator_kernels

__all__ = ["drift_block", "kick_block"]

_GPU = "cosmo_dask.simulation.integrator_kernels_gpu:"

#: ``(mom, acc, factor) -> mom + acc * factor`` (``factor`` in mom's dtype), elementwise
kick_block = KernelDispatch("kick_block", integrator_kernels.kick_block,
                            gpu=_GPU + "kick_block_gpu")

#: ``(pos, mom, factor, box, dtype) -> pos + factor mom`` in float64 wrapped into
#: ``[0, box)`` and cast to ``dtype``, elementwise
drift_block = KernelDispatch("drift_block", integrator_kernels.drift_block,
                             gpu=_GPU + "drift_block_gpu")
