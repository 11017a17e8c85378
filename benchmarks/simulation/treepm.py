"""Validation runs at the simulation issue's size (issue 17, item 6), one device.

The same 2LPT ICs (``--n-side``^3 in ``--box`` Mpc/h at ``--z-init``, linear
spectrum from ``--power``: a two-column table such as CAMB's, or the default
Eisenstein & Hu) are evolved to z = 0 once per ``--configs`` entry
``method:factors:theta:steps:precision[:schedule]`` (e.g.
``treepm:standard:0.5:40:float32:loga``; the schedule ``loga`` (default) or ``a``),
with outputs at ``--outputs`` and the on-the-fly analyses ``power`` and ``halos``
(no particles written). Per run it prints:

With ``--fixed`` the ICs have fixed amplitudes, with ``--paired`` every config runs
twice, from the field and from its sign-flipped pair, and the P(k) and mass functions
are the pair's means (paired-and-fixed: Angulo & Pontzen 2016).

* the step times (median over the steps, host wall time with the GPU stream
  synchronised, and the force part);
* the same-seed boost ``P_sim(k, z) / [P_ics(k) (D(z) / D_i)^2]`` at every output for
  ``k <= --kmax`` (the box's sample variance cancels; no shot noise removed), which
  ``python -m benchmarks simulation-boost --from`` compares with EuclidEmulator2 and halofit;
* the linear-growth ratio: that boost averaged over the modes with ``k <
  --k-linear`` (mode-weighted) and per bin;
* the FOF (b = 0.2) mass function at z = 0 against Watson et al. 2013 (FoF);
* against the first config (the default run): ``max |P / P_default - 1|`` at z = 0
  for ``k <= --kmax`` (the convergence and float32/float64 checks).

    python -m benchmarks simulation-treepm --device gpu --n-side 256 --box 256 \\
        --z-init 49 --power TABLE --configs treepm:standard:0.5:40:float32 \\
        treepm:standard:0.3:80:float32 treepm:standard:0.5:40:float64

Prints one JSON line per run and one per comparison with the default run.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import dask
import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402
from benchmarks.simulation.halos import mass_function_rows  # noqa: E402


def parse_config(text: str) -> dict:
    method, factors, theta, steps, precision, *rest = text.split(":")
    schedule = rest[0] if rest else "loga"
    if (method not in ("pm", "treepm") or factors not in ("fastpm", "standard")
            or schedule not in ("loga", "a") or len(rest) > 1):
        raise SystemExit(f"bad config {text!r}: method:factors:theta:steps:precision[:schedule]")
    return {"name": text, "method": method, "factors": factors,
            "theta": float(theta) if theta not in ("", "-") else 0.5, "n_steps": int(steps),
            "precision": precision, "steps": schedule}


def _member_histogram(masses, m_p: float) -> dict:
    """Halo member counts of every run as (count, how many halos) pairs, so the mass
    function can be re-binned later without the device."""
    out = {}
    for i, m in enumerate(masses):
        n, c = np.unique(np.rint(np.asarray(m) / m_p).astype(np.int64), return_counts=True)
        out[str(i)] = [n.tolist(), c.tolist()]
    return out


def _host(values):
    return values.get() if hasattr(values, "get") else np.asarray(values)


def _pk(ds):
    ds = ds.compute() if hasattr(ds, "compute") else ds
    return _host(ds["k"].values), _host(ds["power"].values), _host(ds["n_modes"].values)


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--n-side", type=int, default=64)
    ap.add_argument("--box", type=float, default=64.0)
    ap.add_argument("--z-init", type=float, default=49.0)
    ap.add_argument("--power", default=None, help="two-column k P table (default E&H)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--outputs", type=float, nargs="*", default=[1.0])
    ap.add_argument("--configs", nargs="+", default=["treepm:standard:0.5:40:float32"])
    ap.add_argument("--kmax", type=float, default=1.0)
    ap.add_argument("--k-linear", type=float, default=0.03)
    ap.add_argument("--no-halos", action="store_true")
    ap.add_argument("--fixed", action="store_true", help="fixed-amplitude ICs")
    ap.add_argument("--paired", action="store_true",
                    help="run each config from the ICs and their sign-flipped pair")
    args = ap.parse_args(argv)
    start(args, "simulation-treepm")
    configs = [parse_config(c) for c in args.configs]

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.models import Cosmology, lpt_ics
    from cosmo_dask.simulation import run

    name = "cpu"
    if args.device == "gpu":
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    env = {"bench": "simulation_treepm", "device": args.device, "device_name": name,
           "date": time.strftime("%Y-%m-%d"), "n_side": args.n_side, "box": args.box,
           "z_init": args.z_init, "power": args.power or "eisenstein_hu", "seed": args.seed,
           "fixed": args.fixed, "paired": args.paired}
    scheduler = "threads" if args.device == "cpu" else "sync"
    analyses = ("power",) if args.no_halos else ("power", "halos")
    final = {}
    with dask.config.set(scheduler=scheduler):
        t0 = time.perf_counter()
        members = [False, True] if args.paired else [False]
        ics_set = []
        for paired in members:
            ics = lpt_ics(args.n_side, box_size=args.box, redshift=args.z_init, seed=args.seed,
                          power_spectrum=args.power, precision="float64",
                          fixed_amplitude=args.fixed, paired=paired)
            ics_set.append(ics.to_device("gpu") if args.device == "gpu" else ics)
        t_ics = time.perf_counter() - t0
        ics = ics_set[0]
        cosmo = Cosmology.coerce(ics.cosmology)
        d_i = float(cosmo.growth_factor(ics.scale_factor))
        for cfg in configs:
            n_mesh = args.n_side * (2 if cfg["method"] == "pm" else 1)
            power, masses, logs, t_run = {}, [], [], 0.0
            for member in ics_set:
                p_ics = _pk(power_spectrum(member, n_mesh=n_mesh))
                t0 = time.perf_counter()
                res = run(member, z_final=0.0, n_steps=cfg["n_steps"], method=cfg["method"],
                          factors=cfg["factors"], theta=cfg["theta"], n_mesh=n_mesh,
                          steps=cfg["steps"], precision=cfg["precision"],
                          outputs=args.outputs, analyses=analyses, write_particles=False)
                t_run += time.perf_counter() - t0
                logs.extend(res.log)
                for z, tables in res.analyses.items():
                    k, p, modes = _pk(tables["power"])
                    power.setdefault(z, []).append((k, p, modes, p_ics[1]))
                    if z == 0.0 and "halos" in tables:
                        masses.append(_host(tables["halos"]["mass"].values))
            log = logs
            row = {"config": cfg["name"], "n_mesh": n_mesh, "run_s": round(t_run, 1),
                   "ics_s": round(t_ics, 1), "steps": len(res.log), "runs": len(ics_set),
                   "fixed": args.fixed,
                   "step_s_median": round(statistics.median(r["seconds"] for r in log), 4),
                   "force_s_median": round(statistics.median(r["force_seconds"] for r in log),
                                           4),
                   "step_s_last": round(log[-1]["seconds"], 4),
                   "softening": res.parameters["softening"]}
            boosts = {}
            for z in sorted(power):
                k, _, modes, _ = power[z][0]
                p = np.mean([m[1] for m in power[z]], axis=0)  # the pair's mean
                p0 = np.mean([m[3] for m in power[z]], axis=0)
                growth = float(cosmo.growth_factor(1.0 / (1.0 + z))) / d_i
                keep = (modes > 0) & (k <= args.kmax)
                boost = p / (p0 * growth**2)
                lin = (modes > 0) & (k < args.k_linear)
                boosts[f"{z:g}"] = {
                    "k": [round(float(v), 5) for v in k[keep]],
                    "boost": [round(float(v), 5) for v in boost[keep]],
                    "linear_ratio": (round(float(np.sum(boost[lin] * modes[lin])
                                                 / np.sum(modes[lin])), 5)
                                     if lin.any() else None),
                    "linear_bins": [round(float(v), 4) for v in boost[lin]],
                    "linear_modes": [int(v) for v in modes[lin]],
                    "members": ([[round(float(v), 5) for v in (m[1] / (m[3] * growth**2))[keep]]
                                 for m in power[z]] if len(power[z]) > 1 else None)}
                if z == 0.0:
                    final[cfg["name"]] = (k[keep], p[keep])
            if masses:
                # the pair's mean mass function: all halos, the volume counted per run
                # the fit's sigma(M) from the run's own linear spectrum (--power), and
                # from EH98 for comparison with earlier logs
                mf_args = (np.concatenate(masses), float(ics.particle_mass),
                           args.box * len(masses) ** (1 / 3), ics.cosmology)
                rows, used = mass_function_rows(*mf_args, power_spectrum=args.power)
                _, used_eh = mass_function_rows(*mf_args)
                row["halos"] = {"n_halos": [int(m.size) for m in masses], "bins": rows,
                                "power": args.power or "eisenstein_hu",
                                "max_abs_ratio_minus_1": used,
                                "max_abs_ratio_minus_1_eh98": used_eh,
                                "member_counts": _member_histogram(masses,
                                                                   float(ics.particle_mass))}
            row["outputs"] = boosts
            emit(env, **row, log=[{k: r[k] for k in ("a", "seconds", "force_seconds")}
                                  for r in log])
        base = configs[0]["name"]
        for cfg in configs[1:]:
            k, p = final[cfg["name"]]
            m = min(p.size, final[base][1].size)  # PM and TreePM meshes differ
            k, ratio = k[:m], p[:m] / final[base][1][:m]
            emit(env, compare=cfg["name"], default=base, kmax=args.kmax,
                 max_abs_ratio_minus_1=round(float(np.max(np.abs(ratio - 1))), 5),
                 k=[round(float(v), 4) for v in k], ratio=[round(float(v), 5) for v in ratio])


if __name__ == "__main__":
    main()
