"""``cosmo-dask density`` (a painted mesh or PSE densities), ``cosmo-dask power`` and
``cosmo-dask bispectrum``."""

from __future__ import annotations

import time

from . import common
from .common import _check_out, _theory_cosmology
from .messages import _say


# --------------------------------------------------------------------------- density, power
def cmd_density(args) -> int:
    from ..density import paint
    from ..density.mesh_store import write_mesh
    from ..density.painting import particles_input
    from ..density.parameters import check_n_mesh
    from ..store.snapshot import open_snapshot

    if args.method == "pse":
        return _density_pse(args)
    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    # before a cluster starts: the mesh side, the box and the masses (the mesh's memory is
    # checked by paint against the workers just started)
    check_n_mesh(args.n_mesh, "paint")
    particles_input(snap, None, args.box_size, what="paint")
    box = args.box_size if args.box_size is not None else snap.box_size
    _check_out(args)  # before a cluster starts
    with common._cluster(args):
        # the mesh size is checked against the memory of the workers just started
        mesh = paint(snap, n_mesh=args.n_mesh, scheme=args.method, box_size=args.box_size)
        t0 = time.perf_counter()
        path = write_mesh(args.out, mesh, box_size=box, scheme=args.method,
                          overwrite=args.overwrite, attrs={"source": str(args.snapshot)},
                          units=snap.units)
        dt = time.perf_counter() - t0
    _say(f"{args.method.upper()} mesh {args.n_mesh}^3 of {snap.n_particles} particles "
         f"(box {box:g}), {dt:.2f} s -> {path}")
    if args.plot:
        from ..density.mesh_store import open_mesh
        from ..plot.density import plot_mesh_slice

        plot_mesh_slice(open_mesh(path)[0], box, path=args.plot)
        _say(f"slice plot -> {args.plot}")
    return 0


def _density_pse(args) -> int:
    import numpy as np

    from ..density import pse_density
    from ..density.parameters import check_block
    from ..density.pse import check_parameters
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    _check_out(args)  # before a cluster starts
    shape = check_parameters(snap, patch_size=args.patch_size, max_level=args.max_level,
                             max_tets_per_node=args.max_tets_per_node,
                             strategy=args.strategy)[0]
    check_block(args.block, shape)
    with common._cluster(args):
        t0 = time.perf_counter()
        octree = pse_density(snap, patch_size=args.patch_size, max_level=args.max_level,
                             max_tets_per_node=args.max_tets_per_node, strategy=args.strategy,
                             block=args.block)
        path = octree.to_zarr(args.out, overwrite=args.overwrite)
        total = octree.total_mass()
        dt = time.perf_counter() - t0
        if args.plot:  # the patches live on the cluster: plot before it closes
            octree.plot_slice(path=args.plot)
    levels = np.bincount(octree.level)
    hist = ", ".join(f"L{lev}: {n}" for lev, n in enumerate(levels) if n)
    want = float(snap.particle_masses().sum().compute())
    _say(f"PSE density of {snap.n_particles} particles ({octree.attrs['n_tets']} tetrahedra): "
         f"{octree.n_leaves} leaves of {args.patch_size}^3 ({hist}), effective "
         f"{octree.effective_resolution}^3, strategy {octree.attrs['strategy']}; "
         f"mass {total:.6g} of {want:.6g} (rel. diff {total / want - 1:.1e}), {dt:.2f} s "
         f"-> {path}")
    if args.plot:
        _say(f"slice plot -> {args.plot}")
    return 0


def _linear_power(args, snap, ds):
    """A plot's theory: the linear P(k) at the snapshot's scale factor in the product's
    length unit (``--cosmology``/``--sigma8`` or the snapshot's cosmology), or None (with a
    line saying why when a cosmology is known but the scale factor is not)."""
    cosmo = _theory_cosmology(args, snap)
    if cosmo is None:
        return None
    if not snap.scale_factor:
        _say("--plot: the snapshot has no scale factor: the plot shows the measurement only")
        return None
    from ..analysis import linear_power

    return linear_power(cosmo, snap.scale_factor, ds.attrs["length_unit"])


