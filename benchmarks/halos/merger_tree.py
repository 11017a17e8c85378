"""Merger trees of a simulation's halo outputs: the time to build them.

Takes an existing simulation store (``--sim PATH``, run with ``--analyses halos``), or
makes one: 2LPT ICs (``--n-side``^3 in ``--box`` Mpc/h at ``--z-init``), ``--steps`` PM
steps to z = 0 with FOF halos (b = 0.2, 20 members) and their ranked member ids at
``--outputs`` outputs evenly spaced in the scale factor from ``--z-max`` to 0, no
particles written (kept under ``--keep DIR`` when given, else in a temporary directory).

    python -m benchmarks merger-tree --n-side 256 --box 256 --steps 40 --outputs 10
    python -m benchmarks merger-tree --sim sim256 --device gpu

One line per run to ``benchmarks/results/merger_tree.jsonl``: ``tree_s`` (median of
``--repeat`` warm calls of :func:`cosmo_dask.halos.merger_tree`, wall seconds, the id
shuffle and join on NumPy or CuPy chunks after ``--device``), ``ytree_s`` (writing the
consistent-trees file), halos and member rows per output, the links found, and with a
new store ``run_s`` (the whole run, FOF and member ranking at every output included).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import box_parser, emit, start, stderr, wall_median  # noqa: E402


def make_simulation(path: Path, n_side: int, box: float, z_init: float, steps: int,
                    n_outputs: int, z_max: float, n_mesh: int | None = None,
                    particles: bool = False, method: str = "pm", device: str = "cpu",
                    centers: tuple = ()) -> float:
    """Run the store (module docstring); returns its wall seconds."""
    from cosmo_dask.models import lpt_ics
    from cosmo_dask.simulation import run

    a = np.linspace(1.0 / (1.0 + z_max), 1.0, n_outputs)
    outputs = [float(1.0 / x - 1.0) for x in a[:-1]]
    ics = lpt_ics(n_side, box_size=box, redshift=z_init, seed=3, precision="float32",
                  device=device)
    t0 = time.perf_counter()
    run(ics, z_final=0.0, n_steps=steps, outputs=outputs, out=path, analyses=["halos"],
        method=method,
        write_particles=particles, precision="float32", n_mesh=n_mesh,
        analysis_options={"halos": {"centers": tuple(centers)}}, show=True)
    return time.perf_counter() - t0


def mah_against_fit(tree) -> list[dict]:
    """Median M(z)/M0 of the final halos of >= 100 members in two bins of equal count,
    and the Correa et al. (2015) fit at each bin's median M0, per output."""
    from cosmo_dask.halos.merger_trees import correa2015_mah, mass_bins, median_with_lost

    mah = tree.mass_accretion_histories()
    z = mah["redshift"].values
    ratios, m0 = mah["mah"].values, mah["mass0"].values
    cosmo = tree.parameters.get("cosmology")
    out = []
    for mask in mass_bins(tree, 2, min_particles=100):
        mm = float(np.median(m0[mask]))
        out.append({"n_halos": int(mask.sum()), "mass0_median": round(mm, 4),
                    "mass_unit": str(mah["mass0"].attrs.get("units", "")),
                    "redshift": [round(float(v), 4) for v in z],
                    "median": [round(float(v), 4) for v in median_with_lost(ratios[:, mask])],
                    "p16": [round(float(v), 4) for v in np.nanpercentile(ratios[:, mask], 16,
                                                                           axis=1)],
                    "p84": [round(float(v), 4) for v in np.nanpercentile(ratios[:, mask], 84,
                                                                           axis=1)],
                    "correa2015": [round(float(v), 4) for v in correa2015_mah(mm, z, cosmo)]
                    if cosmo else None})
    return out


