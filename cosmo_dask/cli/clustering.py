"""``cosmo-dask xi``: pair counts and the correlation function of a periodic snapshot."""

from __future__ import annotations

import time

import numpy as np

from ..core.errors import CosmoDaskError
from . import common
from .common import _check_out
from .messages import _say


def xi_edges(args) -> np.ndarray:
    """The separation edges of ``--r-max``, ``--bins`` and ``--r-min``: ``--bins`` equal
    bins from ``--r-min`` (default 0) to ``--r-max``."""
    if args.r_min >= args.r_max:
        raise CosmoDaskError(f"--r-min {args.r_min:g} must be below --r-max {args.r_max:g}")
    return np.linspace(args.r_min, args.r_max, args.bins + 1)


def _los(text):
    return None if text is None else (int(text) if text.isdigit() else text)


def cmd_xi(args) -> int:
    from ..analysis import parameters as ap
    from ..analysis.correlation import (
        check_correlation,
        correlation_function,
        plot_correlation_function,
        write_correlation,
    )
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    edges = xi_edges(args)
    poles = tuple(p for group in args.poles for p in group) if args.poles else None
    if args.mu_bins is None:
        if args.los is not None or poles:
            raise CosmoDaskError("--los and --poles need --mu-bins (the mu bins of xi(s, mu))")
        los, poles = None, (0,)
    else:
        los = _los(args.los if args.los is not None else ap.XI_LOS_DEFAULT)
        poles = poles or ap.POLES
    kwargs = {"mu_bins": args.mu_bins, "los": los, "poles": poles, "n_domains": args.domains}
    check_correlation(snap, edges, **kwargs)  # before a cluster starts
    _check_out(args)
    with common._cluster(args):
        t0 = time.perf_counter()
        ds = correlation_function(snap, edges, **kwargs)
        dt = time.perf_counter() - t0
        path = write_correlation(ds, args.out, overwrite=args.overwrite,
                                 inputs=(args.snapshot,))
    if "multipoles" in ds:
        table = ds["multipoles"].to_pandas().T
        table.columns = [f"xi_{int(ell)}" for ell in ds["ell"].values]
    else:
        table = ds[["dd", "xi"]].to_dataframe()
    print(table.to_string())
    pairs = int(ds["dd"].sum())
    _say(f"xi of {snap.n_particles} particles, {len(edges) - 1} bins to r_max = "
         f"{edges[-1]:g} {ds.attrs['length_unit']}"
         + (f" x {args.mu_bins} mu bins (line of sight {los})" if args.mu_bins else "")
         + f": {pairs} pairs, {dt:.2f} s -> {path}")
    if args.plot:
        plot_correlation_function(ds, args.plot)
        _say(f"xi plot -> {args.plot}")
    return 0
