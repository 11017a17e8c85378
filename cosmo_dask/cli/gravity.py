"""``cosmo-dask gravity``: accelerations and potentials of a snapshot."""

from __future__ import annotations

import time

import dask

from . import common
from .common import _check_out
from .messages import _say

# --------------------------------------------------------------------------- gravity


def cmd_gravity(args) -> int:
    import math

    import dask.array as da

    from ..gravity import accelerations
    from ..gravity.api import prepare
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    params = dict(method=args.method, theta=args.theta, softening=args.softening,
                  softening_kernel=args.softening_kernel, G=args.G, n_mesh=args.n_mesh,
                  r_split=args.r_split, r_cut=args.r_cut, precision=args.precision,
                  potential=not args.no_potential, max_leaf=args.max_leaf,
                  max_group=args.max_group)
    # every parameter is checked (and the method's module imported) before a cluster
    # starts; values are checked as the store is read (open_snapshot checks every chunk)
    prepared = prepare(snap, check=False, **params)
    resolved = prepared.params
    _check_out(args)
    with common._cluster(args):
        t0 = time.perf_counter()
        acc, _ = accelerations(prepared, out=args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
        acc64 = acc.astype("float64")
        (mean_sq,) = dask.compute(da.mean((acc64 * acc64).sum(axis=1)))
    what = {"tree": f"tree (theta={resolved['theta']:g})", "direct": "direct summation",
            "pm": f"PM {resolved.get('n_mesh')}^3",
            "treepm": f"TreePM {resolved.get('n_mesh')}^3 (theta={resolved['theta']:g}, "
                      f"r_split={resolved.get('r_split', 0):.4g})"}[resolved["method"]]
    soft = (f", softening {resolved['softening']:g} ({resolved['softening_kernel']})"
            if resolved["softening"] > 0 else "")
    _say(f"gravity: {what}{soft}, {resolved['precision']}, G={resolved['G']:g}: "
         f"N={snap.n_particles}, rms |a| = {math.sqrt(float(mean_sq)):.6g}, {dt:.2f} s "
         f"-> {args.out}")
    return 0
