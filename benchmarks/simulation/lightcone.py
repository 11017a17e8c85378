"""The cost of recording a lightcone on the fly: a PM run with and without it.

2LPT ICs (``--n-side``^3 in ``--box`` Mpc/h at ``--z-init``, float32), ``--steps`` PM steps
to z = 0 (FastPM factors, mesh twice the particles per side), in memory, once without and
once with ``lightcone={"z_max": --z-max}`` (observer at the box centre), after a tiny
warm-up run (compilation); the difference of the two run times, and of the two step
times of each step that records crossings (the run's log), is the lightcone's cost. Also reports
the crossings recorded, their count inside chi(z_max) against nbar 4/3 pi chi^3, and the
worst |pos| - chi(z) over the crossings.

    python -m benchmarks lightcone --n-side 64 --box 256 --steps 20 --z-max 0.2
    python -m benchmarks lightcone --device gpu --n-side 256 --box 1024 --steps 40 --z-max 0.3

Prints one JSON line per run.
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


def main(argv=None):
    ap = box_parser(__doc__, n_side=64, box=256.0, steps=20, method=False)
    ap.add_argument("--z-max", type=float, default=0.2)
    args = ap.parse_args(argv)
    start(args, "lightcone")

    from cosmo_dask.models import lpt_ics
    from cosmo_dask.simulation import run

    env = {**env_of("lightcone", args), "device": args.device, "z_max": args.z_max}
    scheduler = "threads" if args.device == "cpu" else "sync"
    with dask.config.set(scheduler=scheduler):
        ics = lpt_ics(args.n_side, box_size=args.box, redshift=args.z_init, seed=3,
                      precision="float32")
        if args.device == "gpu":
            ics = ics.to_device("gpu")
        # warm-up: the kernels' compilation (a tiny run of the same dtype)
        run(lpt_ics(8, box_size=args.box / 8, redshift=args.z_init, seed=3,
                    precision="float32"), z_final=0.0, n_steps=2,
            lightcone={"z_max": min(args.z_max, 0.05)})
        times, logs = {}, {}
        for cone in (None, {"z_max": args.z_max}):
            t0 = time.perf_counter()
            res = run(ics, z_final=0.0, n_steps=args.steps, lightcone=cone)
            times["with" if cone else "without"] = time.perf_counter() - t0
            logs["with" if cone else "without"] = [r["seconds"] for r in res.log]
            if cone is None:
                continue
            lc = res.lightcone
            pieces = list(lc.attrs["pieces"])
            t0 = time.perf_counter()
            chi = lc.chi.compute()
            z = lc.redshift.compute()
            t_read = time.perf_counter() - t0
    from cosmo_dask.core.backend import host

    chi, z = host(chi), host(z)
    r_max = float(lc.chi_max)
    nbar = args.n_side**3 / args.box**3
    ratio = float((chi <= r_max).sum() / (nbar * 4 / 3 * np.pi * r_max**3))
    from cosmo_dask.models.cosmology import Cosmology
    from cosmo_dask.simulation.lightcone import Distances

    dist = Distances(Cosmology.coerce(res.parameters["cosmology"]), 100.0, 299792.458,
                     1 / (1 + args.z_max))
    worst = float(np.abs(chi - dist.chi_of_z(z)).max()) if chi.size else None
    steps_with = len(pieces)
    extra = times["with"] - times["without"]
    recording = [int(p["step"]) - 1 for p in pieces]
    per_step = [round(logs["with"][k] - logs["without"][k], 3) for k in recording]
    emit(env, run_without_s=round(times["without"], 2), run_with_s=round(times["with"], 2),
         lightcone_s=round(extra, 2), steps_recording=steps_with,
         lightcone_s_per_recording_step=round(extra / max(steps_with, 1), 3),
         step_s_without=round(float(np.median(logs["without"])), 3),
         recording_steps_extra_s=per_step,
         crossings=int(lc.n_particles), count_over_nbar_volume=round(ratio, 5),
         max_abs_r_minus_chi=worst, read_s=round(t_read, 2))


if __name__ == "__main__":
    main()
