"""``cosmo-dask`` commands that make, convert, inspect and clean stores: ``generate``,
``ics``, ``simulate``, ``info``, ``convert``, ``clean``."""

from __future__ import annotations

import json
import time

from ..core.checks import check_disk_space
from ..core.errors import CosmoDaskError, ParameterError
from . import common
from .common import _check_out
from .messages import _human_bytes, _say


# --------------------------------------------------------------------------- generate
def _generate_snapshot(args):
    from .. import models

    common = {"seed": args.seed, "precision": args.precision, "chunks": args.chunk_size}
    if args.model in ("plummer", "hernquist", "ferrers"):
        if args.n is None:
            raise CosmoDaskError(f"generate {args.model}: --n (number of particles) is required")
        if args.model == "ferrers":
            return models.ferrers(
                args.n, axes=tuple(args.axes), index=args.index, mass=args.mass, **common
            )
        fn = getattr(models, args.model)
        return fn(args.n, scale=args.scale, mass=args.mass, **common)
    if args.model == "blobs":
        if args.n is None or args.box_size is None:
            raise CosmoDaskError("generate blobs: --n and --box-size are required")
        return models.halo_blobs(args.n, box_size=args.box_size, n_halos=args.n_halos,
                                 redshift=args.redshift or 0.0, **common)
    if args.n_side is None or args.box_size is None:
        raise CosmoDaskError(f"generate {args.model}: --n-side and --box-size are required")
    if args.model == "lattice":
        return models.perturbed_lattice(
            args.n_side, box_size=args.box_size, amplitude=args.amplitude, **common
        )
    if args.redshift is None:
        raise CosmoDaskError("generate zeldovich: --redshift is required")
    return models.zeldovich(args.n_side, box_size=args.box_size, redshift=args.redshift,
                            device="gpu" if args.gpu else "cpu", **common)


def _write_snapshot(args, snap):
    """Write ``snap`` to ``args.out`` on the command's cluster, the output and the disk
    space checked before the cluster starts; the store's path and the write's seconds."""
    _check_out(args)
    check_disk_space(snap.nbytes, args.out, "OUT.zarr")
    with common._cluster(args):
        t0 = time.perf_counter()
        path = snap.to_zarr(args.out, overwrite=args.overwrite)
        return path, time.perf_counter() - t0


def cmd_generate(args) -> int:
    snap = _generate_snapshot(args)
    path, dt = _write_snapshot(args, snap)
    _say(
        f"wrote {args.model} snapshot: N={snap.n_particles} -> {path} "
        f"({_human_bytes(snap.nbytes)}, {dt:.2f} s)"
    )
    return 0


def cmd_ics(args) -> int:
    from ..models import lpt_ics

    snap = lpt_ics(args.n_side, box_size=args.box_size, redshift=args.redshift,
                   order=args.order, power_spectrum=args.power, cosmology=args.cosmology,
                   seed=args.seed, precision=args.precision, chunks=args.chunk_size,
                   fixed_amplitude=args.fixed_amplitude, paired=args.paired,
                   slabs=args.slabs, device="gpu" if args.gpu else "cpu")
    path, dt = _write_snapshot(args, snap)
    power = args.power or "Eisenstein & Hu no-wiggle"
    order = "2LPT" if args.order == 2 else "Zel'dovich (1LPT)"
    field = ", ".join(k for k, on in (("fixed amplitudes", args.fixed_amplitude),
                                      ("paired", args.paired)) if on)
    order += f" ({field})" if field else ""
    _say(f"wrote {order} ICs at z = "
         f"{args.redshift:g}: {args.n_side}^3 particles in {args.box_size:g} Mpc/h, "
         f"P(k) {power} -> {path} ({_human_bytes(snap.nbytes)}, {dt:.2f} s)")
    return 0


def cmd_simulate(args) -> int:
    from ..simulation import run
    from ..simulation.runner import check_run
    from ..store.snapshot import open_snapshot

    ics = open_snapshot(args.ics, device="gpu" if args.gpu else "cpu")
    analyses = tuple(a for a in (args.analyses or "").split(",") if a)
    params = dict(z_final=args.z_final, n_steps=args.n_steps, method=args.method,
                  n_mesh=args.n_mesh, softening=args.softening, theta=args.theta,
                  steps=args.schedule, outputs=args.outputs or (), out=args.out,
                  checkpoint_every=args.checkpoint_every, resume=args.resume,
                  analyses=analyses, precision=args.precision, overwrite=args.overwrite,
                  write_particles=not args.no_particles, show=True)
    if args.lightcone is not None:
        params["lightcone"] = {"z_max": args.lightcone, **(
            {"observer": args.observer} if args.observer is not None else {})}
    elif args.observer is not None:
        raise ParameterError("--observer needs --lightcone Z_MAX")
    check_run(ics, **params)  # every parameter, the ICs and OUT, before a cluster starts
    with common._cluster(args):
        t0 = time.perf_counter()
        res = run(ics, **params)
        dt = time.perf_counter() - t0
    p = res.parameters
    mesh = p.get("n_mesh")
    what = f"{'TreePM' if args.method == 'treepm' else 'PM'} {mesh}^3"
    # the run's output redshifts (with --no-particles none has a snapshot)
    outs = ", ".join(f"{z:g}" for z in res.parameters["outputs"])
    outs += " (analyses only, no particles)" if args.no_particles else ""
    halos = ""
    z_last = min(res.analyses) if res.analyses else None
    if z_last is not None and "halos" in res.analyses[z_last]:
        cat = res.analyses[z_last]["halos"]
        n = int(cat.sizes.get("halo", 0))
        halos = f"; {n} FOF halos at z = {z_last:g}"
    if res.lightcone is not None:
        halos += (f"; lightcone: {res.lightcone.n_particles} crossings up to z = "
                  f"{res.lightcone.z_max:g}")
    _say(f"simulated {ics.n_particles} particles from z = {1 / ics.scale_factor - 1:.4g} to "
         f"{args.z_final:g} in {len(res.log)} steps ({what}); outputs z = {outs}{halos}; "
         f"{dt:.2f} s -> {args.out}")
    return 0