def mah_m200c(tree, sim) -> list[dict]:
    """As :func:`mah_against_fit` with M200c (``spherical_overdensity`` about each FOF
    halo's most-bound particle, from the outputs' particles: a run made here with ``--so``
    finds those centres) along the same main branches and
    in the same bins (by FOF mass): the mass definition Correa et al. (2015) fit."""
    from cosmo_dask.halos import spherical_overdensity
    from cosmo_dask.halos.merger_trees import correa2015_mah, mass_bins

    zs = [float(z) for z in tree.outputs["redshift"].values]
    m200 = []
    for z in zs:
        so = spherical_overdensity(sim.snapshot(z), sim.halos(z), deltas=("200c",),
                                   center="mbp")
        m200.append(np.asarray(so["M_200c"].values, np.float64))
    branch = tree._branches("mass")
    mm = np.full(branch.shape, np.nan)
    for k, row in enumerate(branch):
        ok = row >= 0
        mm[k, ok] = m200[k][row[ok]]
    ratios = mm / mm[-1]
    ratios[np.isnan(ratios) & (branch < 0)] = 0.0  # an ended branch counts as 0, as above
    cosmo = tree.parameters.get("cosmology")
    out = []
    for mask in mass_bins(tree, 2, min_particles=100):
        sel = mask & np.isfinite(mm[-1])
        m0 = float(np.median(mm[-1][sel]))
        out.append({"n_halos": int(sel.sum()), "m200c0_median": round(m0, 4),
                    "redshift": [round(z, 4) for z in zs],
                    "median": [round(float(v), 4) for v in np.nanmedian(ratios[:, sel], axis=1)],
                    "p16": [round(float(v), 4) for v in np.nanpercentile(ratios[:, sel], 16,
                                                                           axis=1)],
                    "p84": [round(float(v), 4) for v in np.nanpercentile(ratios[:, sel], 84,
                                                                           axis=1)],
                    "correa2015": [round(float(v), 4) for v in correa2015_mah(m0, np.array(zs),
                                                                                cosmo)]})
    return out


def main(argv=None):
    ap = box_parser(__doc__, n_side=64, box=64.0, steps=20)
    ap.add_argument("--sim", default=None, help="an existing simulation store")
    ap.add_argument("--outputs", type=int, default=10, help="halo outputs of a new store")
    ap.add_argument("--z-max", type=float, default=3.0, help="first output of a new store")
    ap.add_argument("--n-tracers", type=int, default=20)
    ap.add_argument("--keep", default=None, help="write the new store here and keep it")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs (median)")
    ap.add_argument("--n-mesh", type=int, default=None, help="PM mesh of a new store "
                    "(default: the run's, twice the particle grid)")
    ap.add_argument("--so", action="store_true", help="also the M200c histories (needs "
                    "the outputs' particles)")
    ap.add_argument("--particles", action="store_true",
                    help="a new store keeps each output's particles (for subhalos at z = 0)")
    args = ap.parse_args(argv)
    start(args, "merger_tree")

    from cosmo_dask.halos import merger_tree
    from cosmo_dask.simulation import open_simulation

    fields = {}
    with tempfile.TemporaryDirectory() as tmp, dask.config.set(scheduler="threads"):
        if args.sim is None:
            path = Path(args.keep) if args.keep else Path(tmp) / "sim"
            stderr(f"[merger-tree] running {args.n_side}^3 with {args.outputs} outputs -> "
                   f"{path}")
            fields.update(n_side=args.n_side, box=args.box, z_init=args.z_init,
                          steps=args.steps, n_mesh=args.n_mesh, method=args.method,
                          run_s=round(make_simulation(path, args.n_side, args.box,
                                                      args.z_init, args.steps, args.outputs,
                                                      args.z_max, args.n_mesh,
                                                      args.particles, args.method,
                                                      args.device,
                                                      ("mbp",) if args.so else ()), 2))
        else:
            path = Path(args.sim)
        sim = open_simulation(path)
        holder = {}

        def build():
            holder["tree"] = merger_tree(sim, n_tracers=args.n_tracers, device=args.device)

        tree_s = wall_median(build, args.repeat)
        tree = holder["tree"]
        t0 = time.perf_counter()
        info = tree.to_ytree(Path(tmp) / "trees.dat")
        ytree_s = time.perf_counter() - t0
    n_halos = [int(n) for n in tree.outputs["n_halos"].values]
    fields["mah"] = mah_against_fit(tree)
    if args.so:
        t0 = time.perf_counter()
        fields["mah_m200c"] = mah_m200c(tree, sim)
        fields["so_s"] = round(time.perf_counter() - t0, 2)
    rows = [int(sim.members(z)["ids"].shape[0]) for z in tree.outputs["redshift"].values]
    linked = tree.links["desc_halo"].values >= 0
    emit(simulation=str(path) if args.sim or args.keep else None,
         n_particles=sim.parameters.get("n_particles"), n_outputs=tree.n_outputs,
         redshifts=[round(float(z), 4) for z in tree.outputs["redshift"].values],
         n_halos=n_halos, member_rows=rows, n_tracers=args.n_tracers,
         n_buckets=tree.parameters["n_buckets"], tree_s=round(tree_s, 3),
         ytree_s=round(ytree_s, 3), links=int(linked.size), linked=int(linked.sum()),
         n_trees=info["n_trees"], n_dropped=info["n_dropped"], **fields)


if __name__ == "__main__":
    main()
