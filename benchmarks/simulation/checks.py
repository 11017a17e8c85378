"""Physical checks of a simulation run that print their figures (issue 17, item 6):

* the Layzer-Irvine cosmic energy equation ``d[a (K + U)]/da = -K`` over a PM run:
  ``K = 1/2 sum m v^2`` (peculiar velocities), ``U = 1/2 sum m phi / a`` (the PM
  potential of the comoving density fluctuation, ``phi_pec = phi / a``); the residual
  ``a (K + U) - a_i (K_i + U_i) + int K da`` relative to ``max |a U|``, the integral by
  the trapezoid rule over the outputs (one per step);
* float32 against float64: P(k) at z = 0 of the same run in both precisions;
* convergence: P(k) at z = 0 of PM with twice the steps, and of TreePM with theta 0.3
  and twice the steps, against the default run of each.

    python -m benchmarks simulation-checks --n-side 64 --box 128

Prints one JSON line per check (ratios up to k = 1 h/Mpc or the mesh's Nyquist/2).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dask
import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import box_parser, emit, env_of, start  # noqa: E402


def _energies(snap, n_mesh):
    """K and U (1e10 Msun/h (km/s)^2) of an output."""
    from cosmo_dask.gravity.pm import pm_accelerations

    m = float(snap.particle_mass)
    vel = snap.vel.astype(np.float64)
    _, phi = pm_accelerations(snap.pos, m, G=float(snap.G), box_size=snap.box_size,
                              n_mesh=n_mesh, precision="float64", potential=True)
    k, u = dask.compute(0.5 * m * (vel * vel).sum(), 0.5 * m * phi.sum())
    return float(k), float(u) / snap.scale_factor


def _pk(snap, n_mesh, kmax):
    from cosmo_dask.analysis import power_spectrum

    ds = power_spectrum(snap, n_mesh=n_mesh).compute()
    keep = (ds["n_modes"].values > 0) & (ds["k"].values <= kmax)
    return ds["k"].values[keep], ds["power"].values[keep]


def _max_dev(a, b):
    return float(np.max(np.abs(a / b - 1)))


def main(argv=None):
    ap = box_parser(__doc__, n_side=64, box=128.0, steps=10, method=False)
    ap.add_argument("--skip-treepm", action="store_true")
    args = ap.parse_args(argv)
    start(args, "simulation-checks")

    from cosmo_dask.models import lpt_ics
    from cosmo_dask.simulation import run

    env = env_of("simulation_checks", args)
    n = args.n_side
    mesh = 2 * n
    kmax = min(1.0, 0.5 * np.pi * mesh / args.box)
    with dask.config.set(scheduler="threads"):
        ics = lpt_ics(n, box_size=args.box, redshift=args.z_init, seed=2, precision="float64")
        a_i = float(ics.scale_factor)
        sched = np.geomspace(a_i, 1.0, 2 * args.steps + 1)
        outs = [1.0 / a - 1.0 for a in sched[1:-1]]
        # Layzer-Irvine over a PM run with an output after every step
        t0 = time.perf_counter()
        res = run(ics, z_final=0.0, steps=sched, method="pm", n_mesh=mesh, outputs=outs,
                  precision="float64")
        series = [(ics.scale_factor, ics)] + [(s.scale_factor, s) for _, s in res.outputs]
        a = np.array([float(s) for s, _ in series])
        ku = np.array([_energies(s, mesh) for _, s in series])
        kin, pot = ku[:, 0], ku[:, 1]
        int_k = np.concatenate([[0.0], np.cumsum(0.5 * (kin[1:] + kin[:-1]) * np.diff(a))])
        resid = a * (kin + pot) - a[0] * (kin[0] + pot[0]) + int_k
        scale = np.max(np.abs(a * pot))
        emit(env, check="layzer_irvine", method="pm", steps=len(a) - 1, n_mesh=mesh,
             max_residual_over_aU=round(float(np.max(np.abs(resid)) / scale), 5),
             final_residual_over_aU=round(float(resid[-1] / scale), 5),
             K_final=float(kin[-1]), U_final=float(pot[-1]),
             seconds=round(time.perf_counter() - t0, 1))
        # the PM default run (args.steps) in float64, float32, and with twice the steps
        base = {}
        for prec, steps in (("float64", args.steps), ("float32", args.steps),
                            ("float64", 2 * args.steps)):
            t0 = time.perf_counter()
            snap = run(ics, z_final=0.0, n_steps=steps, method="pm", n_mesh=mesh,
                       precision=prec).snapshot
            base[(prec, steps)] = _pk(snap, mesh, kmax)
            emit(env, check="pm_run", precision=prec, steps=steps,
                 seconds=round(time.perf_counter() - t0, 1))
        k, p64 = base[("float64", args.steps)]
        emit(env, check="float32_vs_float64", method="pm", kmax=kmax,
             max_abs_ratio_minus_1=round(_max_dev(base[("float32", args.steps)][1], p64), 6))
        emit(env, check="pm_twice_the_steps", kmax=kmax,
             max_abs_ratio_minus_1=round(_max_dev(base[("float64", 2 * args.steps)][1], p64),
                                         6),
             ratio=[round(float(r), 4) for r in base[("float64", 2 * args.steps)][1] / p64])
        if not args.skip_treepm:
            pk = {}
            for theta, steps in ((0.5, args.steps), (0.3, 2 * args.steps)):
                t0 = time.perf_counter()
                snap = run(ics, z_final=0.0, n_steps=steps, method="treepm", theta=theta,
                           precision="float64").snapshot
                pk[theta] = _pk(snap, mesh, kmax)[1]
                emit(env, check="treepm_run", theta=theta, steps=steps,
                     seconds=round(time.perf_counter() - t0, 1))
            emit(env, check="treepm_theta0.3_twice_the_steps", kmax=kmax,
                 max_abs_ratio_minus_1=round(_max_dev(pk[0.3], pk[0.5]), 6),
                 ratio=[round(float(r), 4) for r in pk[0.3] / pk[0.5]])


if __name__ == "__main__":
    main()
