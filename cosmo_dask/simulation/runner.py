"""``run()``: evolve periodic cosmological initial conditions with a KDK leapfrog in ``a``.

See :mod:`cosmo_dask.simulation.integrator` for the equations of motion and the
kick/drift factors, :mod:`~cosmo_dask.simulation.schedule` for the step
schedule and :mod:`~cosmo_dask.simulation.store` for the store layout.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np

from ..core.backend import device_of, resolve_precision
from ..core.checks import check_finite, check_positive_int
from ..core.errors import ParameterError
from ..core.progress import active_client, format_seconds, persist, wait
from ..gravity.parameters import THETA_DEFAULT, check_theta
from ..models.cosmology import Cosmology
from ..spatial.fft import check_mesh_size
from ..store.atomic import Replacement
from ..units import factor
from . import store as st
from .integrator import Factors, drift, kick, to_momentum, to_velocity
from .lightcone import check_lightcone, lightcone_recorder, rows
from .parameters import (
    DEFAULT_STEPS,
    METHOD_DEFAULT,
    SOFTENING_SPACINGS,
    Z_FINAL_DEFAULT,
    check_analyses,
    check_factors,
    check_method,
    check_n_steps,
    check_outputs_count,
    check_steps,
)
from .schedule import midpoint, step_schedule

#: tolerance on the particles' mean density against Omega_m rho_crit
DENSITY_TOL = 1e-2
#: keep the state in domain order between steps where it can be (:func:`_state_grid`):
#: off, the ICs' row order. Read at each run (side-by-side measurements,
#: ``benchmarks/simulation/domains.py``); off by default until it moves fewer bytes than
#: the ICs' order (on CPU workers the tree's own tasks do not follow the domains)
KEEP_BY_DOMAIN = False


class SimulationInterrupted(RuntimeError):
    """Raised by the private test hook ``_stop_after`` (a simulated kill)."""


@dataclass
class SimulationResult:
    """What :func:`run` returns.

    Attributes
    ----------
    snapshot : Snapshot
        The final state (persisted dask arrays; with ``out`` also written as the
        last output).
    outputs : list of (float, Snapshot)
        ``(z, snapshot)`` per output redshift, decreasing z (read from the store
        with ``out``; persisted in memory without).
    analyses : dict
        ``{z: {"power": Dataset, "halos": Dataset}}`` of the analyses computed.
    log : list of dict
        One row per step: ``step, a_start, a, z, seconds, force_seconds``.
    parameters : dict
        The resolved parameters (as stored).
    path : str or None
        The simulation store, when ``out`` was given.
    lightcone : Lightcone or None
        The recorded light cone (``run(lightcone=...)``; read from the store with ``out``).
    """

    snapshot: Any
    outputs: list = field(default_factory=list)
    analyses: dict = field(default_factory=dict)
    log: list = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    path: str | None = None
    lightcone: Any = None

    @property
    def redshifts(self) -> list[float]:
        return [z for z, _ in self.outputs]


# ----------------------------------------------------------------------------- checks
def _ics_snapshot(ics):
    from ..store.snapshot import Snapshot, open_snapshot

    if isinstance(ics, Snapshot):
        return ics
    if isinstance(ics, (str, os.PathLike)):
        return open_snapshot(ics)
    raise ParameterError(f"ics must be a Snapshot or a snapshot store path, got "
                         f"{type(ics).__name__}")


def _check_ics(snap) -> tuple[Cosmology, float]:
    """``(cosmology, H0 in the snapshot's velocity/length units)``; ParameterError if unfit."""
    what = f"ics ({snap.source or 'in-memory snapshot'})"
    if snap.box_size is None:
        raise ParameterError(f"{what}: not periodic (no box_size); a cosmological run needs a "
                             "periodic box")
    if snap.scale_factor is None:
        raise ParameterError(f"{what}: has no scale_factor (the ICs' time)")
    if not snap.cosmology:
        raise ParameterError(f"{what}: has no cosmology attribute")
    if snap.G is None:
        raise ParameterError(f"{what}: has no G (the gravitational constant in its units)")
    cosmo = Cosmology.coerce({k: v for k, v in snap.cosmology.items() if v is not None})
    units = snap.units or {}
    try:
        h0 = 100.0 * factor("km/s", units.get("velocity", "km/s"), "velocity") / factor(
            "Mpc/h", units.get("length", "Mpc/h"), "length", h=cosmo.h)
    except ParameterError as exc:
        raise ParameterError(f"{what}: units {units} must be physical lengths and velocities "
                             f"(Mpc/h and km/s peculiar, or convertible): {exc}") from None
    return cosmo, h0


def _check_density(snap, cosmo: Cosmology, h0: float) -> None:
    """The particles' mean comoving density must be Omega_m rho_crit (what the factors use)."""
    n = snap.n_particles
    if snap.mass is not None:
        total = float(snap.mass.sum(dtype=np.float64).compute())
    elif snap.particle_mass is not None:
        total = float(snap.particle_mass) * n
    else:
        raise ParameterError("ics: has no masses (no mass array, no particle_mass)")
    expected = cosmo.Omega_m * 3.0 * h0**2 / (8.0 * math.pi * snap.G) * snap.box_size**3
    if not abs(total / expected - 1.0) <= DENSITY_TOL:
        raise ParameterError(
            f"ics: total particle mass {total:.6g} differs from Omega_m rho_crit box^3 = "
            f"{expected:.6g} by more than {DENSITY_TOL:.0%}; the particles must be all the "
            "matter of the cosmology (check the units, G and Omega_m)")


def _default_n_mesh(n_particles: int, method: str) -> int:
    from ..gravity.api import default_n_mesh
    from ..gravity.pm import MAX_N_MESH

    base = default_n_mesh(n_particles)
    return min(MAX_N_MESH, 2 * base) if method == "pm" else base


def _output_redshifts(outputs, z_final: float, z_ics: float) -> list[float]:
    try:
        zs = [float(z) for z in np.atleast_1d(np.asarray(outputs, dtype=np.float64))]
    except (TypeError, ValueError):
        raise ParameterError(f"outputs must be redshifts (numbers), got {outputs!r}") from None
    for z in zs:
        if not (math.isfinite(z) and z_final - 1e-12 <= z <= z_ics + 1e-9 * (1 + z_ics)):
            raise ParameterError(f"outputs: z = {z!r} lies outside [z_final, z_ics] = "
                                 f"[{z_final:g}, {z_ics:.6g}]")
    kept = [z_final]  # the final state is always an output
    for z in sorted(zs):  # increasing; a redshift within 1e-9 of a kept one is the same
        if abs(z - kept[-1]) > 1e-9 * (1 + abs(z)):
            kept.append(z)
    return kept[::-1]


# ----------------------------------------------------------------------------- helpers
def _wait(*arrays) -> None:
    """Block until persisted arrays are in memory (a distributed persist returns at once)
    and, for CuPy chunks computed here, until the GPU has finished them (CuPy launches
    kernels asynchronously: without this the step log would time kernel launches and
    charge the queued work to whichever later step waits for it)."""
    if active_client(*arrays) is not None:
        wait(*arrays)  # raises a failed task's error; bounded while workers are paused
    elif any(x is not None and device_of(x) == "gpu" for x in arrays):
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def _gpu_rows(*arrays):
    """Arrays of CuPy chunks in chunks of at least
    :data:`~cosmo_dask.store.snapshot.GPU_READ_ROWS` rows (whole chunks merged), as a store
    opened on the GPU has them; others as they are. A step runs about ten tasks per
    chunk, each with a fixed cost of a few tenths of a millisecond on a GPU: 2^20-row
    chunks of 512^3 particles cost about 0.1 s a step that way."""
    from ..store.snapshot import gpu_read_rows

    out = []
    for x in arrays:
        if x is None or device_of(x) != "gpu":
            out.append(x)
            continue
        rows = gpu_read_rows(max(x.chunks[0]))
        out.append(x if len(x.chunks[0]) == 1 or rows <= max(x.chunks[0])
                   else x.rechunk((rows,) + x.shape[1:]))
    return out


def _persist(*arrays):
    out = persist(*arrays, label=None, show=False)
    _wait(*out)
    return out


def _state_grid(snap, ids):
    """The domains a run keeps its particles in between steps (each domain's rows on one
    worker: :meth:`~cosmo_dask.spatial.layout.DomainLayout.by_domain`), or None to keep
    the ICs' order: the force's own domain grid (one domain per GPU worker, one per
    ``DOMAIN_PARTICLES`` on CPU workers) when it has several, the active client several
    workers, and the ICs ids (rows reordered are known by their ids)."""
    from ..core.progress import worker_count
    from ..gravity.tree.graph import default_n_domains
    from ..spatial.domains import domain_grid

    if not KEEP_BY_DOMAIN or ids is None or worker_count() < 2:
        return None
    nd = default_n_domains(snap.n_particles, device_of(snap.pos) == "gpu")
    return domain_grid(nd, box_size=float(snap.box_size)) if nd > 1 else None


def _snapshot_of(ics, pos, mom, ids, a: float, mass):
    from ..store.snapshot import Snapshot

    vel = to_velocity(mom, a).astype(pos.dtype)
    return Snapshot.from_arrays(
        pos, vel, ids, mass, box_size=ics.box_size,
        particle_mass=ics.particle_mass if mass is None else None,
        lagrangian_shape=ics.lagrangian_shape, scale_factor=a, cosmology=ics.cosmology,
        units=ics.units, G=ics.G, ptype=ics.ptype)


# ----------------------------------------------------------------------------- run
def check_run(ics, **kwargs) -> dict:
    """Check every parameter of :func:`run` (same keywords) against the ICs' metadata and
    the store at ``out`` (a resumed run's checkpoint parameters included), starting no
    work and writing nothing; returns the resolved parameters, as :func:`run` stores them.
    Reads no particle data but the ICs' mass array, if they have one (their total mass is
    checked). :func:`run` makes the same checks first; ``cosmo-dask simulate`` calls this
    before it starts a cluster.

    Raises
    ------
    ParameterError
        As :func:`run`.
    """
    return run(ics, **kwargs, _check_only=True)


def run(ics, *, z_final: float = Z_FINAL_DEFAULT, n_steps: int | None = None,
        method: str = METHOD_DEFAULT, n_mesh: int | None = None,
        softening: float | None = None, theta: float = THETA_DEFAULT,
        steps=None, outputs=(), out=None, checkpoint_every: int | None = None,
        resume: bool = False, analyses=(), precision=None, overwrite: bool = False,
        write_particles: bool = True, analysis_options: dict | None = None,
        factors: str | None = None, lightcone: dict | None = None,
        show: bool | None = None, _stop_after: int | None = None,
        _check_only: bool = False) -> SimulationResult:
    """Evolve periodic cosmological initial conditions to ``z_final`` (PM or TreePM).

    Kick-drift-kick leapfrog in the scale factor on comoving positions ``x`` and
    the momentum ``p = a^2 dx/dt`` (the snapshot's velocities are peculiar,
    ``v = a dx/dt``, so ``p = a v``)::

        dx/dt = p / a^2,   dp/dt = g(x) / a,   lap phi = 4 pi G (rho_c - mean rho_c),
        g = -grad phi

    with ``rho_c`` the comoving density of the particles, i.e. ``g`` is the
    periodic Newtonian acceleration of the comoving positions and masses that
    :func:`cosmo_dask.gravity.pm.pm_accelerations` (or ``treepm_accelerations``)
    returns. Kick and drift factors (see :mod:`~cosmo_dask.simulation.integrator`):
    ``factors="fastpm"`` (the default; Feng et al. 2016):
    ``drift = (D(a1) - D(a0)) / g_p(a_h)``, ``kick = (g_p(a1) - g_p(a0)) /
    ((3/2) Omega_m H0^2 D(a_r))``, ``g_p = a^2 H f D``, exact for linear growth
    at any step count; ``factors="standard"``: ``drift = int da / (a^3 H)``,
    ``kick = int da / (a^2 H)`` (the usual leapfrog; both converge to the same
    solution, the standard factors need more steps for the same linear growth).

    Parameters
    ----------
    ics : Snapshot or path
        Periodic snapshot with ``scale_factor``, ``cosmology``, ``G``,
        (Mpc/h, km/s peculiar, 1e10 Msun/h or convertible units), e.g.
        :func:`cosmo_dask.models.zeldovich`; its particles must be all the
        matter (total mass ``Omega_m rho_crit box^3`` within 1 %). Without
        velocities the particles start at rest.
    z_final : float
        Final redshift, below the ICs'.
    n_steps : int
        Steps of the base schedule (required unless ``steps`` is an array).
    method : {"pm", "treepm"}
    n_mesh : int, optional
        PM mesh per side; default twice :func:`cosmo_dask.gravity.default_n_mesh`
        for ``pm`` (FastPM's B = 2), once for ``treepm``.
    softening : float, optional
        TreePM Plummer softening (length units); default 1/30 of the mean
        interparticle spacing ``box / N^(1/3)``; must be below one mesh cell.
    theta : float
        TreePM opening angle.
    steps : {"loga", "a"} or array, optional
        Base schedule uniform in ``log a`` or in ``a``, or the scale factors
        (from the ICs' ``a`` to ``1 / (1 + z_final)``). Default ``"loga"`` for
        ``pm`` and ``"a"`` for ``treepm``: the tree's small scales need their
        steps late, when halos form (256^3 in 256 Mpc/h from z = 49: 40 steps in
        ``a`` differ from 80 by 4 % in P(k = 1 h/Mpc) at z = 0, 40 in ``log a`` by
        14 %; ``docs/simulation.md`` gives the step counts for 1 %).
    outputs : sequence of float
        Output redshifts in ``[z_final, z_ics]``; the schedule is split so that
        a step ends exactly at each. ``z_final`` is always an output.
    out : path, optional
        Simulation store (see :mod:`~cosmo_dask.simulation.store`); without it
        everything stays in memory.
    checkpoint_every : int, optional
        Write the state to ``out/checkpoint`` (atomically) every that many steps.
    resume : bool
        Continue the run in ``out`` from its checkpoint; the final state is
        bit-identical to an uninterrupted run.
    analyses : sequence of {"power", "halos"}
        Computed at each output: ``power_spectrum`` (mesh ``n_mesh``, CIC,
        interlaced) and ``halos.fof`` (b = 0.2, 20 members); stored as tables.
    precision : {"float32", "float64"}, optional
        Dtype of the state and forces (default dask config ``cosmo_dask.precision``).
    overwrite : bool
        Replace an existing simulation store (or empty directory) at ``out``. The
        new run is written into a hidden sibling of ``out`` until its first output or
        checkpoint is complete, then takes ``out``'s place: an interrupt before that
        leaves the old store as it was (and a new run that fails before that leaves
        no ``out``).
    write_particles : bool
        Write the particles of each output (False: analyses only).
    analysis_options : dict, optional
        ``{"power": kwargs of power_spectrum, "halos": kwargs of fof}``.
    factors : {"fastpm", "standard"}, optional
        Kick/drift factors (default ``"fastpm"``, see above).
    lightcone : dict, optional
        ``{"z_max": Z, "observer": (x, y, z)}``: record every particle (and periodic
        image) where it crosses the past light cone of ``observer`` (length units, in
        ``[0, box)^3``; default the box centre) up to redshift ``z_max`` (at most the
        ICs', above ``z_final``), the crossing interpolated within each step's drift
        (:mod:`~cosmo_dask.simulation.lightcone`). Kept in memory without ``out``,
        written one piece per step under ``out/lightcone/`` with it; returned as
        ``SimulationResult.lightcone``.
    show : bool, optional
        One line per step on stderr (default dask config ``cosmo_dask.progress``).

    Raises
    ------
    ParameterError
        Before any work and without touching ``out``: ``z_final`` not below the
        ICs' redshift, ``n_steps <= 0``, outputs outside ``[z_final, z_ics]``, ICs
        not periodic or without scale_factor/cosmology/G, softening >= one mesh
        cell, ``out`` existing without ``overwrite``/``resume``, a checkpoint
        whose parameters differ, bad method/steps/analyses, a lightcone reaching past
        the ICs' redshift or with its observer outside the box.

    Notes
    -----
    With :data:`KEEP_BY_DOMAIN` set (off by default), a run with ids on a client of
    several workers, whose force has several domains, keeps its particles in domain
    order between steps (each domain's rows on one worker): its snapshots, outputs and
    checkpoints then hold the particles in that order, known by their ids.
    """
    snap = _ics_snapshot(ics)
    cosmo, h0 = _check_ics(snap)
    method = check_method(method)
    a_ics = float(snap.scale_factor)
    z_ics = 1.0 / a_ics - 1.0
    z_final = check_finite(z_final, "z_final")
    if not (z_final > -1 and z_final < z_ics * (1 - 1e-12) - 1e-12):
        raise ParameterError(f"z_final = {z_final:g} must be below the ICs' redshift "
                             f"z = {z_ics:.6g} (and > -1)")
    a_final = 1.0 / (1.0 + z_final)
    if n_steps is not None:
        n_steps = check_n_steps(n_steps)
    steps = check_steps(DEFAULT_STEPS[method] if steps is None else steps)
    out_z = _output_redshifts(check_outputs_count(outputs), z_final, z_ics)
    out_a = [a_ics if abs(z - z_ics) <= 1e-9 * (1 + z_ics) else 1.0 / (1.0 + z) for z in out_z]
    sched = step_schedule(a_ics, a_final, n_steps, steps, out_a)
    names = check_analyses(analyses)
    dtype = resolve_precision(precision)
    n = snap.n_particles
    if n_mesh is None:
        n_mesh = _default_n_mesh(n, method)
    n_mesh = check_mesh_size(n_mesh, "run")
    spacing = snap.box_size / n ** (1.0 / 3.0)
    if method == "treepm":
        theta = check_theta(theta)
        softening = SOFTENING_SPACINGS * spacing if softening is None else check_finite(
            softening, "softening")
        if not 0 <= softening < snap.box_size / n_mesh:
            raise ParameterError(f"softening = {softening:g} must be >= 0 and below one PM "
                                 f"mesh cell ({snap.box_size / n_mesh:g})")
    elif softening not in (None, 0, 0.0):
        raise ParameterError("softening does not apply to method='pm'; use method='treepm'")
    kind = check_factors(factors)
    fac = Factors(cosmo, h0, kind)
    cone = check_lightcone(lightcone, box_size=snap.box_size, z_ics=z_ics, z_final=z_final)
    if checkpoint_every is not None:
        checkpoint_every = check_positive_int(checkpoint_every, "checkpoint_every")
        if out is None:
            raise ParameterError("checkpoint_every needs out= (the simulation store)")
    if resume and out is None:
        raise ParameterError("resume=True needs out= (the simulation store holding the "
                             "checkpoint)")
    if _stop_after is not None:
        _stop_after = check_positive_int(_stop_after, "_stop_after")
    _check_density(snap, cosmo, h0)
    chunks = [int(c) for c in snap.pos.chunks[0]]
    params = {
        "method": method, "factors": kind, "n_mesh": n_mesh,
        "softening": float(softening) if method == "treepm" else 0.0,
        "theta": float(theta) if method == "treepm" else None,
        "precision": dtype.name, "steps": steps if isinstance(steps, str) else "explicit",
        "n_steps": len(sched) - 1, "n_steps_base": n_steps,
        "schedule": [float(a) for a in sched], "outputs": out_z, "z_final": z_final,
        "a_initial": a_ics, "z_initial": z_ics, "n_particles": n, "box_size": snap.box_size,
        "cosmology": cosmo.as_dict(), "G": float(snap.G), "h0": h0, "chunks": chunks,
        "analyses": list(names), "write_particles": bool(write_particles),
        "checkpoint_every": checkpoint_every, "ics": snap.source,
        "momentum": "p = a^2 dx/dt = a v_peculiar", "lightcone": cone,
    }
    path = None
    if out is not None:
        path = st.check_target(out, overwrite=overwrite, resume=resume,
                               inputs=(snap.source,) if snap.source else ())
    if _check_only:  # check_run: the checkpoint's parameters too, then no work
        if resume:
            st.read_manifest(path)
            st.compare_parameters(st.read_checkpoint(path)[1]["parameters"], params)
        return params
    # a new run writes into a temporary sibling of ``path`` until its first output or
    # checkpoint is complete, then takes ``path``'s place (an existing store is kept until
    # then); a failure before that leaves ``path`` as it was
    write = None if path is None or resume else Replacement(path)
    try:
        return _evolve(snap, path, write, params, sched, out_z, out_a, resume=resume,
                       overwrite=overwrite, steps=steps, names=names, dtype=dtype,
                       n_mesh=n_mesh, method=method, theta=theta, softening=softening,
                       fac=fac, checkpoint_every=checkpoint_every,
                       write_particles=write_particles, analysis_options=analysis_options,
                       show=show, _stop_after=_stop_after)
    except BaseException:
        if write is not None and write.tmp.exists():
            write.abort()
        raise


def _evolve(snap, path, write, params, sched, out_z, out_a, *, resume, overwrite, steps,
            names, dtype, n_mesh, method, theta, softening, fac, checkpoint_every,
            write_particles, analysis_options, show, _stop_after) -> SimulationResult:
    """The run itself (:func:`run` after its checks)."""
    cone = None if params.get("lightcone") is None else lightcone_recorder(snap, params, fac)
    # ------------------------------------------------------------------ initial state
    start = 0
    log: list[dict] = []
    doc = None
    ids = snap.ids
    mass = snap.mass
    if mass is not None:
        (mass,) = _persist(*_gpu_rows(mass.astype(dtype)))
    grid = _state_grid(snap, ids)

    def by_domain(pos, **columns):
        """The state in domain order (as it is without a state grid)."""
        if grid is None:
            return pos, columns
        from ..spatial.layout import decompose

        kept = {k: v for k, v in columns.items() if v is not None}
        out = decompose(pos, grid, name="state").by_domain(**kept)
        held = dict(zip(out, _persist(*out.values()), strict=True))
        return held.pop("pos"), {k: held.get(k) for k in columns}

    def force(pos):
        m_force = mass if mass is not None else float(snap.particle_mass)
        if method == "pm":
            from ..gravity.pm import pm_accelerations

            acc, _ = pm_accelerations(pos, m_force, G=float(snap.G), box_size=snap.box_size,
                                      n_mesh=n_mesh, r_split=0.0, precision=dtype.name,
                                      potential=False)
        else:
            from ..gravity.treepm import treepm_accelerations

            acc, _ = treepm_accelerations(pos, m_force, G=float(snap.G),
                                          box_size=snap.box_size, n_mesh=n_mesh, theta=theta,
                                          softening=softening, precision=dtype.name,
                                          potential=False, placed=grid is not None)
        return acc

    if resume:
        doc = st.read_manifest(path)
        arrays, attrs = st.read_checkpoint(path)
        st.compare_parameters(attrs["parameters"], params)
        start = int(attrs["step"])
        log = list(attrs.get("log", []))
        pos, mom, acc = _persist(*_gpu_rows(arrays["pos"], arrays["mom"], arrays["acc"]))
        if "ids" in arrays:
            (ids,) = _persist(*_gpu_rows(arrays["ids"]))
        if "mass" in arrays:  # a run kept by domain: its masses in the state's order
            (mass,) = _persist(*_gpu_rows(arrays["mass"].astype(dtype)))
        pos, cols = by_domain(pos, mom=mom, acc=acc, ids=ids, mass=mass)
        mom, acc, ids, mass = cols["mom"], cols["acc"], cols["ids"], cols["mass"]
        doc["log"] = log
        doc["parameters"] = params
        if cone is not None:
            cone.resume(doc.get("lightcone"), start)
    else:
        pos = snap.pos.astype(dtype)
        a_ics = float(snap.scale_factor)
        mom = (to_momentum(snap.vel.astype(dtype), a_ics) if snap.vel is not None
               else da.zeros_like(pos))
        if ids is not None:
            (ids,) = _persist(*_gpu_rows(ids))
        pos, mom = _persist(*_gpu_rows(pos, mom))
        pos, cols = by_domain(pos, mom=mom, ids=ids, mass=mass)
        mom, ids, mass = cols["mom"], cols["ids"], cols["mass"]
        (acc,) = _persist(force(pos))
        if write is not None:
            doc = st.create_store(write.start(), params)
            if cone is not None:
                doc["lightcone"] = cone.manifest()
    if show is None:
        show = bool(dask.config.get("cosmo_dask.progress", False))

    out_index = {float(a): i for i, a in enumerate(out_a)}
    root = path if write is None else write.tmp  # where the store is written now

    def committed() -> None:
        """Once the new store holds an output or a checkpoint: put it at ``path``."""
        nonlocal write, root
        if write is not None:
            write.commit(overwrite=overwrite)
            write, root = None, path

    results: list = []
    tables: dict = {}
    opts = dict(analysis_options or {})

    def emit(step: int, a: float, pos, mom):
        i = out_index[float(a)]
        z = out_z[i]
        snap_out = _snapshot_of(snap, pos, mom, ids, a, mass)
        found = {}
        if "power" in names:
            from ..analysis import power_spectrum

            kw = {"n_mesh": n_mesh, **opts.get("power", {})}
            found["power"] = power_spectrum(snap_out, **kw)
        if "halos" in names:
            from ..halos import fof

            halo_result = fof(snap_out, **opts.get("halos", {}))
            found["halos"] = halo_result.catalog
        tables[z] = found
        if path is None:
            results.append((z, snap_out))
            return
        entry = st.as_entry(i, z, a, step, snapshot=write_particles, power="power" in found,
                            halos="halos" in found,
                            members="halos" in found and snap_out.ids is not None)
        where = root / "outputs" / entry["name"]
        where.mkdir(parents=True, exist_ok=True)
        if write_particles:
            snap_out.to_zarr(where / "snapshot", overwrite=True, progress=False)
        for key, ds in found.items():
            st.write_table(ds, where / key, f"{key} table")
        if entry["members"]:  # the halos' member ids, most bound first (merger trees)
            from ..halos.members import write_members

            write_members(snap_out, halo_result, where / "members", overwrite=True)
        st.record_output(doc, entry)
        st.write_json(root / st.MANIFEST, doc)
        committed()

    if start == 0 and float(sched[0]) in out_index:
        emit(0, float(sched[0]), pos, mom)
    n_total = len(sched) - 1
    for i in range(start, n_total):
        t0 = time.perf_counter()
        a0, a1 = float(sched[i]), float(sched[i + 1])
        ah = midpoint(a0, a1, steps)
        p_half = kick(mom, acc, fac.kick(a0, ah, a0))
        pos_next = drift(pos, p_half, fac.drift(a0, a1, ah), snap.box_size)
        pos_next, p_half = _persist(pos_next, p_half)
        if cone is not None:  # crossings within this drift, from the unwrapped path
            cone.step(i + 1, a0, a1, ah, pos, p_half, ids if ids is not None else rows(pos),
                      root=None if path is None else root)
        pos, cols = by_domain(pos_next, p_half=p_half, ids=ids, mass=mass)
        p_half, ids, mass = cols["p_half"], cols["ids"], cols["mass"]
        t1 = time.perf_counter()
        (acc,) = _persist(force(pos))
        t_force = time.perf_counter() - t1
        (mom,) = _persist(kick(p_half, acc, fac.kick(ah, a1, a1)))
        seconds = time.perf_counter() - t0
        z1 = 1.0 / a1 - 1.0
        row = {"step": i + 1, "a_start": a0, "a": a1, "z": z1, "seconds": round(seconds, 4),
               "force_seconds": round(t_force, 4)}
        log.append(row)
        if show:
            print(f"[simulation] step {i + 1}/{n_total}  a = {a1:.5f}  z = {z1:.4f}  "
                  f"{format_seconds(seconds)} (force {format_seconds(t_force)})",
                  file=sys.stderr, flush=True)
        if a1 in out_index:
            emit(i + 1, a1, pos, mom)
        if doc is not None:
            doc["log"] = log
            if cone is not None:
                doc["lightcone"] = cone.manifest()
            st.write_json(root / st.MANIFEST, doc)
        if checkpoint_every is not None and (i + 1) % checkpoint_every == 0 and i + 1 < n_total:
            st.write_checkpoint(root, {"pos": pos, "mom": mom, "acc": acc, "ids": ids,
                                       "mass": mass if grid is not None else None},
                                {"step": i + 1, "scale_factor": a1, "parameters": params,
                                 "log": log})
            committed()
        if _stop_after is not None and i + 1 >= _stop_after:
            raise SimulationInterrupted(f"stopped after step {i + 1} (_stop_after)")

    final = _snapshot_of(snap, pos, mom, ids, float(sched[-1]), mass)
    if path is not None:
        sim = st.open_simulation(path)
        outs = sim.series()
        return SimulationResult(final, outs, tables, log, params, str(path),
                                sim.lightcone() if cone is not None else None)
    return SimulationResult(final, results, tables, log, params, None,
                            cone.result() if cone is not None else None)
