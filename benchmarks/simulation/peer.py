"""A PM run of cosmo_dask against jaxpm on the CPU: the same ICs, the same steps.

ICs: cosmo_dask Zel'dovich (1LPT) at ``--z-init`` (default 9), ``n_side^3`` particles
in a ``--box`` Mpc/h box (default 128^3 in 256 Mpc/h), float32, persisted in memory.
Both codes then take ``--steps`` kick-drift-kick PM steps uniform in log a to z = 0 on
an ``--n-mesh``^3 mesh (default 256), with the FastPM kick/drift factors:

* cosmo_dask: ``simulation.run(ics, method="pm", n_mesh=..., precision="float32")``
  on the local threaded scheduler (``--threads`` workers); its step log gives the
  seconds of each step.
* jaxpm (float32, jit): jaxpm's force is ``jaxpm.pm.pm_forces`` (CIC paint, ``fft3d``,
  ``invlaplace_kernel``, 4th-order finite-difference ``gradient_kernel``, CIC read) but
  that function reshapes the positions to the mesh's shape (one particle per cell), so
  the same pipeline is composed here from jaxpm's own pieces (``painting._cic_paint_impl``
  / ``_cic_read_impl``, ``distributed.fft3d`` / ``ifft3d``, ``kernels.fftk`` /
  ``invlaplace_kernel`` / ``gradient_kernel``) with the particles painted with weight
  ``n_mesh^3 / N`` (so the painted field is ``1 + delta`` as in jaxpm's one-per-cell
  use). jaxpm (0.1.x) has no leapfrog of its own (its ``make_ode_fn`` gives
  ``d pos/da = vel / (a^3 E)``, ``d vel/da = 1.5 Omega_m F / (a^2 E)`` for ODE solvers),
  so its ODE right-hand side is stepped with a KDK in ``a`` whose effective ``da`` are
  FastPM's, from jaxpm's own growth functions (``jaxpm.growth``: ``growth_factor``,
  ``Gf``, ``dGfa``; jax_cosmo background): drift ``(D1 - D0) / Gf(a_h)`` times ``vel``,
  kick ``(Gf(a1) - Gf(a0)) / dGfa(a_r)`` times ``1.5 Omega_m F / (a_r^2 E(a_r))``, the
  force at the end of a step reused for the next step's first half kick (as in
  cosmo_dask: one force per step).

Conventions: jaxpm positions are in mesh cells, ``pos_j = x n_mesh / box``; its
momentum is ``a^2 dx/dt / H0`` in cells, so from cosmo_dask's peculiar velocity
``v = a dx/dt`` (km/s), ``vel_j = a v / 100 * n_mesh / box`` (= ``Gf psi`` in linear
theory, as jaxpm's ``lpt`` returns).

Timings: a warm-up (numba compile) of cosmo_dask on a tiny run, jaxpm's AOT compile of
its step function, the whole run of each (initial force + all steps, ICs already in
memory), the median step (steps 2..n) of each from the run, and the PM force alone on
the ICs (``timing.wall_median``). Accuracy: the force on the ICs (jaxpm's converted to
cosmo_dask's units) and P(k) of both final particle sets (cosmo_dask ``power_spectrum``,
same mesh, CIC, interlaced) per k bin up to ``min(1 h/Mpc, k_Nyquist / 2)``.

    python -m benchmarks simulation-peer                       # 128^3, mesh 256, 10 steps
    python -m benchmarks simulation-peer --n-side 32 --n-mesh 64 --box 64

Prints one JSON line per measurement and a summary line.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start, wall_median  # noqa: E402

H0 = 100.0  # km/s / (Mpc/h)


def _threads_env(threads: int) -> None:
    """Pin the thread pools of both codes before their libraries load."""
    os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=true "
                                   f"intra_op_parallelism_threads={threads}").strip()


# ----------------------------------------------------------------------------- jaxpm side
def _jaxpm_cosmology(c: dict):
    import jax_cosmo as jc

    return jc.Cosmology(Omega_c=c["Omega_m"] - c["Omega_b"], Omega_b=c["Omega_b"], h=c["h"],
                        n_s=c["n_s"], sigma8=c["sigma8"], Omega_k=0.0, w0=-1.0, wa=0.0)


def _jaxpm_factors(cosmo, sched):
    """Per step ``(kick0, drift, kick1)`` of the KDK in jaxpm's units, from jaxpm.growth.

    ``kick`` multiplies the force ``F`` (jaxpm's ``pm_forces`` output, cells), ``drift``
    multiplies ``vel``. Midpoint ``a_h = sqrt(a0 a1)`` (cosmo_dask's ``loga`` midpoint).
    """
    import jax.numpy as jnp
    from jaxpm.growth import E, Gf, dGfa, growth_factor

    a = np.asarray(sched, dtype=np.float64)
    ah = np.sqrt(a[1:] * a[:-1])
    om = float(cosmo.Omega_m)

    def ev(fn, x):
        return np.asarray(fn(cosmo, jnp.asarray(x, dtype=jnp.float32)), dtype=np.float64)

    d, gf, dgf, e = ev(growth_factor, a), ev(Gf, a), ev(dGfa, a), ev(E, a)
    gf_h = ev(Gf, ah)
    # ODE rhs: dvel/da = 1.5 Om F / (a^2 E), dpos/da = vel / (a^3 E); FastPM's effective da
    kick0 = (gf_h - gf[:-1]) / dgf[:-1] * 1.5 * om / (a[:-1] ** 2 * e[:-1])
    drift = (d[1:] - d[:-1]) / gf_h
    kick1 = (gf[1:] - gf_h) / dgf[1:] * 1.5 * om / (a[1:] ** 2 * e[1:])
    return np.stack([kick0, drift, kick1], axis=1), d


def _jaxpm_step_fns(n_mesh: int, weight: float):
    import jax
    import jax.numpy as jnp
    from jaxpm.distributed import fft3d, ifft3d
    from jaxpm.kernels import fftk, gradient_kernel, invlaplace_kernel, longrange_kernel
    from jaxpm.painting import _cic_paint_impl, _cic_read_impl

    shape = (n_mesh,) * 3

    def forces(pos):
        """jaxpm.pm.pm_forces (r_split = 0, absolute positions) for N != n_mesh^3."""
        field = _cic_paint_impl(jnp.zeros(shape, dtype=pos.dtype), pos, weight)
        delta_k = fft3d(field)
        kvec = fftk(delta_k)
        pot_k = delta_k * invlaplace_kernel(kvec) * longrange_kernel(kvec, r_split=0)
        return jnp.stack([_cic_read_impl(ifft3d(-gradient_kernel(kvec, i) * pot_k), pos)
                          for i in range(3)], axis=-1)

    def step(pos, vel, force, fac):
        vel = vel + fac[0] * force
        pos = jnp.mod(pos + fac[1] * vel, n_mesh)
        force = forces(pos)
        vel = vel + fac[2] * force
        return pos, vel, force

    return jax.jit(forces), jax.jit(step)


def _jaxpm_run(pos0, vel0, facs, n_mesh, weight):
    """``(pos, vel, timings)``: AOT compile, initial force, the KDK steps."""
    import jax
    import jax.numpy as jnp

    forces, step = _jaxpm_step_fns(n_mesh, weight)
    pos = jax.device_put(jnp.asarray(pos0, dtype=jnp.float32))
    vel = jax.device_put(jnp.asarray(vel0, dtype=jnp.float32))
    fac = [jnp.asarray(f, dtype=jnp.float32) for f in facs]
    t0 = time.perf_counter()
    forces_c = forces.lower(pos).compile()
    step_c = step.lower(pos, vel, pos, fac[0]).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    force = forces_c(pos).block_until_ready()
    force_s = time.perf_counter() - t0
    steps = []
    for f in fac:
        t = time.perf_counter()
        pos, vel, force = step_c(pos, vel, force, f)
        force.block_until_ready()
        steps.append(time.perf_counter() - t)
    run_s = time.perf_counter() - t0
    return np.asarray(pos), np.asarray(vel), {
        "compile_s": compile_s, "initial_force_s": force_s, "run_s": run_s, "steps": steps,
        "forces": forces_c}


# ----------------------------------------------------------------------------- P(k)
def _pk(pos, n_mesh, box):
    from cosmo_dask.analysis import power_spectrum

    ds = power_spectrum(pos, n_mesh=n_mesh, box_size=box).compute()
    keep = ds["n_modes"].values > 0
    return ds["k"].values[keep], ds["power"].values[keep]


def main(argv=None):
    ap = parser(__doc__, devices=("cpu",))
    ap.add_argument("--n-side", type=int, default=128)
    ap.add_argument("--n-mesh", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--box", type=float, default=256.0, help="Mpc/h")
    ap.add_argument("--z-init", type=float, default=9.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2,
                    help="dask workers (threads) and the JAX/numba thread pools")
    ap.add_argument("--force-repeat", type=int, default=5,
                    help="repeats of the force-alone timing (median; 0 skips it)")
    args = ap.parse_args(argv)
    start(args, "simulation-peer")
    _threads_env(args.threads)

    import dask
    import jax

    from cosmo_dask.gravity.pm import pm_accelerations
    from cosmo_dask.models import zeldovich
    from cosmo_dask.models.cosmology import Cosmology
    from cosmo_dask.simulation import run

    n, n_mesh, box = args.n_side, args.n_mesh, args.box
    env = {"bench": "simulation_peer", "device": "cpu",
           "device_name": platform.processor() or platform.machine(),
           "cpus": os.cpu_count(), "threads": args.threads, "date": time.strftime("%Y-%m-%d"),
           "n_side": n, "n_particles": n**3, "n_mesh": n_mesh, "box": box,
           "z_init": args.z_init, "steps": args.steps, "precision": "float32",
           "jax": jax.__version__, "jaxpm": version("jaxpm")}
    kmax = min(1.0, 0.5 * np.pi * n_mesh / box)
    cell = box / n_mesh

    force_alone = {}
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        # ---------------------------------------------------------------- ICs
        t0 = time.perf_counter()
        ics = zeldovich(n, box_size=box, redshift=args.z_init, seed=args.seed,
                        precision="float32").persist()
        pos0, vel0 = (np.asarray(x) for x in dask.compute(ics.pos, ics.vel))
        a_i = float(ics.scale_factor)
        emit(env, what="ics", model="zeldovich", seconds=round(time.perf_counter() - t0, 3),
             a_init=a_i, vel_rms_kms=float(np.sqrt(np.mean(vel0.astype(np.float64) ** 2))))
        sched = np.geomspace(a_i, 1.0, args.steps + 1)
        sched[-1] = 1.0

        # ---------------------------------------------------------------- cosmo_dask
        t0 = time.perf_counter()  # numba compile of the painting/interpolation kernels
        tiny = zeldovich(8, box_size=16.0, redshift=args.z_init, seed=0, precision="float32")
        run(tiny, z_final=0.0, n_steps=1, method="pm", n_mesh=16, precision="float32")
        warm_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = run(ics, z_final=0.0, n_steps=args.steps, method="pm", n_mesh=n_mesh,
                  precision="float32")
        cd_run_s = time.perf_counter() - t0
        cd_pos = np.asarray(res.snapshot.pos.compute())
        later = res.log[1:] or res.log
        cd_step = statistics.median(r["seconds"] for r in later)
        emit(env, what="run", code="cosmo_dask", run_s=round(cd_run_s, 3),
             warmup_tiny_run_s=round(warm_s, 3), step_median_s=round(cd_step, 4),
             force_median_s=round(statistics.median(r["force_seconds"] for r in later), 4),
             first_step_s=round(res.log[0]["seconds"], 4), n_steps=len(res.log),
             step_s=[r["seconds"] for r in res.log])
        if not np.allclose(res.parameters["schedule"], sched, rtol=1e-12, atol=0):
            raise SystemExit("cosmo_dask's schedule differs from geomspace(a_i, 1, steps + 1)")

        # ---------------------------------------------------------------- jaxpm
        jcosmo = _jaxpm_cosmology(ics.cosmology)
        facs, d_j = _jaxpm_factors(jcosmo, sched)
        weight = float(n_mesh) ** 3 / n**3
        pos_j0 = (pos0.astype(np.float64) / cell).astype(np.float32)
        vel_j0 = (vel0.astype(np.float64) * a_i / H0 / cell).astype(np.float32)
        pos_j, vel_j, tj = _jaxpm_run(pos_j0, vel_j0, facs, n_mesh, weight)
        j_step = statistics.median(tj["steps"][1:] or tj["steps"])
        emit(env, what="run", code="jaxpm", run_s=round(tj["run_s"], 3),
             compile_s=round(tj["compile_s"], 3), run_with_compile_s=round(
                 tj["run_s"] + tj["compile_s"], 3), step_median_s=round(j_step, 4),
             initial_force_s=round(tj["initial_force_s"], 4),
             first_step_s=round(tj["steps"][0], 4), n_steps=len(tj["steps"]),
             step_s=[round(s, 4) for s in tj["steps"]],
             integrator="KDK in a, FastPM factors from jaxpm.growth; force = jaxpm pm_forces "
                        "pipeline (paint weight n_mesh^3/N)")
        jd_pos = np.mod(pos_j.astype(np.float64) * cell, box)
        jd_vel = vel_j.astype(np.float64) * cell * H0  # p = a v (km/s); at a = 1 p = v

        # growth factors of both codes (D(1)/D(a_i): the linear growth over the run)
        cd_cosmo = Cosmology.coerce(dict(ics.cosmology))
        g_cd = float(cd_cosmo.growth_factor(1.0)) / float(cd_cosmo.growth_factor(a_i))
        g_j = float(d_j[-1] / d_j[0])
        emit(env, what="growth", D1_over_Di_cosmo_dask=g_cd, D1_over_Di_jaxpm=g_j,
             ratio_sq=round((g_cd / g_j) ** 2, 6))

        # ---------------------------------------------------------------- force on the ICs
        m = float(ics.particle_mass)
        acc_cd, _ = pm_accelerations(ics.pos, m, G=float(ics.G), box_size=box, n_mesh=n_mesh,
                                     precision="float32", potential=False)
        acc_cd = np.asarray(acc_cd.compute(), dtype=np.float64)
        f_j = np.asarray(tj["forces"](jax.numpy.asarray(pos_j0)), dtype=np.float64)
        acc_j = f_j * 1.5 * float(ics.cosmology["Omega_m"]) * H0**2 * cell
        rms = float(np.sqrt(np.mean(acc_cd**2)))
        diff = float(np.sqrt(np.mean((acc_j - acc_cd) ** 2))) / rms
        emit(env, what="force_ics", rms_acc_cosmo_dask=rms,
             rms_acc_ratio_jaxpm_over_cosmo_dask=round(
                 float(np.sqrt(np.mean(acc_j**2))) / rms, 5),
             rms_diff_over_rms=round(diff, 5),
             corr=round(float(np.sum(acc_j * acc_cd) / np.sqrt(np.sum(acc_j**2) *
                                                                  np.sum(acc_cd**2))), 6))
        if args.force_repeat > 0:
            pos_ics = ics.pos

            def cd_force():
                acc, _ = pm_accelerations(pos_ics, m, G=float(ics.G), box_size=box,
                                          n_mesh=n_mesh, precision="float32", potential=False)
                acc.persist()

            pj = jax.numpy.asarray(pos_j0)
            # two warm-up calls: the first calls after the runs are slower (fresh meshes)
            t_cd = wall_median(cd_force, args.force_repeat, warm=2)
            t_j = wall_median(lambda: tj["forces"](pj).block_until_ready(), args.force_repeat,
                              warm=2)
            force_alone = {"force_s_cosmo_dask": round(t_cd, 4), "force_s_jaxpm": round(t_j, 4),
                           "force_ratio_cosmo_dask_over_jaxpm": round(t_cd / t_j, 3)}
            emit(env, what="force_alone", repeat=args.force_repeat, warm=2,
                 cosmo_dask_force="pm_accelerations (interlaced, CIC-deconvolved, "
                                  "spectral gradient)",
                 jaxpm_force="pm_forces pipeline (one mesh, FD gradient)", **force_alone)

        # ---------------------------------------------------------------- P(k)
        k, p_cd = _pk(cd_pos, n_mesh, box)
        _, p_j = _pk(jd_pos.astype(np.float32), n_mesh, box)
        _, p_i = _pk(pos0, n_mesh, box)
        sel = k <= kmax
        ratio = p_cd[sel] / p_j[sel]
        dev = float(np.max(np.abs(ratio - 1)))
        lin = (p_i[sel] * g_cd**2)
        emit(env, what="power", kmax=round(kmax, 4), n_bins=int(sel.sum()),
             max_abs_ratio_minus_1=round(dev, 5),
             k_of_max=round(float(k[sel][np.argmax(np.abs(ratio - 1))]), 4),
             k=[round(float(x), 4) for x in k[sel]],
             ratio_cosmo_dask_over_jaxpm=[round(float(x), 5) for x in ratio],
             cosmo_dask_over_linear=[round(float(x), 4) for x in p_cd[sel][:4] / lin[:4]],
             jaxpm_over_linear=[round(float(x), 4) for x in p_j[sel][:4] / lin[:4]])
        vel_cd = np.asarray(res.snapshot.vel.compute(), dtype=np.float64)
        emit(env, what="velocity", vel_rms_cosmo_dask=float(np.sqrt(np.mean(vel_cd**2))),
             vel_rms_jaxpm=float(np.sqrt(np.mean(jd_vel**2))),
             mean_abs_dx_cells=float(np.mean(np.abs(
                 (cd_pos - jd_pos + box / 2) % box - box / 2)) / cell))
        emit(env, what="summary", step_s_cosmo_dask=round(cd_step, 4),
             step_s_jaxpm=round(j_step, 4), step_ratio_cosmo_dask_over_jaxpm=round(
                 cd_step / j_step, 3), run_s_cosmo_dask=round(cd_run_s, 3),
             run_s_jaxpm=round(tj["run_s"], 3), jaxpm_compile_s=round(tj["compile_s"], 3),
             run_ratio_cosmo_dask_over_jaxpm=round(cd_run_s / tj["run_s"], 3),
             **force_alone, pk_max_abs_ratio_minus_1=round(dev, 5), kmax=round(kmax, 4))


if __name__ == "__main__":
    main()
