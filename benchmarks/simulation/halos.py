"""The FOF halo mass function of an evolved box against Watson et al. (2013, FoF).

2LPT ICs (``--n-side``^3 in ``--box`` Mpc/h at ``--z-init``), ``--steps`` PM steps
(FastPM factors, mesh twice the particles per side) or TreePM to z = 0, FOF with
b = 0.2 mean spacings; ``dn/dlnM`` in bins of 0.2 dex from 100 particle masses,
compared with :func:`cosmo_dask.halos.mass_functions.theory_mass_function`
(``watson2013_fof``, the same Eisenstein & Hu no-wiggle spectrum as the ICs)
averaged over each bin, in the bins holding >= 30 halos.

    python -m benchmarks simulation-halos --n-side 128 --box 256 --steps 40

Prints one JSON line with the per-bin counts and ratios.
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


def mass_function_rows(masses, m_p: float, box: float, cosmology, min_particles: int = 100,
                       min_halos: int = 30, power_spectrum=None):
    """Per-bin ``dn/dlnM`` of FOF masses over Watson et al. 2013 (FoF), 0.2 dex bins from
    ``min_particles`` particle masses; returns ``(rows, max |ratio - 1|)`` over the bins
    holding >= ``min_halos`` halos (None when there is none). ``power_spectrum``: the
    linear spectrum under the fit's sigma(M) (the run's own; default EH98)."""
    from cosmo_dask.halos.mass_functions import mass_function, theory_mass_function

    masses = np.asarray(masses, dtype=np.float64)
    lo = np.log10(min_particles * m_p)
    hi = np.log10(max(masses.max(), 10 ** lo * 1.6)) if masses.size else lo + 0.2
    edges = 10 ** np.arange(lo, hi + 0.2, 0.2)
    mf = mass_function(masses, edges, box)
    rows = []
    for b in range(mf.sizes["mass_bin"]):
        n = int(mf["counts"][b])
        m0, m1 = float(mf["mass_lo"][b]), float(mf["mass_hi"][b])
        grid = np.geomspace(m0, m1, 9)
        theory = float(np.mean(theory_mass_function(grid, model="watson2013_fof",
                                                    cosmology=cosmology,
                                                    power_spectrum=power_spectrum)))
        ratio = float(mf["dn_dlnM"][b]) / theory
        rows.append({"mass_lo": m0, "mass_hi": m1, "counts": n, "ratio": round(ratio, 4),
                     "poisson": round(1 / np.sqrt(n), 4) if n else None})
    used = [abs(r["ratio"] - 1) for r in rows if r["counts"] >= min_halos]
    return rows, (round(max(used), 4) if used else None)


def main(argv=None):
    ap = box_parser(__doc__, n_side=128, box=256.0, steps=40)
    ap.add_argument("--min-halos", type=int, default=30)
    ap.add_argument("--min-particles", type=int, default=100)
    args = ap.parse_args(argv)
    start(args, "simulation-halos")

    from cosmo_dask.halos import fof
    from cosmo_dask.models import lpt_ics
    from cosmo_dask.simulation import run

    env = env_of("simulation_halos", args)
    with dask.config.set(scheduler="threads"):
        ics = lpt_ics(args.n_side, box_size=args.box, redshift=args.z_init, seed=3,
                      precision="float32")
        t0 = time.perf_counter()
        snap = run(ics, z_final=0.0, n_steps=args.steps, method=args.method,
                   precision="float32").snapshot
        t_run = time.perf_counter() - t0
        t0 = time.perf_counter()
        halos = fof(snap, 0.2, min_members=20)
        t_fof = time.perf_counter() - t0
    m_p = float(snap.particle_mass)
    rows, worst = mass_function_rows(halos.catalog["mass"].values, m_p, args.box,
                                     snap.cosmology, args.min_particles, args.min_halos)
    emit(env, particle_mass=m_p, n_halos=halos.n_halos, run_s=round(t_run, 1),
         fof_s=round(t_fof, 1), bins=rows, max_abs_ratio_minus_1=worst,
         n_bins_used=sum(r["counts"] >= args.min_halos for r in rows))


if __name__ == "__main__":
    main()
