"""The nonlinear boost of an evolved box against Takahashi halofit (CAMB).

2LPT ICs with CAMB's linear spectrum (``power_spectrum="camb"``), evolved to z = 0
with outputs at z = 1 and 0; the same-seed boost ``P_sim(k, z) / [P_ics(k) (D(z) /
D_i)^2]`` (the box's sample variance cancels; no shot noise is removed: the
particles start on a lattice) against CAMB's ``P_halofit / P_linear`` (Takahashi et
al. 2012) for the same cosmology and sigma8, for 0.05 <= k <= 1 h/Mpc.

    python -m benchmarks simulation-boost --n-side 128 --box 256 --steps 40

``--from FILE [FILE ...]`` skips the run and compares the boosts device runs of
``python -m benchmarks simulation-treepm`` wrote (each of their configs, or ``--config NAME``) with
halofit and with EuclidEmulator2; rows of one config from several logs (other seeds)
are averaged, and their halos pooled into one mass function against Watson et al.
2013. EuclidEmulator2: ``pip install euclidemu2``, which needs GSL (``apt-get install
libgsl-dev pkg-config``); its cosmology at the primordial amplitude CAMB gives for the
run's sigma8, massless neutrinos, w = -1.

Prints one JSON line per redshift with the per-k ratios.
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

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: the logs name files under it


def _camb_results(cosmo, redshifts, kmax, halofit: bool):
    """CAMB results at the cosmology's sigma8 (the primordial amplitude rescaled once)
    and that amplitude ``A_s``."""
    import camb

    h = cosmo.h

    def results(a_s):
        pars = camb.CAMBparams()
        pars.set_cosmology(H0=100 * h, ombh2=cosmo.Omega_b * h * h,
                           omch2=(cosmo.Omega_m - cosmo.Omega_b) * h * h, mnu=0.0, omk=0.0,
                           TCMB=cosmo.T_cmb)
        pars.InitPower.set_params(ns=cosmo.n_s, As=a_s)
        pars.set_matter_power(redshifts=sorted(set(redshifts) | {0.0}, reverse=True),
                              kmax=2 * kmax * h)
        if halofit:
            pars.NonLinearModel.set_params(halofit_version="takahashi")
            pars.NonLinear = camb.model.NonLinear_both
        return camb.get_results(pars)

    first = results(2.1e-9)
    a_s = 2.1e-9 * (cosmo.sigma8 / float(first.get_sigma8_0())) ** 2
    return results(a_s), a_s


def halofit_boost(cosmo, redshifts, kmax):
    """``(k, {z: P_nl / P_lin})`` from CAMB with Takahashi halofit, at the cosmology's
    sigma8."""
    res, _ = _camb_results(cosmo, redshifts, kmax, halofit=True)
    kh, zs, pk_nl = res.get_matter_power_spectrum(minkh=0.01, maxkh=kmax, npoints=400)
    k_lin, z_lin, p_lin = res.get_linear_matter_power_spectrum(hubble_units=True,
                                                               k_hunit=True)
    boost = {}
    for i, z in enumerate(zs):
        j = int(np.argmin(np.abs(np.asarray(z_lin) - z)))
        lin = np.exp(np.interp(np.log(kh), np.log(k_lin), np.log(p_lin[j])))
        boost[round(float(z), 6)] = pk_nl[i] / lin
    return np.asarray(kh), boost


def ee2_boost(cosmo, redshifts):
    """``(k, {z: B(k, z)})`` from EuclidEmulator2 at the cosmology's sigma8 (A_s from CAMB,
    massless neutrinos, w0 = -1, wa = 0); k in h/Mpc."""
    import contextlib
    import io

    _, a_s = _camb_results(cosmo, [0.0], 1.0, halofit=False)
    with contextlib.redirect_stdout(io.StringIO()):  # its import prints a CLASS notice
        import euclidemu2

    emu = euclidemu2.PyEuclidEmulator()
    pars = {"Omega_b": cosmo.Omega_b, "Omega_m": cosmo.Omega_m, "h": cosmo.h,
            "n_s": cosmo.n_s, "A_s": a_s, "m_ncdm": 0.0, "w0_fld": -1.0, "wa_fld": 0.0}
    k, boost = emu.get_boost(pars, list(redshifts))
    return np.asarray(k), {round(float(z), 6): np.asarray(boost[i])
                           for i, z in enumerate(redshifts)}


def _saved_rows(paths, config):
    """The config rows of ``simulation-treepm`` logs, grouped by config name."""
    import json

    groups: dict = {}
    for path in paths:
        for line in open(path):
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if "config" in row and (config is None or row["config"] == config):
                groups.setdefault(row["config"], []).append((str(path), row))
    return groups


def _combined_masses(rows, omega_m: float):
    """Every run's FOF masses rebuilt from the logs' member-count histograms, the
    particle mass, and the number of runs (each a box of the same volume)."""
    masses, runs, m_p = [], 0, None
    for _, row in rows:
        halos = row.get("halos")
        if not halos:
            return None
        # the runs' particle mass, as the ICs set it (1e10 Msun/h)
        m_p = omega_m * 27.7536627 * (row["box"] / row["n_side"]) ** 3 if m_p is None else m_p
        for counts, how_many in halos["member_counts"].values():
            masses.append(np.repeat(np.asarray(counts, dtype=np.float64) * m_p, how_many))
            runs += 1
    return np.concatenate(masses), m_p, runs


def compare_saved(paths, config, env):
    """The boosts of ``python -m benchmarks simulation-treepm`` logs against halofit and EE2. Rows
    of the same config from several logs (other seeds) are averaged: the boost over the
    logs (each already its pair's mean), the mass function over every run's halos."""
    from cosmo_dask.models import Cosmology

    cosmo = Cosmology()  # the runs' default cosmology
    for name, rows in _saved_rows(paths, config).items():
        zs = sorted(float(z) for z in rows[0][1]["outputs"])
        refs = {"halofit": halofit_boost(cosmo, zs, 1.5)}
        try:
            refs["ee2"] = ee2_boost(cosmo, zs)
        except ImportError:
            pass
        info = {**env, "source": [p for p, _ in rows], "config": name,
                "seeds": [r.get("seed") for _, r in rows],
                "runs": sum(r.get("runs", 1) for _, r in rows), "fixed": rows[0][1].get("fixed")}
        for z in zs:
            outs = [r["outputs"][f"{z:g}"] for _, r in rows]
            k = np.asarray(outs[0]["k"])
            if any(o["k"] != outs[0]["k"] for o in outs):
                raise SystemExit(f"{name}: the logs' k bins differ at z = {z:g}")
            per_log = np.asarray([o["boost"] for o in outs])
            boost = per_log.mean(axis=0)
            keep = (k >= 0.05) & (k <= 1.0)
            fields = {}
            for ref_name, (k_ref, b_ref) in refs.items():
                ref = np.interp(np.log(k[keep]), np.log(k_ref), b_ref[round(z, 6)])
                ratio = boost[keep] / ref
                fields[ref_name] = {
                    "ratio": [round(float(v), 4) for v in ratio],
                    "max_abs_ratio_minus_1": round(float(np.max(np.abs(ratio - 1))), 4),
                    "bins_within_3pct": int(np.sum(np.abs(ratio - 1) <= 0.03)),
                    "ratio_at_k1": round(float(ratio[-1]), 4),
                    "per_log_max_abs_ratio_minus_1": [
                        round(float(np.max(np.abs(b[keep] / ref - 1))), 4) for b in per_log]}
            # the spread of the logs' boosts: the error of their mean
            sem = (per_log[:, keep].std(axis=0, ddof=1) / np.sqrt(len(outs))
                   / boost[keep] if len(outs) > 1 else None)
            emit(info, z=z, bins=int(keep.sum()), k=[round(float(v), 4) for v in k[keep]],
                 boost=[round(float(v), 4) for v in boost[keep]],
                 boost_rel_sem=(None if sem is None else [round(float(v), 4) for v in sem]),
                 **fields)
        combined = _combined_masses(rows, cosmo.Omega_m) if len(rows) > 1 else None
        if combined:
            from benchmarks.simulation.halos import mass_function_rows

            masses, m_p, runs = combined
            power = rows[0][1].get("power")
            power = None if power in (None, "eisenstein_hu") else str(HERE / power)
            bins, worst = mass_function_rows(masses, m_p, rows[0][1]["box"] * runs ** (1 / 3),
                                             cosmo.as_dict(), power_spectrum=power)
            used = [b for b in bins if b["counts"] >= 30]
            emit(info, halos_runs=runs, n_halos=int(masses.size), mass_function=bins,
                 max_abs_ratio_minus_1=worst,
                 bins_within_15pct=sum(abs(b["ratio"] - 1) <= 0.15 for b in used),
                 bins_used=len(used))


def main(argv=None):
    ap = box_parser(__doc__, n_side=128, box=256.0, steps=40)
    ap.add_argument("--from", dest="source", nargs="+", default=None,
                    help="compare the boosts of `simulation-treepm` logs (several: "
                         "rows of one config averaged)")
    ap.add_argument("--config", default=None)
    args = ap.parse_args(argv)
    start(args, "simulation-boost")
    if args.source:
        return compare_saved(args.source, args.config, {"bench": "simulation_boost"})

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.models import Cosmology, lpt_ics
    from cosmo_dask.simulation import run

    env = env_of("simulation_boost", args)
    n_mesh = 2 * args.n_side
    with dask.config.set(scheduler="threads"):
        ics = lpt_ics(args.n_side, box_size=args.box, redshift=args.z_init, seed=4,
                      power_spectrum="camb", precision="float32")
        t0 = time.perf_counter()
        res = run(ics, z_final=0.0, n_steps=args.steps, method=args.method, outputs=(1.0,),
                  precision="float32")
        t_run = time.perf_counter() - t0
        p_ics = power_spectrum(ics, n_mesh=n_mesh).compute()
        cosmo = Cosmology.coerce(ics.cosmology)
        k_hf, boost_hf = halofit_boost(cosmo, [1.0, 0.0], 1.5)
        d_i = float(cosmo.growth_factor(ics.scale_factor))
        for z, snap in res.outputs:
            p = power_spectrum(snap, n_mesh=n_mesh).compute()
            k = p["k"].values
            keep = (p["n_modes"].values > 0) & (k >= 0.05) & (k <= 1.0)
            growth = float(cosmo.growth_factor(snap.scale_factor)) / d_i
            boost = p["power"].values[keep] / (p_ics["power"].values[keep] * growth**2)
            ref = np.interp(np.log(k[keep]), np.log(k_hf), boost_hf[round(float(z), 6)])
            ratio = boost / ref
            emit(env, z=round(float(z), 4), run_s=round(t_run, 1),
                 k=[round(float(v), 4) for v in k[keep]],
                 boost=[round(float(v), 4) for v in boost],
                 halofit_boost=[round(float(v), 4) for v in ref],
                 ratio=[round(float(v), 4) for v in ratio],
                 max_abs_ratio_minus_1=round(float(np.max(np.abs(ratio - 1))), 4),
                 ratio_at_k1=round(float(ratio[-1]), 4))


if __name__ == "__main__":
    main()
