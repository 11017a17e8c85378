"""``cosmo-dask trees``: merger trees of a simulation's halo outputs."""

from __future__ import annotations

import time

from ..core.errors import CosmoDaskError
from . import common
from .messages import _say


def _check_plot(path: str | None) -> None:
    if path is None:
        return
    from ..plot.formats import figure_formats

    suffix = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if suffix not in figure_formats():
        raise CosmoDaskError(f"--plot {path}: unknown figure format {suffix!r}; use one of "
                             f"{', '.join(figure_formats())}")


def cmd_trees(args) -> int:
    from ..halos.merger_trees import (
        FORMAT,
        YTREE_FILE,
        check_merger_tree,
        merger_tree,
        plot_mass_accretion,
        plot_tree,
    )
    from ..simulation.store import open_simulation
    from ..store.atomic import check_writable_target

    # every check before any work: the simulation, the parameters, OUT, --plot
    sim = open_simulation(args.simulation)
    check_merger_tree(sim, n_tracers=args.n_tracers, n_buckets=args.buckets)
    check_writable_target(args.out, overwrite=args.overwrite, what="merger tree store",
                          fmt=FORMAT, inputs=[str(sim.path)])
    _check_plot(args.plot)
    _check_plot(args.plot_tree)
    if args.halo is not None:  # an index of the last halo output's catalog
        last = [e for e in sim.outputs if e.get("halos")][-1]
        n_final = int(sim.halos(last["redshift"]).sizes.get("halo", 0))
        if not 0 <= args.halo < n_final:
            raise CosmoDaskError(f"--halo {args.halo}: the last halo output (z = "
                                 f"{float(last['redshift']):g}) has {n_final} halos; give "
                                 f"an index in [0, {n_final})")
    with common._cluster(args, needed=False):
        t0 = time.perf_counter()
        tree = merger_tree(sim, n_tracers=args.n_tracers, n_buckets=args.buckets,
                           device="gpu" if args.gpu else "cpu")
        path = tree.to_zarr(args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
    linked = tree.links["desc_halo"].values >= 0
    _say(f"{tree.n_outputs} halo outputs, {int(tree.outputs['n_halos'].values[-1])} trees "
         f"(z = {tree.outputs['redshift'].values[-1]:g} halos), {int(linked.sum())} of "
         f"{linked.size} halos linked to a descendant, {dt:.2f} s -> {path} "
         f"({YTREE_FILE}: consistent-trees, ytree.load reads it)")
    if args.plot:
        plot_mass_accretion(tree, path=args.plot)
        _say(f"mass accretion histories -> {args.plot}")
    if args.plot_tree:
        plot_tree(tree, args.halo or 0, path=args.plot_tree)
        _say(f"merger tree of halo {args.halo or 0} -> {args.plot_tree}")
    return 0
