"""TreePM gravity: periodic PM long range + truncated octree short range, as a Dask graph.

The Newtonian periodic force is split with a Gaussian of scale ``rs``
(Bagla 2002; Springel 2005): the mesh carries the long-range part
``exp(-k^2 rs^2)`` (:mod:`~cosmo_dask.gravity.pm`) and the octree the
short-range pair force ``-G m r/r^3 T(x)``, ``T(x) = erfc(x) + (2x/sqrt(pi))
exp(-x^2)``, ``x = r / (2 rs)``, with potential factor ``erfc(x)``, summed with
the periodic minimum image over the pairs closer than ``r_cut`` (the gravity
conventions of ``docs/gravity.md``).

Defaults and their reasons: ``rs = 1.2 L / n_mesh`` (the mesh force is accurate
to about 1 % at ``r ~ rs`` with CIC, see ``tests/gravity/test_pm.py``, and the
Gaussian leaves ``< 1e-6`` of the power at the Nyquist frequency, so the
mesh's aliasing is suppressed); ``r_cut = 4.5 rs`` (5.4 mesh cells; PhotoNs-GPU
uses about 6 cells): there ``T = 1.8e-2`` and ``erfc = 1.5e-3``, i.e. a pair at
the cut-off loses 1.8 % of its short-range force, but such pairs are many and
their missing forces largely cancel (``r_cut = 6 rs`` lowered the median error
of a 4096-particle random set only from 1.3e-3 to 1.0e-3). Measured median
relative force error against Ewald at the defaults (``tests/gravity/test_treepm.py``,
CPU octree, theta = 0.5): 1.6e-3 on a 16^3 Zel'dovich set, 8e-4 on a clumpy set;
the PM (CIC, interlaced) dominates it.
``r_cut`` may go up to ``6 rs`` (the end of the truncated-kernel table) and
``L / 2`` (so the minimum image is the only image within the cut).

Graph: the PM part is the ``gravity-pm-*`` graph of :mod:`~cosmo_dask.gravity.pm`
(the mesh path: deposit per slab, distributed FFT, interpolation per slab and
chunk; the slab count is the mesh path's default or ``cosmo_dask.mesh_slabs``). The short
range is the tree graph of :mod:`~cosmo_dask.gravity.tree.graph` with the
truncated kernel: particles split among domains, each domain's tree walked by
its own groups and, through locally essential trees cut at ``r_cut``, by the
neighbouring domains' groups (on one GPU: the GPU tree on one domain).

Potential: ``phi = phi_PM + phi_short + M_tot C`` with ``C`` from
:func:`background_constant` (``4 pi G rs^2 / L^3`` for ``r_cut -> inf``): the
cell average of the truncated short-range kernel ``G erfc(r / 2 rs) / r``
(``r < r_cut``), which the zero-mean periodic potential must not carry, so
``phi`` approximates the Ewald potential with zero-mean kernel (each particle's own
images included, the self pair excluded; see ``tests/support/ewald_reference.py``).
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np

from ..core.backend import resolve_precision
from ..core.errors import ParameterError
from .parameters import (
    KERNELS,
    R_CUT_MAX_SPLITS,
    R_CUT_SPLITS,
    R_SPLIT_CELLS,
    THETA_DEFAULT,
    TREEPM_MAX_GROUP,
    TREEPM_MAX_LEAF,
    check_theta,
)
from .pm import _check_number, check_box_size, check_n_mesh, checked_particles, long_range
from .tree.graph import tree_accelerations

__all__ = ["treepm_accelerations", "background_constant", "R_SPLIT_CELLS", "R_CUT_SPLITS",
           "R_CUT_MAX_SPLITS"]

def background_constant(G: float, rs: float, r_cut: float, box_size: float) -> float:
    """Cell mean of the truncated short-range potential kernel per unit mass, times G.

    ``(4 pi G / L^3) int_0^r_cut r erfc(r / 2 rs) dr = (16 pi G rs^2 / L^3) I(X)``,
    ``X = r_cut / (2 rs)``, ``I(X) = X^2 erfc(X) / 2 + erf(X) / 4 - X exp(-X^2) / (2 sqrt(pi))``
    (``I -> 1/4`` for ``r_cut -> inf``). Adding ``M_tot`` times this to the
    potential makes the kernel's cell average zero, as the mesh part's is.
    """
    x = r_cut / (2.0 * rs)
    integral = (0.5 * x * x * math.erfc(x) + 0.25 * math.erf(x)
                - x * math.exp(-x * x) / (2.0 * math.sqrt(math.pi)))
    return 16.0 * math.pi * G * rs * rs / box_size**3 * integral


def treepm_accelerations(pos, mass, *, G: float, box_size: float, n_mesh: int,
                         r_split: float | None = None, r_cut: float | None = None,
                         theta: float = THETA_DEFAULT, softening: float = 0.0,
                         softening_kernel: str = "plummer", precision: str = "float64",
                         potential: bool = True, placed: bool = False):
    """Periodic TreePM accelerations and potentials.

    Parameters
    ----------
    pos : (N, 3) dask array (or NumPy/CuPy array)
        Positions in ``[0, box_size)`` (length units).
    mass : (N,) dask array or float
        Masses (mass units), or one mass for all.
    G : float
        Gravitational constant, > 0.
    box_size : float
        Side of the periodic cube (length units). ``None`` raises.
    n_mesh : int
        PM mesh cells per side (1..4096, prime factors 2, 3, 5, 7).
    r_split : float, optional
        Split scale ``rs`` (length units, > 0); default ``1.2 box_size / n_mesh``.
    r_cut : float, optional
        Short-range cut-off (length units); default ``min(4.5 rs, box_size / 2)``;
        at most ``min(6 rs, box_size / 2)``.
    theta : float
        Opening angle of the short-range tree walk, in (0, 1.5).
    softening : float
        Plummer-equivalent softening length (>= 0), applied to the short range.
    softening_kernel : {"plummer", "spline"}
    precision : {"float32", "float64"}
    potential : bool
    placed : bool
        ``pos`` is kept by the short range's domains (see
        :func:`~cosmo_dask.gravity.tree.graph.tree_accelerations`): each domain's tree
        tasks run on the worker holding its rows.

    Returns
    -------
    acc : (N, 3) dask array
        Accelerations (length / time^2), input order and row chunks.
    pot : (N,) dask array or None
        Specific potential (length^2 / time^2), zero-mean periodic kernel (see
        the module docstring).

    Raises
    ------
    ParameterError
        Bad parameters (named), isolated input (``box_size=None``), a mesh
        that does not fit the workers' memory; at compute time a position
        outside the box.

    Notes
    -----
    The short range is distributed over domains; the PM part over slabs and
    chunks.
    """
    what = "treepm_accelerations"
    box = check_box_size(box_size, what)
    n = check_n_mesh(n_mesh, what)
    G = _check_number(G, "G", what, allow_zero=False)
    rs = R_SPLIT_CELLS * box / n if r_split is None else \
        _check_number(r_split, "r_split", what, allow_zero=False)
    rc_max = min(R_CUT_MAX_SPLITS * rs, 0.5 * box)
    rc = min(R_CUT_SPLITS * rs, 0.5 * box) if r_cut is None else \
        _check_number(r_cut, "r_cut", what, allow_zero=False)
    if rc > rc_max * (1 + 1e-12):
        raise ParameterError(f"{what}: r_cut={rc:g} must be <= min(6 r_split, box_size/2) = "
                             f"{rc_max:g} (r_split={rs:g}, box_size={box:g})")
    theta = check_theta(theta, what)
    softening = _check_number(softening, "softening", what, allow_zero=True)
    if softening_kernel not in KERNELS:
        raise ParameterError(f"{what}: softening_kernel must be 'plummer' or 'spline', "
                             f"got {softening_kernel!r}")
    dtype = resolve_precision(precision)
    potential = bool(potential)
    pos, m, n_part = checked_particles(pos, mass, box, what)

    # long range: the PM graph
    long_part = long_range(pos, m, G=G, box_size=box, n_mesh=n, r_split=rs, dtype=dtype,
                           potential=potential, interlace=True)

    # short range: the tree graph (domains + locally essential trees), truncated kernel
    acc_s, pot_s = tree_accelerations(pos, m, G=G, theta=theta, softening=softening,
                                      softening_kernel=softening_kernel, precision=dtype.name,
                                      potential=potential, box_size=box, rs=rs, r_cut=rc,
                                      max_leaf=TREEPM_MAX_LEAF, max_group=TREEPM_MAX_GROUP,
                                      placed=placed)
    acc = long_part[:, :3] + acc_s
    if not potential:
        return acc, None
    m_total = m.sum(dtype=np.float64) if isinstance(m, da.Array) else m * n_part
    const = background_constant(G, rs, rc, box) * m_total
    pot = long_part[:, 3] + pot_s + const
    return acc, pot.astype(dtype)
