"""HOD mocks: populate_hod on the FOF halos of a 128^3 box, beside halotools' Zheng07 mock.

Usage::

    python -m benchmarks hod [--kind blobs|evolved] [--n-side 128] [--box 100]
        [--n-halos 12000] [--seeds 4] [--repeat 3] [--no-halotools]

The box: ``--kind blobs``, :func:`cosmo_dask.models.halo_blobs` (``--n-side``^3
particles in ``--box`` Mpc/h, ``--n-halos`` Plummer halos with a power-law mass
spectrum plus a uniform background, placed uniformly: no two-halo clustering; Planck-like
cosmology, z = 0); ``--kind evolved``, the simulated box of ``python -m benchmarks
halos --kinds evolved`` (2LPT from z = 19 and 40 PM steps to z = 0, box ``--n-side``
Mpc/h, the default cosmology; positions only, cached in the temporary directory by
either workload, so no velocities). FOF (b = 0.2, min 20 members, MBP centres); the halo
mass is the FOF mass (Msun/h), so NFW radii are R_200m of it and concentrations Duffy et
al. (2008).
Zheng07 parameters: halotools' defaults at M_r < -20 (logMmin 12.02, sigma_logM 0.26,
logM0 11.38, logM1 13.31, alpha 1.06).

Rows (stdout and ``benchmarks/results/hod.jsonl``):

* ``hod-populate``: seconds (median of ``--repeat`` after a warm-up, local threaded
  scheduler, all cores) of ``populate_hod`` with NFW satellites and with satellites on
  member particles (the member pass over the labels included), and of halotools'
  ``populate_mock`` on the same halos (a ``UserSuppliedHaloCatalog`` of our masses,
  centres, velocities, R_200m as ``halo_rvir`` and our concentrations as
  ``halo_nfw_conc``), galaxies of each; and the times of the box and of FOF.
* ``hod-occupation``: the mean central and satellite counts per mass bin of our NFW mock
  against the Zheng07 formulas averaged over each bin's halos: chi^2 / dof and the
  largest |z| (Bernoulli and Poisson errors).
* ``hod-wp``: wp(rp) (halotools' ``mock_observables.wp``, pi_max 40 Mpc/h) of our NFW
  and particle mocks and of halotools' mock, each the mean over ``--seeds`` seeds with
  its standard error (scatter over the seeds / sqrt(seeds)), and z of ours (NFW) against
  halotools per rp bin.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start, stderr  # noqa: E402

COSMO = {"Omega_m": 0.3111, "Omega_b": 0.049, "Omega_L": 0.6889, "h": 0.6766,
         "sigma8": 0.8102, "n_s": 0.9665}


def _median_seconds(fn, repeat: int, warm: int = 1):
    for _ in range(warm):
        out = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def main(argv=None) -> int:
    ap = parser(__doc__, repeat=3, devices=("cpu",))
    ap.add_argument("--kind", choices=("blobs", "evolved"), default="blobs")
    ap.add_argument("--n-side", type=int, default=128)
    ap.add_argument("--box", type=float, default=100.0, help="Mpc/h")
    ap.add_argument("--n-halos", type=int, default=12000)
    ap.add_argument("--seeds", type=int, default=4, help="mocks per kind for wp's errors")
    ap.add_argument("--no-halotools", action="store_true")
    args = ap.parse_args(argv)
    start(args, "hod")

    from cosmo_dask.halos import fof, populate_hod
    from cosmo_dask.halos.hod import mean_occupation, nfw_halo_parameters, zheng07_mean_occupation
    from cosmo_dask.halos.parameters import HOD_DEFAULTS
    from cosmo_dask.models import halo_blobs
    from tests.support.hod import halotools_wp, halotools_zheng07

    params = dict(HOD_DEFAULTS["zheng07"])
    n = args.n_side**3
    t0 = time.perf_counter()
    if args.kind == "blobs":
        snap = halo_blobs(n, box_size=args.box, n_halos=args.n_halos, seed=1,
                          cosmology=COSMO).persist()
        box = args.box
    else:
        from benchmarks.halos.fof import particles
        from cosmo_dask.models import Cosmology
        from cosmo_dask.models.zeldovich_ics import RHO_CRIT_1E10, ZELDOVICH_UNITS
        from cosmo_dask.store.snapshot import Snapshot

        pos, box = particles(args.n_side, "evolved")
        cosmo = Cosmology()  # lpt_ics' default
        snap = Snapshot.from_arrays(pos, box_size=box, scale_factor=1.0,
                                    particle_mass=cosmo.Omega_m * RHO_CRIT_1E10 * box**3 / n,
                                    cosmology=cosmo.as_dict(), units=dict(ZELDOVICH_UNITS))
    t_box = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = fof(snap)
    t_fof = time.perf_counter() - t0
    stderr(f"{res}; box {t_box:.1f} s, fof {t_fof:.1f} s")
    halo = nfw_halo_parameters(res, snapshot=snap)
    centres = res.catalog.mbp_position.values
    vel = (res.catalog.velocity.values if "velocity" in res.catalog
           else np.zeros_like(centres))

    def ours(seed, satellites="nfw"):
        return populate_hod(res, params=params, seed=seed, satellites=satellites,
                            snapshot=snap)

    def theirs(seed):
        return halotools_zheng07(centres, vel, halo["mass"], halo["radius"],
                                 halo["concentration"], box, params, seed=seed)

    t_nfw, gal = _median_seconds(lambda: ours(0), args.repeat)
    t_part, gal_p = _median_seconds(lambda: ours(0, "particles"), args.repeat)
    row = {"workload": "hod-populate", "kind": args.kind, "particles": n, "box_mpc_h": box,
           "halos": res.n_halos, "box_s": round(t_box, 2), "fof_s": round(t_fof, 2),
           "nfw_s": round(t_nfw, 4), "nfw_galaxies": gal.n_particles,
           "particles_s": round(t_part, 4), "particles_galaxies": gal_p.n_particles,
           "threads": os.cpu_count(), "mass": halo["definition"],
           "concentration": halo["concentration_source"]}
    if not args.no_halotools:
        t_ht, pos_ht = _median_seconds(lambda: theirs(0), args.repeat)
        row.update(halotools_s=round(t_ht, 4), halotools_galaxies=len(pos_ht),
                   ratio_halotools_over_nfw=round(t_ht / t_nfw, 2))
    emit(row)

    # occupations against the formulas
    mass = halo["mass"]
    good = mass[mass > 0]
    edges = np.logspace(np.log10(good.min()), np.log10(good.max()) + 1e-9, 13)
    occ = mean_occupation(gal, mass, edges)
    ncen, nsat = zheng07_mean_occupation(np.log10(mass), params)
    which = np.digitize(mass, edges) - 1
    zs = []
    for b in range(edges.size - 1):
        sel = which == b
        k = sel.sum()
        if k == 0:
            continue
        for meas, exp, var in ((occ.mean_ncen[b], ncen[sel].mean(),
                                (ncen[sel] * (1 - ncen[sel])).sum() / k**2),
                               (occ.mean_nsat[b], nsat[sel].mean(), nsat[sel].sum() / k**2)):
            if var > 0:
                zs.append((float(meas) - exp) / np.sqrt(var))
    zs = np.array(zs)
    emit({"workload": "hod-occupation", "kind": args.kind, "halos": res.n_halos,
          "galaxies": gal.n_particles,
          "bins": int(edges.size - 1), "dof": int(zs.size),
          "chi2_per_dof": round(float((zs**2).mean()), 3),
          "max_abs_z": round(float(np.abs(zs).max()), 2)})

    # wp(rp): the mean over seeds of each kind
    rp = np.logspace(-1.0, np.log10(min(20.0, box / 5)), 11)
    pi_max = min(40.0, box / 4)
    kinds = {"nfw": lambda s: ours(s).pos.compute(),
             "particles": lambda s: ours(s, "particles").pos.compute()}
    if not args.no_halotools:
        kinds["halotools"] = lambda s: theirs(s + 1000)
    wps = {k: np.array([halotools_wp(f(s), box, rp, pi_max) for s in range(args.seeds)])
           for k, f in kinds.items()}
    mean = {k: v.mean(0) for k, v in wps.items()}
    err = {k: v.std(0, ddof=1) / np.sqrt(args.seeds) for k, v in wps.items()}
    centres_rp = np.sqrt(rp[:-1] * rp[1:])
    for i, r in enumerate(centres_rp):
        out = {"workload": "hod-wp", "kind": args.kind, "rp_mpc_h": round(float(r), 4),
               "pi_max": pi_max, "seeds": args.seeds}
        for k in wps:
            out[f"wp_{k}"] = round(float(mean[k][i]), 3)
            out[f"err_{k}"] = round(float(err[k][i]), 3)
        if "halotools" in wps:
            out["z_nfw_vs_halotools"] = round(float(
                (mean["nfw"][i] - mean["halotools"][i])
                / np.hypot(err["nfw"][i], err["halotools"][i])), 2)
        emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
