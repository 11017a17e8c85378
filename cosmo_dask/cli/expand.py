"""``cosmo-dask expand``: SCF and MEX expansions of a snapshot."""

from __future__ import annotations

import time

from . import common
from .common import _check_out
from .messages import _say


def cmd_expand(args) -> int:
    import numpy as np

    from ..expansion import MEX, SCF
    from ..expansion.output import write_expansion
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    if args.method == "scf":  # parameters are checked before any cluster starts
        model = SCF(args.nmax, args.lmax, scale_radius=args.scale_radius, center=args.center,
                    precision=args.precision)
        params = {"nmax": args.nmax, "lmax": args.lmax, "scale_radius": args.scale_radius}
    else:
        model = MEX(args.lmax, center=args.center, softening=args.softening,
                    precision=args.precision)
        params = {"lmax": args.lmax, "softening": args.softening}
    params.update(precision=args.precision, source=str(args.snapshot))
    if snap.box_size is not None:  # needs an explicit centre: refused here, reading nothing
        from ..expansion.particles import expansion_input

        expansion_input(snap, center=args.center, defer_checks=True,
                        what=args.method.upper())
    _check_out(args)  # before a cluster starts
    with common._cluster(args):
        t0 = time.perf_counter()
        model.fit(snap)
        acc = pot = None
        if args.method == "mex" or args.accelerations:
            acc = model.accelerations() if args.method == "mex" else model.accelerations(snap.pos)
            pot = model.potential() if args.method == "mex" else model.potential(snap.pos)
        params["center"] = [float(x) for x in model.center_]
        path = write_expansion(args.out, method=args.method, parameters=params,
                               scf=model if args.method == "scf" else None, acc=acc, pot=pot,
                               overwrite=args.overwrite,
                               units=model.units_ if args.method == "mex" else None)
        dt = time.perf_counter() - t0
    where = ", ".join(f"{x:.4g}" for x in params["center"])
    if args.method == "scf":
        a = np.hypot(model.coefficients.sel(part="cos"), model.coefficients.sel(part="sin"))
        sigma = np.sqrt(np.maximum(model.variance.sel(part="cos") + model.variance.sel(
            part="sin"), 0))
        n_terms = int((a > 0).sum())
        significant = int((a > 3 * sigma).sum())
        what = (f"SCF nmax={args.nmax} lmax={args.lmax} r_s={args.scale_radius:g}: "
                f"{significant} of {n_terms} terms above 3 sigma")
    else:
        what = f"MEX lmax={args.lmax} softening={args.softening:g}"
    forces = " with accelerations and potentials" if acc is not None else ""
    _say(f"{what}; centre ({where}); {snap.n_particles} particles{forces}, {dt:.2f} s "
         f"-> {path}")
    return 0
