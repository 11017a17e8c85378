"""``cosmo-dask demo``: the end-to-end job, as a list of stages.

Each stage is a function ``stage(ctx) -> None`` that reads and adds entries of
the shared ``ctx`` dict and reports through ``ctx["say"]``. Capabilities add
their stage to :data:`STAGES` (gravity, expansions, densities and halos will
each append one).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dask
import dask.array as da
import numpy as np

from ..models import lpt_ics
from ..models.cosmology import Cosmology
from ..models.zeldovich_ics import mesh_wavenumbers
from ..store.snapshot import open_snapshot


def linear_rms_displacement(n_side: int, box_size: float, cosmology: dict, scale_factor: float):
    """rms Zel'dovich displacement (Mpc/h) expected from linear theory on the n_side^3 mesh.

    ``<|psi|^2> = (1/V) sum_k D^2 P(k) / k^2`` over the mesh modes the generator
    keeps (k != 0, no Nyquist planes).
    """
    cosmo = Cosmology.coerce(cosmology)
    kx, ky, kz = mesh_wavenumbers(n_side, box_size)
    k2 = kx**2 + ky**2 + kz**2
    weight = np.where((kz == 0) | ((n_side % 2 == 0) & (kz == kz.max())), 1.0, 2.0)
    keep = k2 > 0
    if n_side % 2 == 0:
        nyq = math.pi * n_side / box_size
        keep &= ~np.isclose(np.abs(kx), nyq) & ~np.isclose(np.abs(ky), nyq)
        keep &= ~np.isclose(np.abs(kz), nyq)
    k2 = np.where(keep, k2, 1.0)
    growth = float(cosmo.growth_factor(scale_factor))
    terms = np.where(keep, weight * cosmo.power_spectrum(np.sqrt(k2)) / k2, 0.0)
    return math.sqrt(growth**2 * terms.sum() / box_size**3)


def _displacement_sq(pos, ids, n_side, box_size):
    cell = box_size / n_side
    i, rest = np.divmod(ids.ravel().astype(np.int64), n_side * n_side)
    j, k = np.divmod(rest, n_side)
    q = (np.stack([i, j, k], axis=1) + 0.5) * cell
    d = pos.astype(np.float64) - q
    d -= box_size * np.round(d / box_size)
    return np.array([[np.sum(d * d)]])


def stage_generate(ctx) -> None:
    """Generate 2LPT initial conditions and write them atomically to ``ics.zarr``."""
    say, n_side, box = ctx["say"], ctx["n_side"], ctx["box_size"]
    snap = lpt_ics(n_side, box_size=box, redshift=ctx["redshift"], order=2, seed=ctx["seed"])
    path = ctx["dir"] / "ics.zarr"
    t0 = time.perf_counter()
    snap.to_zarr(path, overwrite=True)
    dt = time.perf_counter() - t0
    ctx["ics"] = path
    say(
        f"[generate] 2LPT ICs: {n_side}^3 = {snap.n_particles} particles, box "
        f"{box:g} Mpc/h, z = {ctx['redshift']:g}, seed {ctx['seed']} -> {path} "
        f"({snap.nbytes / 2**20:.1f} MiB in {dt:.2f} s)"
    )


def stage_inspect(ctx) -> None:
    """Reopen the store lazily, validate it and compare its displacements with linear theory."""
    say = ctx["say"]
    snap = open_snapshot(ctx["ics"])
    say(f"[inspect] opened lazily: {snap}")
    t0 = time.perf_counter()
    report = snap.validate(full=True)
    n_side = snap.lagrangian_shape[0]
    sq = da.map_blocks(
        _displacement_sq,
        snap.pos,
        snap.ids[:, None],
        n_side,
        snap.box_size,
        dtype=np.float64,
        chunks=((1,) * snap.pos.numblocks[0], (1,)),
        name="demo-displacement",
    )
    sum_sq, vel_sq = dask.compute(sq.sum(), (snap.vel.astype(np.float64) ** 2).sum())
    rms_psi = math.sqrt(sum_sq / snap.n_particles)
    rms_vel = math.sqrt(vel_sq / snap.n_particles)
    expected = linear_rms_displacement(n_side, snap.box_size, snap.cosmology, snap.scale_factor)
    ctx["rms_displacement"], ctx["expected_rms_displacement"] = rms_psi, expected
    say(
        f"[inspect] {report.summary()}; rms displacement {rms_psi:.3f} Mpc/h (linear theory on "
        f"this mesh: {expected:.3f}), rms peculiar velocity {rms_vel:.1f} km/s "
        f"({time.perf_counter() - t0:.2f} s)"
    )


def stage_simulate(ctx) -> None:
    """Evolve the ICs to z = 0 with PM (FastPM factors, mesh twice the particles per side);
    the later stages analyse the evolved box."""
    from ..simulation import run

    say = ctx["say"]
    t0 = time.perf_counter()
    res = run(ctx["ics"], z_final=0.0, n_steps=ctx["n_steps"], method="pm",
              out=ctx["dir"] / "simulation", overwrite=True, show=True)
    ctx["evolved"] = Path(res.outputs[-1][1].source)
    steps = [row["seconds"] for row in res.log]
    say(
        f"[simulate] PM {res.parameters['n_mesh']}^3 from z = {ctx['redshift']:g} to 0 in "
        f"{len(steps)} steps ({np.median(steps):.2f} s per step) -> {ctx['evolved']} "
        f"({time.perf_counter() - t0:.2f} s)"
    )


def stage_halos(ctx) -> None:
    """Friends-of-friends halos of the evolved box, with centres, written to halos.zarr."""
    from ..halos import fof

    say = ctx["say"]
    snap = open_snapshot(ctx["evolved"])
    t0 = time.perf_counter()
    result = fof(snap, 0.2, min_members=20, centers=("mbp", "mcp"))
    path = result.to_zarr(ctx["dir"] / "halos.zarr", overwrite=True)
    n = result.n_halos
    largest = int(result.catalog["n_members"][0]) if n else 0
    ctx["n_halos"] = n
    say(
        f"[halos] friends-of-friends (b = 0.2, >= 20 members): {n} halo{'s' * (n != 1)}, "
        f"largest {largest} "
        f"members, {result.parameters['n_domains']} domains -> {path} "
        f"({time.perf_counter() - t0:.2f} s)"
    )


def stage_density(ctx) -> None:
    """CIC mesh of the evolved box (mesh.zarr) and its P(k) against the ICs' grown by
    linear theory (same seed: the box's sample variance cancels)."""
    from ..analysis import power_spectrum
    from ..density import paint
    from ..density.mesh_store import write_mesh

    say = ctx["say"]
    snap = open_snapshot(ctx["evolved"])
    ics = open_snapshot(ctx["ics"])
    n_mesh = ctx["n_side"]
    t0 = time.perf_counter()
    path = write_mesh(ctx["dir"] / "mesh.zarr", paint(snap, n_mesh=n_mesh, scheme="cic"),
                      box_size=snap.box_size, scheme="cic", attrs={"source": str(ctx["evolved"])},
                      units=snap.units)
    final, start = (power_spectrum(s, n_mesh=n_mesh).compute() for s in (snap, ics))
    cosmo = Cosmology.coerce(snap.cosmology)
    growth = float(cosmo.growth_factor(snap.scale_factor) / cosmo.growth_factor(ics.scale_factor))
    k = final["k"].values
    low = np.flatnonzero(final["n_modes"].values > 0)[:2]  # the two largest scales
    # no shot noise is removed: the particles start on a lattice, which has none (the
    # ICs' power at z = 49 is near the Poisson level that a subtraction would assume)
    ratio = final["power"].values[low] / (start["power"].values[low] * growth**2)
    ctx["growth_ratio_low_k"] = ratio
    kmax = np.flatnonzero(final["n_modes"].values > 0)[-1]
    ctx["power_boost_kmax"] = float(final["power"].values[kmax] / (
        cosmo.power_spectrum(k[kmax]) * cosmo.growth_factor(snap.scale_factor) ** 2))
    say(
        f"[density] CIC mesh {n_mesh}^3 -> {path}; P(k) at z = 0 over the ICs' grown by "
        f"linear theory (same seed): {', '.join(f'{r:.3f}' for r in ratio)} at k = "
        f"{', '.join(f'{v:.3f}' for v in k[low])} h/Mpc; nonlinear boost over linear "
        f"theory {ctx['power_boost_kmax']:.1f}x at k = {k[kmax]:.2f} h/Mpc "
        f"({time.perf_counter() - t0:.2f} s)"
    )


def stage_pse(ctx) -> None:
    """Phase-space-element density of the evolved box on an adaptive octree (pse.zarr + slice
    PNG)."""
    from ..density import pse_density

    say = ctx["say"]
    snap = open_snapshot(ctx["evolved"])
    n = ctx["n_side"]
    patch = 16 if n >= 16 else 4
    level = max(0, int(np.ceil(np.log2(n / patch))))  # finest cells = Lagrangian spacing
    t0 = time.perf_counter()
    octree = pse_density(snap, patch_size=patch, max_level=level,
                         strategy=ctx.get("pse_strategy", "auto"))
    path = octree.to_zarr(ctx["dir"] / "pse.zarr", overwrite=True)
    png = ctx["dir"] / "pse_slice.png"
    if ctx.get("plot", True):
        octree.plot_slice(path=png)
    total = octree.total_mass()
    want = float(snap.particle_masses().sum().compute())
    ctx["pse_mass_error"] = total / want - 1
    ctx["pse"], ctx["pse_png"] = path, png
    levels = ", ".join(f"L{lev}: {c}" for lev, c in enumerate(np.bincount(octree.level)) if c)
    say(
        f"[pse] phase-space-element density, {octree.attrs['n_tets']} tetrahedra on "
        f"{octree.n_leaves} leaves of {patch}^3 ({levels}; strategy "
        f"{octree.attrs['strategy']}); deposited mass / particle mass - 1 = "
        f"{ctx['pse_mass_error']:.1e} -> {path}, {png.name} "
        f"({time.perf_counter() - t0:.2f} s)"
    )


def stage_expansion(ctx) -> None:
    """SCF and MEX expansions of a Hernquist halo, checked against its analytic force."""
    from ..expansion import MEX, SCF
    from ..models import hernquist

    say = ctx["say"]
    n = ctx.get("expansion_n", 50_000)
    snap = hernquist(n, scale=1.0, mass=1.0, seed=ctx["seed"])
    pos = snap.pos.astype(np.float64)
    r = da.sqrt((pos**2).sum(axis=1))
    exact = -pos / (r * (r + 1.0) ** 2)[:, None]  # G = M = a = 1, centred on the origin
    t0 = time.perf_counter()
    scf = SCF(10, 6, scale_radius=1.0, center=(0.0, 0.0, 0.0)).fit(snap)
    mex = MEX(6, center=(0.0, 0.0, 0.0)).fit(snap)
    errors = []
    for acc in (scf.accelerations(snap.pos), mex.accelerations()):
        rel = da.sqrt(((acc - exact) ** 2).sum(axis=1)) / da.sqrt((exact**2).sum(axis=1))
        errors.append(rel)
    e_scf, e_mex = dask.compute(*errors)
    ctx["expansion_median_error"] = (float(np.median(e_scf)), float(np.median(e_mex)))
    say(
        f"[expansion] Hernquist halo, {n} particles: SCF (nmax=10, lmax=6) and MEX (lmax=6) "
        f"accelerations vs the analytic force, median relative error "
        f"{np.median(e_scf):.2e} (SCF), {np.median(e_mex):.2e} (MEX) "
        f"({time.perf_counter() - t0:.2f} s)"
    )


def _reference_forces(targets: np.ndarray, pos: np.ndarray, mass: float, G: float,  # noqa: N803
                      eps: float, block: int = 8) -> np.ndarray:
    """float64 Plummer-softened pull of all of ``pos`` on ``pos[targets]`` (self excluded).

    Coordinates as separate contiguous arrays and a few targets a block, so that the
    temporaries stay in cache: some 10 times faster than whole ``(block, n, 3)`` offsets."""
    x, y, z = (np.ascontiguousarray(pos[:, a], dtype=np.float64) for a in range(3))
    out = np.empty((len(targets), 3))
    for lo in range(0, len(targets), block):
        idx = targets[lo:lo + block]
        dx = x[idx, None] - x
        dy = y[idx, None] - y
        dz = z[idx, None] - z
        r2 = dx * dx
        r2 += dy * dy
        r2 += dz * dz
        r2 += eps * eps
        r2[np.arange(len(idx)), idx] = np.inf  # no self term
        w = np.sqrt(r2)
        w *= r2
        np.reciprocal(w, out=w)  # 1 / r**3
        for k, d in enumerate((dx, dy, dz)):
            out[lo:lo + block, k] = -G * mass * (w * d).sum(axis=1)
    return out


def stage_gravity(ctx) -> None:
    """Forces on a Plummer sphere (gravity.zarr), checked against float64 direct summation.

    Uses the octree (``method="tree"``, N = 20000) when it is installed, else
    direct summation on N = 4000; the reference sums all N sources exactly for
    1000 random target particles.
    """
    import importlib.util

    from ..gravity import accelerations
    from ..models import plummer

    say = ctx["say"]
    tree = importlib.util.find_spec("cosmo_dask.gravity.tree.graph") is not None
    method, n = ("tree", 20_000) if tree else ("direct", 4_000)
    n = ctx.get("gravity_n", n)
    eps = 0.01
    snap = plummer(n, seed=ctx["seed"], precision="float64", chunks=n // 4)
    path = ctx["dir"] / "gravity.zarr"
    t0 = time.perf_counter()
    acc, _ = accelerations(snap, method=method, theta=0.5, softening=eps, precision="float32",
                           out=path, overwrite=True)
    dt = time.perf_counter() - t0
    pos = snap.pos.compute()
    targets = np.sort(np.random.default_rng(ctx["seed"]).choice(n, min(n, 1000), replace=False))
    ref = _reference_forces(targets, pos, snap.particle_mass, snap.G, eps)
    got = acc[targets].compute().astype(np.float64)
    err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    median, p99 = float(np.median(err)), float(np.percentile(err, 99))
    ctx["gravity"], ctx["gravity_method"] = path, method
    ctx["gravity_error"] = (median, p99)
    what = "tree (theta = 0.5, quadrupoles)" if tree else "direct summation"
    say(
        f"[gravity] Plummer sphere, {n} particles, {what}, float32, softening {eps:g} -> "
        f"{path} ({dt:.2f} s); relative force error vs float64 direct summation on 1000 "
        f"particles: median {median:.1e}, 99th percentile {p99:.1e}"
    )


#: the demo's stages, in order; later capabilities append theirs
STAGES: list[Callable[[dict], None]] = [stage_generate, stage_inspect, stage_simulate,
                                         stage_halos,
                                         stage_density, stage_pse, stage_expansion,
                                         stage_gravity]


#: the stages the warm-ups run, each list in a process of its own beside the cluster's
#: workers (numba compiles one kernel at a time in a process; two processes keep both
#: cores compiling while the workers wait for kernels): the halos' kernels first (the most
#: compile work of the early stages, on a clustered box of its own,
#: :func:`_warm_halo_box`, since a small evolved box holds no halos) while the workers
#: generate and evolve the ICs (compiling the simulation's kernels themselves), then PSE's
#: and the density's on the ICs (a lattice in the evolved box's dtypes); in the other
#: process the last stages', whose kernels no worker reaches before the end (the tree's
#: are the most compile work of all)
WARM_ORDER = (("halos", "generate", "pse", "density"), ("gravity", "expansion"))


def _warm_halo_box(ctx) -> None:
    """A clustered box for the warm-up's halos stage (``ctx["evolved"]``): Plummer blobs
    (:func:`~cosmo_dask.models.halo_blobs`) in the evolved box's dtypes (float64 positions
    and velocities, int64 ids), so that FOF, its catalog and the MBP and MCP centres
    compile the specialisations the demo's halos stage runs."""
    from ..models import halo_blobs

    n = ctx["n_side"] ** 3
    snap = halo_blobs(n, box_size=ctx["box_size"], n_halos=8, seed=ctx["seed"],
                      precision="float64")
    path = ctx["dir"] / "warm_halos.zarr"
    snap.to_zarr(path, overwrite=True)
    ctx["evolved"] = path


def warm_kernels(directory, n_side: int = 16, part: int = 0) -> None:
    """Compile (or load from numba's cache) the kernels of the demo's stages by running
    them on a small box in this process (dask's synchronous scheduler, one core), in
    the order of :data:`WARM_ORDER` ``[part]``.

    Run by :func:`run_demo` in subprocesses (one per part) beside a cluster's workers:
    with the compile lock of :mod:`cosmo_dask.core.compile_cache` in every process, each
    kernel compiles once, in whichever process needs it first, and the others load it.
    The workers compile the kernels of the stages they reach first while these processes
    compile those of the later stages. Kernels, or signatures, that the small box does
    not reach compile in the workers as before (the warm-up saves time, it is never
    needed for a result).

    Parameters
    ----------
    directory : str or pathlib.Path
        Where the small box's stores are written (the caller removes it).
    n_side : int, optional
        Particles per side of the small box (its box is ``100 n_side / 64`` Mpc/h, the
        demo's mean density).
    part : int, optional
        Which of the stage lists of :data:`WARM_ORDER` to run.
    """
    from ..core.compile_cache import install

    install()
    ctx = {"dir": Path(directory), "n_side": n_side, "box_size": 100.0 * n_side / 64,
           "redshift": 49.0, "n_steps": 1, "seed": 1, "client": None,
           "say": lambda _: None, "pse_strategy": "reduce", "plot": False,
           "gravity_n": 2_000, "expansion_n": 5_000}
    ctx["dir"].mkdir(parents=True, exist_ok=True)
    stages = {stage.__name__.removeprefix("stage_"): stage for stage in STAGES}
    with dask.config.set(scheduler="sync"):
        for name in WARM_ORDER[part]:
            if name == "halos":  # on a clustered box of its own, for this stage only
                box = dict(ctx)
                _warm_halo_box(box)
                stages[name](box)
            elif name in stages:
                stages[name](ctx)
            if name == "generate":  # PSE and the density on the ICs' lattice, unless a
                ctx["evolved"] = ctx["ics"]  # later simulation gives its own output


def _warm_marker() -> Path | None:
    """The file that says the demo ran to the end with these sources and this numba: in the
    numba cache directory of a package kernel (``None`` when it cannot be made)."""
    import numba

    from ..spatial import morton

    cache = getattr(getattr(morton._cell_keys_kernel, "_cache", None), "cache_path", None)
    if cache is None:
        return None
    digest = hashlib.sha1(numba.__version__.encode())
    root = Path(__file__).resolve().parents[1]  # the package
    for src in sorted(root.rglob("*.py")):
        st = src.stat()
        digest.update(f"{src.relative_to(root)}:{st.st_mtime_ns}:{st.st_size};".encode())
    return Path(cache) / f"cosmo-dask-demo-warm-{digest.hexdigest()[:16]}"


@contextlib.contextmanager
def _warm_up_beside(client):
    """Run :func:`warm_kernels` in subprocesses, one per list of :data:`WARM_ORDER`, while
    the body runs (the demo's stages on the cluster); skipped when the kernels are known
    to be cached already (the demo ran to the end with these sources and this numba
    before) or ``COSMO_DASK_DEMO_WARM=0``."""
    marker = None
    if client is not None and os.environ.get("COSMO_DASK_DEMO_WARM", "1") != "0":
        with contextlib.suppress(Exception):
            marker = _warm_marker()
    if marker is None or marker.exists():
        yield
        return
    work = tempfile.mkdtemp(prefix="cosmo-dask-warm-")
    # the same copy of cosmo_dask as this process (numba files its cache by the source's
    # directory): first on the path, and the working directory a temporary one, so that a
    # checkout in the current directory does not shadow an installed package
    here = str(Path(__file__).resolve().parents[2])
    procs = []
    try:
        for part in range(len(WARM_ORDER)):  # inside the try: a failed start stops the others
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[2]); "
                 "from cosmo_dask.cli.demo_stages import warm_kernels; "
                 "warm_kernels(sys.argv[1], part=int(sys.argv[3]))",
                 str(Path(work) / str(part)), here, str(part)],
                cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        yield
        with contextlib.suppress(OSError):  # the stages ran: their kernels are cached
            marker.touch()
    finally:
        for proc in procs:
            if proc.poll() is None:  # the stages are done: what it would compile is not needed
                proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def run_demo(
    directory=None,
    *,
    n_side: int = 64,
    box_size: float = 100.0,
    redshift: float = 49.0,
    n_steps: int = 10,
    seed: int = 1,
    client=None,
    say=print,
) -> dict:
    """Run every stage of :data:`STAGES`; returns the context dict (paths and figures).

    ``directory=None`` works in a temporary directory removed at the end.
    """
    tmp = None
    if directory is None:
        tmp = tempfile.mkdtemp(prefix="cosmo-dask-demo-")
        directory = tmp
    ctx = {
        "dir": Path(directory),
        "n_side": n_side,
        "box_size": box_size,
        "redshift": redshift,
        "n_steps": n_steps,
        "seed": seed,
        "client": client,
        "say": say,
    }
    ctx["dir"].mkdir(parents=True, exist_ok=True)
    if client is not None:
        info = client.scheduler_info()
        say(f"[cluster] {len(info.get('workers', {}))} workers; dashboard {client.dashboard_link}")
    t0 = time.perf_counter()
    try:
        with _warm_up_beside(client):
            for stage in STAGES:
                stage(ctx)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    where = "temporary directory, removed" if tmp else str(ctx["dir"])
    say(f"[done] {len(STAGES)} stages in {time.perf_counter() - t0:.1f} s ({where})")
    return ctx
