"""The integrator's per-chunk updates on the CPU (NumPy): the kick ``p + f g`` and the
drift ``x + f p`` wrapped into the box. Their contracts are
:data:`cosmo_dask.simulation.dispatch.kick_block` and
:data:`~cosmo_dask.simulation.dispatch.drift_block`; the GPU twins
(:mod:`.integrator_kernels_gpu`) give the same values bit for bit.

Units: the integrator's (:mod:`cosmo_dask.simulation.integrator`): comoving positions in
the snapshot's length unit, momenta ``p = a^2 dx/dt``, accelerations as the force
returns them; the factors carry the time integrals.
"""

from __future__ import annotations

import numpy as np

from ..store.validation import wrap_into_box

__all__ = ["drift_block", "kick_block"]


def kick_block(mom, acc, factor: float):
    """One chunk's kick, ``mom + acc * factor`` with ``factor`` in ``mom``'s dtype (NumPy's
    promotion: the result in the wider of ``mom``'s and ``acc``'s dtypes)."""
    return mom + acc * mom.dtype.type(factor)


def drift_block(pos, mom, factor: float, box: float, dtype):
    """One chunk's drift, ``pos + factor mom`` in float64 wrapped into ``[0, box)`` and
    cast to ``dtype`` (the light cone repeats it to find where a step ends)."""
    x = pos.astype(np.float64) + mom.astype(np.float64) * factor
    return wrap_into_box(x, box, dtype)