def cmd_power(args) -> int:
    from ..analysis import plot_power_spectrum, power_spectrum
    from ..analysis.parameters import check_los_poles
    from ..density.painting import particles_input
    from ..density.parameters import check_n_mesh
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    poles = args.poles
    # before a cluster starts: the multipoles, the mesh side, the box and masses, and the
    # plot's theory cosmology (the mesh's memory is checked against the workers started)
    check_los_poles(snap.los if args.los is None else args.los, poles)  # redshift space: its own
    check_n_mesh(args.n_mesh, "power")
    particles_input(snap, None, None, what="power")
    if args.plot:
        _theory_cosmology(args, snap, say=False)
    with common._cluster(args):
        t0 = time.perf_counter()
        ds = power_spectrum(snap, n_mesh=args.n_mesh, scheme=args.scheme,
                            interlace=not args.no_interlace, los=args.los, poles=poles)
        ds = ds.compute()
        dt = time.perf_counter() - t0
    if args.out:
        ds.to_netcdf(args.out) if args.out.endswith(".nc") else ds.to_dataframe().to_csv(
            args.out)
    else:
        print(ds[["power", "n_modes"]].to_dataframe().to_string())
    _say(f"P(k) of {snap.n_particles} particles, {args.n_mesh}^3 {args.scheme.upper()} "
         f"{'interlaced ' if not args.no_interlace else ''}mesh, shot noise "
         f"{float(ds['shot_noise']):.4g} (not subtracted), {dt:.2f} s"
         + (f" -> {args.out}" if args.out else ""))
    if args.plot:
        plot_power_spectrum(ds, args.plot, reference=_linear_power(args, snap, ds))
        _say(f"P(k) plot -> {args.plot}")
    return 0


def cmd_bispectrum(args) -> int:
    import numpy as np

    from ..analysis.bispectrum import (
        bispectrum,
        plot_reduced_bispectrum,
        tree_level_bispectrum,
        write_bispectrum,
    )
    from ..analysis.parameters import check_bispectrum_bins
    from ..density.painting import particles_input
    from ..density.parameters import check_n_mesh
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    # before a cluster starts: the mesh side, the box, masses and bins, the output and the
    # plot's theory cosmology (the shells' memory is checked against the workers started)
    n = check_n_mesh(args.n_mesh, "bispectrum")
    box = particles_input(snap, None, None, what="bispectrum")[2]
    check_bispectrum_bins(args.k_bins, n, box, "bispectrum")
    _check_out(args)
    if args.plot:
        _theory_cosmology(args, snap, say=False)
    k_bins = args.k_bins if isinstance(args.k_bins, int) else np.asarray(args.k_bins)
    with common._cluster(args):
        t0 = time.perf_counter()
        ds = bispectrum(snap, k_bins, n_mesh=n, scheme=args.scheme,
                        interlace=not args.no_interlace,
                        subtract_shot_noise=not args.no_shot_noise)
        dt = time.perf_counter() - t0
    ds.attrs["source"] = str(args.snapshot)
    path = write_bispectrum(ds, args.out, overwrite=args.overwrite, inputs=(args.snapshot,))
    _say(f"bispectrum of {snap.n_particles} particles, {n}^3 {args.scheme.upper()} "
         f"{'interlaced ' if not args.no_interlace else ''}mesh: {ds.sizes['triangle']} "
         f"triangle bins of {ds.sizes['k']} k bins, {dt:.2f} s -> {path}")
    if args.plot:
        power = _linear_power(args, snap, ds)
        reference = None if power is None else tree_level_bispectrum(ds, power)
        plot_reduced_bispectrum(ds, args.plot, reference=reference)
        _say(f"Q plot -> {args.plot}")
    return 0
