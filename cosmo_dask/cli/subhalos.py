"""``cosmo-dask subhalos SNAP HALOS OUT``: bound subhalos inside a halo store's FOF halos
(:func:`cosmo_dask.halos.subhalos`), written as a subhalo store, with an optional plot of
the satellite mass function."""

from __future__ import annotations

import time

from ..core.errors import CosmoDaskError
from . import common
from .common import _check_out
from .messages import _say


def cmd_subhalos(args) -> int:
    """Every check (parameters, the snapshot, the halo store, the output) before a cluster
    starts, then the subhalos, their store and the --plot."""
    from ..halos.parameters import check_subhalos
    from ..halos.result import open_catalog
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    halos = open_catalog(args.halos)
    check_subhalos(snap, halos, min_members=args.min_members,
                   link_fraction=args.link_fraction, softening=args.softening,
                   tree_threshold=args.tree_threshold)
    _check_out(args)  # before a cluster starts
    with common._cluster(args):
        from ..halos import subhalos

        t0 = time.perf_counter()
        result = subhalos(snap, halos, min_members=args.min_members,
                          link_fraction=args.link_fraction, softening=args.softening,
                          tree_threshold=args.tree_threshold, labels=args.labels)
        path = result.to_zarr(args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
    cat = result.catalog
    n_cen = result.n_subhalos - result.n_satellites
    _say(f"{result.n_subhalos} subhalos ({n_cen} centrals, {result.n_satellites} "
         f"satellites) in {halos.n_halos} halos, {int(cat['n_bound'].sum()) if n_cen else 0} "
         f"bound particles, {dt:.2f} s -> {path}")
    if args.plot:
        from ..halos import plot_subhalo_mass_function

        if result.n_satellites == 0:
            raise CosmoDaskError("--plot: no satellites to plot")
        plot_subhalo_mass_function(result, path=args.plot)
        _say(f"subhalo mass function plot -> {args.plot}")
    return 0