# --------------------------------------------------------------------------- info
def snapshot_info(snap, *, full: bool = True) -> dict:
    """The facts ``cosmo-dask info`` prints, as a dict."""
    info = {
        "path": snap.source,
        "n_particles": snap.n_particles,
        "arrays": {
            k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in snap.arrays.items()
        },
        "fields": {
            k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in snap.fields.items()
        },
        "chunks": {"n_chunks": len(snap.chunks), "particles_per_chunk": max(snap.chunks)},
        "bytes": snap.nbytes,
    }
    info.update({k: v for k, v in snap.attrs.items() if v is not None})
    if snap.ptype is not None:
        info["species"] = {str(t): n for t, n in snap.species().items()}
    report = snap.validate(full=full, raise_errors=False)
    info["validation"] = {"ok": report.ok, "summary": report.summary(), **report.figures}
    return info


def cmd_info(args) -> int:
    from ..store.snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    with common._cluster(args, needed=False):
        t0 = time.perf_counter()
        info = snapshot_info(snap, full=not args.quick)
        info["validation"]["seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        box = info.get("box_size")
        _say(f"snapshot      {info['path']}")
        _say(f"particles     {info['n_particles']}")
        _say(f"box           {'isolated' if box is None else box}")
        if "species" in info:
            _say("species       " + ", ".join(f"type {t}: {n}" for t, n in info["species"].items()))
        if "provenance" in info:
            src = info["provenance"]
            files = src.get("files") or ["?"]
            more = f" (+{len(files) - 1} more file(s))" if len(files) > 1 else ""
            _say(f"imported from {files[0]}{more}, format {src.get('format')}, part types "
                 + ", ".join(map(str, src.get("part_types") or [])))
        for key in ("scale_factor", "redshift", "particle_mass", "G", "lagrangian_shape"):
            if key in info:
                _say(f"{key:<13} {info[key]}")
        for key in ("units", "cosmology"):
            if key in info:
                _say(f"{key:<13} " + ", ".join(f"{k}={v}" for k, v in info[key].items()))
        for name, a in info["arrays"].items():
            _say(f"array {name:<7} {tuple(a['shape'])} {a['dtype']}")
        if info["fields"]:  # one line; the particle axis written N: (N,), (N, 9)
            _say("fields        " + ", ".join(
                f"{name} {('N', *a['shape'][1:])} {a['dtype']}".replace("'N'", "N")
                for name, a in info["fields"].items()))
        _say(
            f"chunks        {info['chunks']['n_chunks']} x <= "
            f"{info['chunks']['particles_per_chunk']} particles"
        )
        _say(f"bytes         {_human_bytes(info['bytes'])}")
        _say(f"validation    {info['validation']['summary']} "
             f"({info['validation']['seconds']:.2f} s)")
    return 0 if info["validation"]["ok"] else 1


# --------------------------------------------------------------------------- convert
#: convert's formats -> the reader (cosmo_dask.io)
CONVERT_FORMATS = {"gadget": "from_gadget_hdf5", "gadget-binary": "from_gadget_binary",
                   "swift": "from_swift"}


def cmd_convert(args) -> int:
    from .. import io

    snap = getattr(io, CONVERT_FORMATS[args.format])(args.input, part_type=args.part_type)
    counts = snap.gadget_info.n_per_type
    if args.units:
        snap = snap.to_units(**args.units)  # lazy: converted as the store is written
    _check_out(args)  # before a cluster starts
    check_disk_space(snap.nbytes, args.out, "OUT.zarr")
    with common._cluster(args):
        path = snap.to_zarr(args.out, overwrite=args.overwrite)
    units = ", ".join(f"{k} {v}" for k, v in (snap.units or {}).items())
    types = ", ".join(f"PartType{t}: {n}" for t, n in counts.items())
    _say(f"converted {args.input} ({types}; N={snap.n_particles}; {units}) -> {path}")
    return 0


# --------------------------------------------------------------------------- demo
def cmd_clean(args) -> int:
    from ..simulation.store import is_simulation_store
    from ..store.atomic import clean, clean_tree, local_path

    # a simulation store: its checkpoint and outputs too
    sim = is_simulation_store(local_path(args.path))
    done = clean_tree(args.path) if sim else clean(args.path)
    for entry, what in done:
        _say(f"{entry}: {what}")
    if not done:
        _say(f"{args.path}: no temporary stores left by earlier writes")
    return 0
