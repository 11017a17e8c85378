"""The public gravity API: :func:`accelerations` checks its input and dispatches to a method.

Every parameter is checked before any graph is built (:func:`check_parameters`
needs no particle data); the particle values (finite positions, positions inside
a periodic box, positive finite masses) are then checked by one small reduction
over the input before the method's graph is built. Bad input raises
:class:`~cosmo_dask.core.errors.ParameterError` naming the parameter.

The methods live in their own modules and are imported only when asked for:

========== ================================================ =====================================
method     module                                           what it computes
========== ================================================ =====================================
"direct"   :mod:`cosmo_dask.gravity.direct`                 all pairs, tiled block-pair tasks
"tree"     :mod:`cosmo_dask.gravity.tree.graph`             octree, group interaction lists
"pm"       :mod:`cosmo_dask.gravity.pm`                     periodic particle-mesh (FFT)
"treepm"   :mod:`cosmo_dask.gravity.treepm`                 PM long range + truncated tree
========== ================================================ =====================================
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np

from ..core.backend import (
    chunk_ranges,
    device_of,
    particle_rows,
    resolve_precision,
    to_device,
    value_ranges,
)
from ..core.checks import check_positive
from ..core.errors import ParameterError
from ..core.progress import compute
from ..units.products import input_units, product_units
from .parameters import (
    KERNELS,
    MAX_GROUP_DEFAULT,
    MAX_LEAF_DEFAULT,
    METHODS,
    MIN_N_MESH,
    PRECISION_DEFAULT,
    R_CUT_SPLITS,
    R_SPLIT_CELLS,
    SOFTENING_DEFAULT,
    THETA_DEFAULT,
    check_leaf_size,
    check_theta,
)

__all__ = ["accelerations", "check_parameters", "prepare", "GravityInput", "METHODS", "KERNELS",
           "default_n_mesh"]

#: method name (gravity.parameters.METHODS) -> (module in cosmo_dask.gravity, function name)
_IMPLEMENTATIONS = {
    "tree": ("tree.graph", "tree_accelerations"),
    "direct": ("direct", "direct_accelerations"),
    "pm": ("pm", "pm_accelerations"),
    "treepm": ("treepm", "treepm_accelerations"),
}


def default_n_mesh(n_particles: int) -> int:
    """The PM mesh used when ``n_mesh`` is not given.

    The smallest power of two ``>= N**(1/3)`` (one cell per particle on average,
    or more), and at least :data:`MIN_N_MESH` (16): 64 for a 64^3 snapshot, 128
    for 100^3 or 128^3.
    """
    side = 1
    while side**3 < n_particles:
        side *= 2
    return max(MIN_N_MESH, side)


@dataclass
class GravityInput:
    """Checked particles and parameters of one :func:`accelerations` call.

    Attributes
    ----------
    pos : dask.array.Array
        (N, 3) positions, chunked along rows only (NumPy or CuPy chunks).
    mass : float or dask.array.Array
        One mass for every particle, or (N,) masses chunked like ``pos``.
    n : int
        Number of particles N.
    params : dict
        The resolved parameters (defaults filled in), JSON-able: ``method``,
        ``G``, ``box_size``, ``theta``, ``softening``, ``softening_kernel``,
        ``precision``, ``potential`` and, where they apply, ``n_mesh``,
        ``r_split``, ``r_cut``, ``max_leaf``, ``max_group``.
    source : str or None
        Path of the snapshot the particles came from.
    units : dict
        Unit strings of the results (:func:`~cosmo_dask.units.products.input_units`
        of the input): ``units["acceleration"]``, ``units["potential"]``, ...
    """

    pos: da.Array
    mass: Any
    n: int
    params: dict = field(default_factory=dict)
    source: str | None = None
    units: dict = field(default_factory=product_units)


# ----------------------------------------------------------------------------- parameters
def _choice(value, name: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise ParameterError(f"{name} must be one of {', '.join(map(repr, choices))}, "
                             f"got {value!r}")
    return value.lower()


def _optional_positive(value, name: str) -> float | None:
    return None if value is None else check_positive(value, name)


def check_parameters(
    n_particles: int,
    *,
    method: str = METHODS[0],
    theta: float = THETA_DEFAULT,
    softening: float = SOFTENING_DEFAULT,
    softening_kernel: str = KERNELS[0],
    G: float | None = 1.0,  # noqa: N803 (physics symbol)
    box_size: float | None = None,
    n_mesh: int | None = None,
    r_split: float | None = None,
    precision: str = PRECISION_DEFAULT,
    potential: bool = True,
    max_leaf: int = MAX_LEAF_DEFAULT,
    max_group: int = MAX_GROUP_DEFAULT,
    r_cut: float | None = None,
) -> dict:
    """Check the parameters of :func:`accelerations` and fill in the defaults.

    Reads no particle data (only N, for the default mesh). Returns the resolved
    parameters as a JSON-able dict (see :attr:`GravityInput.params`).

    Raises
    ------
    ParameterError
        Naming the parameter: unknown ``method`` or ``softening_kernel``;
        ``theta`` not in (0, 1.5); negative or non-finite ``softening``;
        ``G`` or ``box_size`` not a positive finite number; ``pm``/``treepm``
        without ``box_size`` (an isolated system); ``n_mesh``, ``max_leaf`` or
        ``max_group`` not a positive integer; ``r_split``/``r_cut`` not positive,
        or ``r_cut`` beyond half the box; ``precision`` other than float32 or
        float64; ``softening`` with ``method="pm"``.
    """
    method = _choice(method, "method", METHODS)
    kernel = _choice(softening_kernel, "softening_kernel", KERNELS)
    theta = check_theta(theta)
    softening = check_positive(softening, "softening (a length)", allow_zero=True)
    G = check_positive(G, "G (the gravitational constant)")  # noqa: N806
    box = _optional_positive(box_size, "box_size")
    prec = resolve_precision(precision).name if precision is not None else None
    if prec is None:
        raise ParameterError("precision must be 'float32' or 'float64', got None")
    if not isinstance(potential, (bool, np.bool_)):
        raise ParameterError(f"potential must be True or False, got {potential!r}")
    params: dict[str, Any] = {
        "method": method, "G": G, "box_size": box, "theta": float(theta),
        "softening": softening, "softening_kernel": kernel, "precision": prec,
        "potential": bool(potential),
    }
    if method == "tree":
        params["max_leaf"] = check_leaf_size(max_leaf, "max_leaf", n_particles)
        params["max_group"] = check_leaf_size(max_group, "max_group", n_particles)
    if method in ("pm", "treepm"):
        if box is None:
            raise ParameterError(
                f"method={method!r} needs a periodic box but the particles are isolated "
                "(box_size is None); pass box_size= or use method='tree' or 'direct'")
        if n_mesh is None:
            n_mesh = default_n_mesh(n_particles)
        from ..spatial.fft import check_mesh_size  # <= 4096, prime factors 2, 3, 5, 7

        params["n_mesh"] = check_mesh_size(n_mesh, f"method={method!r}")
        if method == "pm":
            if softening > 0:
                raise ParameterError(
                    "softening does not apply to method='pm' (the mesh cell sets the force "
                    "resolution); pass softening=0 or use method='treepm'")
            # plain PM: the whole force from the mesh, no Gaussian split unless asked
            params["r_split"] = 0.0 if r_split is None else check_positive(r_split, "r_split")
        else:
            rs = (R_SPLIT_CELLS * box / params["n_mesh"] if r_split is None
                  else check_positive(r_split, "r_split"))
            rc = R_CUT_SPLITS * rs if r_cut is None else check_positive(r_cut, "r_cut")
            if rc > 0.5 * box:
                raise ParameterError(
                    f"r_cut = {rc:.6g} exceeds half the box ({0.5 * box:.6g}); the short-range "
                    "sum uses the nearest image only: increase n_mesh or decrease "
                    "r_split/r_cut")
            params["r_split"], params["r_cut"] = rs, rc
    return params


# ----------------------------------------------------------------------------- particles
def _resolve_particles(snap_or_pos, mass, G, box_size):  # noqa: N803
    """``(pos, mass, G, box_size, source)`` from a Snapshot or raw arrays (no data read)."""
    from ..store.snapshot import particles_of

    pos, mass, box, snap = particles_of(snap_or_pos, mass, box_size, what="accelerations")
    if snap is None:
        if mass is None:
            raise ParameterError("mass is required with raw positions: an (N,) array of "
                                 "masses or one number (the mass of every particle)")
        return pos, mass, 1.0 if G is None else G, box, None
    if G is None:
        G = snap.G  # noqa: N806
        if G is None:
            raise ParameterError(
                f"G: {snap.source or 'the snapshot'} has no 'G' attribute; pass G= (the "
                "gravitational constant in the snapshot's units; --G on the command line)")
    if mass is None:
        raise ParameterError(
            f"mass: {snap.source or 'the snapshot'} has no 'mass' array and no "
            "'particle_mass' attribute; pass mass=")
    return pos, mass, G, box, snap.source


def _check_values(pos: da.Array, mass, box: float | None) -> None:
    """One pass over the data, one task per chunk (:func:`chunk_ranges`): finite
    positions (inside the box) and masses > 0."""
    arrays = (pos, mass) if isinstance(mass, da.Array) else (pos,)
    (table,) = compute(chunk_ranges(*arrays), label=None, show=False)
    values = [v for pair in value_ranges(table) for v in pair]
    lo, hi = values[0], values[1]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ParameterError("pos: positions must be finite (found NaN or infinity)")
    if box is not None and (lo < 0 or hi >= box):
        raise ParameterError(
            f"pos: particles outside the periodic box [0, {box:g}) of box_size (coordinates "
            f"span [{lo:g}, {hi:g}]); wrap them into the box (pos % box_size, or "
            "open_snapshot(..., wrap=True))")
    if len(values) > 2:
        m_lo, m_hi = values[2], values[3]
        if not (math.isfinite(m_lo) and math.isfinite(m_hi) and m_lo > 0):
            raise ParameterError(f"mass: masses must be positive and finite (minimum {m_lo:g}, "
                                 f"maximum {m_hi:g})")


def prepare(snap_or_pos, mass=None, *, G=None, box_size=None, check: bool = True,  # noqa: N803
            **kwargs) -> GravityInput:
    """Checked particles and resolved parameters: everything but the computation.

    ``kwargs`` are the parameters of :func:`check_parameters` other than ``G``
    and ``box_size``. With ``check=True`` the particle values are checked by one
    reduction over the input (see :func:`accelerations`).
    """
    pos, mass, g, box, source = _resolve_particles(snap_or_pos, mass, G, box_size)
    pos, mass, n = particle_rows(pos, mass, "accelerations")
    params = check_parameters(n, G=g, box_size=box, **kwargs)
    if isinstance(mass, float):
        mass = check_positive(mass, "mass")
    elif device_of(mass) != device_of(pos):
        mass = to_device(mass, device_of(pos))
    _implementation(params["method"])  # a missing method fails before any data is read
    if check:
        _check_values(pos, mass, params["box_size"])
    return GravityInput(pos, mass, n, params, source, input_units(snap_or_pos, G))


# ----------------------------------------------------------------------------- dispatch
def _implementation(method: str):
    module, name = _IMPLEMENTATIONS[method]
    qualified = f"{__package__}.{module}"
    try:
        mod = importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise
        raise NotImplementedError(f"method={method!r}: module {qualified} is not available in "
                                  "this installation") from None
    fn = getattr(mod, name, None)
    if fn is None:
        raise NotImplementedError(f"method={method!r}: {qualified} has no {name}()")
    return fn


def _call(inp: GravityInput):
    p = inp.params
    fn = _implementation(p["method"])
    common = {"G": p["G"], "precision": p["precision"], "potential": p["potential"]}
    if p["method"] == "pm":
        return fn(inp.pos, inp.mass, box_size=p["box_size"], n_mesh=p["n_mesh"],
                  r_split=p["r_split"], **common)
    soft = {"softening": p["softening"], "softening_kernel": p["softening_kernel"]}
    if p["method"] == "direct":
        return fn(inp.pos, inp.mass, box_size=p["box_size"], **soft, **common)
    if p["method"] == "treepm":
        return fn(inp.pos, inp.mass, box_size=p["box_size"], n_mesh=p["n_mesh"],
                  r_split=p["r_split"], r_cut=p["r_cut"], theta=p["theta"], **soft, **common)
    return fn(inp.pos, inp.mass, theta=p["theta"], box_size=p["box_size"],
              max_leaf=p["max_leaf"], max_group=p["max_group"], **soft, **common)


def _aligned(x, like: da.Array, shape: tuple[int, ...], name: str):
    """``x`` as a dask array of ``shape`` chunked along rows like ``like``."""
    if x is None:
        return None
    if tuple(x.shape) != shape:  # a method returning the wrong shape is a bug, not bad input
        raise RuntimeError(f"gravity method returned {name} of shape {tuple(x.shape)}, "
                           f"expected {shape}")
    x = as_dask(x, like)
    if x.chunks[0] != like.chunks[0]:
        x = x.rechunk((like.chunks[0],) + tuple(-1 for _ in shape[1:]))
    return x


def as_dask(x, like: da.Array) -> da.Array:
    if isinstance(x, da.Array):
        return x
    return da.from_array(x, chunks=(like.chunks[0],) + tuple(x.shape[1:]), asarray=False)


def accelerations(
    snap_or_pos,
    mass=None,
    *,
    method: str = METHODS[0],
    theta: float = THETA_DEFAULT,
    softening: float = SOFTENING_DEFAULT,
    softening_kernel: str = KERNELS[0],
    G: float | None = None,  # noqa: N803 (physics symbol)
    box_size: float | None = None,
    n_mesh: int | None = None,
    r_split: float | None = None,
    precision: str = PRECISION_DEFAULT,
    potential: bool = True,
    out: str | os.PathLike | None = None,
    max_leaf: int = MAX_LEAF_DEFAULT,
    max_group: int = MAX_GROUP_DEFAULT,
    r_cut: float | None = None,
    overwrite: bool = False,
    check: bool = True,
):
    """Gravitational accelerations and potentials of every particle.

    ``a_i = -G sum_{j != i} m_j K(r_ij) (x_i - x_j)`` and
    ``phi_i = -G sum_{j != i} m_j P(r_ij)`` (self-pairs excluded; ``K``, ``P``
    the softened Newtonian kernels, see ``docs/gravity.md``).

    Parameters
    ----------
    snap_or_pos : Snapshot or array_like
        A :class:`~cosmo_dask.Snapshot` (its ``G``, ``box_size``, ``mass`` or
        ``particle_mass`` are used unless given here), or raw (N, 3) positions
        (NumPy, CuPy or dask array) in length units.
        Or the :class:`GravityInput` that :func:`prepare` returned: its particles
        and resolved parameters are used as they are (checked once, there), and
        only ``out`` and ``overwrite`` of the arguments below apply.
    mass : array_like or float, optional
        (N,) masses or the one mass of every particle. Required with raw
        positions; taken from the snapshot otherwise.
    method : {"tree", "direct", "pm", "treepm"}
        Octree with group interaction lists (default), all pairs, periodic
        particle-mesh, or PM long range + truncated tree short range.
    theta : float
        Opening angle of the tree walk, in (0, 1.5) (tree, treepm).
    softening : float
        Plummer-equivalent softening length eps >= 0, in length units
        (tree, direct, treepm; must be 0 for pm).
    softening_kernel : {"plummer", "spline"}
        ``1/(r^2 + eps^2)^(3/2)`` or the Gadget-2 cubic spline of support 2.8 eps.
    G : float, optional
        Gravitational constant in the input's units. Default: the snapshot's
        ``G`` attribute (a ParameterError when it has none); 1 for raw arrays
        (N-body units).
    box_size : float, optional
        Side of the periodic box [0, box_size)^3, in length units. Default: the
        snapshot's. None (isolated) is refused by pm and treepm; tree and direct
        use nearest-image separations in a periodic box (no Ewald sum).
    n_mesh : int, optional
        PM mesh cells per side (pm, treepm). Default :func:`default_n_mesh`:
        the smallest power of two >= N^(1/3), at least 16.
    r_split : float, optional
        Gaussian force-split scale r_s in length units. treepm default
        ``1.2 box_size / n_mesh``; pm default 0 (no split: the full PM force).
    precision : {"float32", "float64"}
        Arithmetic and output dtype.
    potential : bool
        Also compute the potentials (specific energy, velocity units squared).
    out : path, optional
        Write ``acc``/``pot`` to this Zarr store (see :func:`to_zarr`) and return
        the arrays read lazily from it (NumPy chunks, whatever the input's).
    max_leaf, max_group : int
        Tree leaf and group sizes in particles (tree).
    r_cut : float, optional
        Short-range cutoff radius (treepm), default ``4.5 r_split``; at most
        half the box.
    overwrite : bool
        With ``out``: replace an existing store.
    check : bool
        Check the particle values (finite; inside the box; masses > 0) with one
        reduction over the input before building the graph. Turn off only for
        inputs already checked (it costs one read of the positions).

    Returns
    -------
    acc : dask.array.Array
        (N, 3) accelerations in length / time^2 of the input units (with
        ``G`` in length^3 / (mass time^2)): velocity^2 / length of a snapshot's
        units, input particle order and row chunks, dtype ``precision``, NumPy
        or CuPy chunks like the input. With ``out``, the store's ``acc`` says
        its unit (attribute ``units``; :func:`~cosmo_dask.gravity.open_gravity`
        shows it on the Dataset's variables).
    pot : dask.array.Array or None
        (N,) potentials (velocity^2), or None with ``potential=False``.

    Raises
    ------
    ParameterError
        For bad input (see :func:`check_parameters`; also missing masses or G,
        non-finite positions, positions outside the periodic box, masses <= 0),
        before any graph is built.
    NotImplementedError
        When the module of ``method`` is not available.
    """
    if isinstance(snap_or_pos, GravityInput):  # prepared (and checked) by prepare()
        inp = snap_or_pos
    else:
        inp = prepare(snap_or_pos, mass, G=G, box_size=box_size, check=check, method=method,
                      theta=theta, softening=softening, softening_kernel=softening_kernel,
                      n_mesh=n_mesh, r_split=r_split, precision=precision,
                      potential=potential, max_leaf=max_leaf, max_group=max_group,
                      r_cut=r_cut)
    if out is not None:
        from ..store.atomic import check_writable_target

        check_writable_target(out, overwrite=overwrite, what="gravity store")
    acc, pot = _call(inp)
    acc = _aligned(acc, inp.pos, (inp.n, 3), "acc")
    pot = _aligned(pot, inp.pos, (inp.n,), "pot") if inp.params["potential"] else None
    if out is None:
        return acc, pot
    from .output import open_gravity, to_zarr

    attrs = dict(inp.params, n_particles=inp.n, source=inp.source)
    to_zarr(acc, pot, out, attrs=attrs, overwrite=overwrite, units=inp.units)
    ds = open_gravity(out)
    return ds["acc"].data, (ds["pot"].data if "pot" in ds else None)
