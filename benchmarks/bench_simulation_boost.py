"""The nonlinear boost of an evolved box against Takahashi halofit (CAMB).

2LPT ICs with CAMB's linear spectrum (``power_spectrum="camb"``), evolved to z = 0
with outputs at z = 1 and 0; the same-seed boost ``P_sim(k, z) / [P_ics(k) (D(z) /
D_i)^2]`` (the box's sample variance cancels; no shot noise is removed: the
particles start on a lattice) against CAMB's ``P_halofit / P_linear`` (Takahashi et
al. 2012) for the same cosmology and sigma8, for 0.05 <= k <= 1 h/Mpc.

    python benchmarks/bench_simulation_boost.py --n-side 128 --box 256 --steps 40

``--from FILE`` skips the run and compares the boosts a device run of
``bench_simulation_treepm.py`` wrote (each of its configs, or ``--config NAME``) with
halofit and with EuclidEmulator2 (``pip install euclidemu2``, which needs GSL:
``apt-get install libgsl-dev pkg-config``; its cosmology at the primordial amplitude
CAMB gives for the run's sigma8, massless neutrinos, w = -1).

Prints one JSON line per redshift with the per-k ratios.
"""

from __future__ import annotations

import time

import dask
import numpy as np
from timing import box_parser, emit, env_of


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


def compare_saved(path, config, env):
    """The boosts of a ``bench_simulation_treepm.py`` log against halofit and EE2."""
    import json

    from cosmo_dask.models import Cosmology

    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    rows = [r for r in rows if "config" in r and (config is None or r["config"] == config)]
    for row in rows:
        cosmo = Cosmology()  # the runs' default cosmology
        zs = sorted(float(z) for z in row["outputs"])
        refs = {"halofit": halofit_boost(cosmo, zs, 1.5)}
        try:
            refs["ee2"] = ee2_boost(cosmo, zs)
        except ImportError:
            pass
        for z in zs:
            out = row["outputs"][f"{z:g}"]
            k, boost = np.asarray(out["k"]), np.asarray(out["boost"])
            keep = (k >= 0.05) & (k <= 1.0)
            fields = {}
            for name, (k_ref, b_ref) in refs.items():
                ref = np.interp(np.log(k[keep]), np.log(k_ref), b_ref[round(z, 6)])
                ratio = boost[keep] / ref
                fields[name] = {"ratio": [round(float(v), 4) for v in ratio],
                                "max_abs_ratio_minus_1": round(float(np.max(np.abs(ratio - 1))),
                                                               4),
                                "ratio_at_k1": round(float(ratio[-1]), 4)}
            emit({**env, "source": str(path), "config": row["config"],
                  "runs": row.get("runs", 1), "fixed": row.get("fixed")}, z=z,
                 k=[round(float(v), 4) for v in k[keep]],
                 boost=[round(float(v), 4) for v in boost[keep]], **fields)


def main(argv=None):
    ap = box_parser(__doc__, n_side=128, box=256.0, steps=40)
    ap.add_argument("--from", dest="source", default=None,
                    help="compare the boosts of a bench_simulation_treepm.py log")
    ap.add_argument("--config", default=None)
    args = ap.parse_args(argv)
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
