"""The ``cosmo-dask`` command.

::

    cosmo-dask [--scheduler ADDR] [--gpu|--cpu] [--workers N] [--verbose] COMMAND ...

    generate {plummer,hernquist,ferrers,lattice,zeldovich} OUT.zarr [options]
    info SNAP [--quick] [--json]
    convert gadget|gadget-binary|swift IN OUT.zarr [--part-type 1|0,1,4|all] [--units L,V,M]
    halos SNAP OUT.zarr [--linking-length 0.2] [--centers mbp,mcp] [--so 200c,200m,vir]
    gravity SNAP OUT.zarr [--method tree|direct|pm|treepm] [--theta 0.5] [--softening EPS]
    demo [--dir DIR] [--n-side 64]

Bad input exits with status 2 and one line ``cosmo-dask: error: ...`` naming
the problem and the option at fault; any other failure (a lost scheduler
included) exits with status 1 and one line; ``--verbose`` adds the traceback.
Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Sequence

import dask

from . import __version__
from .checks import PRECISIONS, check_disk_space
from .errors import CosmoDaskError


# --------------------------------------------------------------------------- helpers
def _cosmology_overrides(text: str) -> dict[str, float]:
    """``Omega_m=0.31,sigma8=0.81`` -> {"Omega_m": 0.31, "sigma8": 0.81}."""
    from .models.cosmology import THEORY_KEYS

    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in (*THEORY_KEYS, "Omega_L"):
            raise argparse.ArgumentTypeError(
                f"expected KEY=VALUE pairs with keys among {', '.join((*THEORY_KEYS, 'Omega_L'))}"
                f", got {item!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}: expected a number, got {value!r}") from None
        if not math.isfinite(out[key]):
            raise argparse.ArgumentTypeError(f"{key}: expected a finite number, got {value!r}")
    return out


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    """``0,2,4`` -> (0, 2, 4)."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 0,2,4, got {text!r}") from None


def _finite_float(text: str) -> float:
    """A finite number (``nan``, ``inf`` and overflowing values such as ``1e999`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``PROG: error: MESSAGE (see PROG
    --help)``, exit status 2 (argparse's own prints the whole usage first)."""

    def error(self, message: str):
        text = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {text} (see '{self.prog} --help')\n")


def _add_cluster_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("cluster")
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=default,
        help="Dask scheduler address or scheduler file (else COSMO_DASK_SCHEDULER, "
        "else a local cluster)",
    )
    dev = group.add_mutually_exclusive_group()
    dev.add_argument(
        "--gpu",
        dest="gpu",
        action="store_const",
        const=True,
        default=default,
        help="require a local GPU cluster (dask-cuda)",
    )
    dev.add_argument(
        "--cpu",
        dest="gpu",
        action="store_const",
        const=False,
        default=default,
        help="use a CPU LocalCluster even if GPUs are present",
    )
    group.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        default=default,
        help="workers of a new local cluster",
    )
    group.add_argument(
        "--dashboard-address",
        metavar="HOST:PORT",
        default=default,
        help="dashboard of a new local cluster (default 127.0.0.1:8787, this machine only; "
        "':8787' serves every interface)",
    )
    for flag, what in (("--tls-ca-file", "certificate authority (PEM) of a tls:// scheduler"),
                       ("--tls-cert", "this client's TLS certificate (PEM)"),
                       ("--tls-key", "this client's TLS private key (PEM)")):
        group.add_argument(flag, metavar="FILE", default=default, help=what + " (or dask's "
                           "distributed.comm.tls.* configuration)")
    group.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="show tracebacks and more detail",
    )
    group.add_argument(
        "--no-verify",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="read input stores without checking each chunk against the CRC-32 recorded "
        "when it was written (checked by default)",
    )


@contextlib.contextmanager
def _cluster(args, needed: bool = True):
    """A client for the command: the asked scheduler, or a local cluster when ``needed``."""
    from .cluster import connect

    gpu = "auto" if args.gpu is None else args.gpu
    if not needed and args.scheduler is None and args.gpu is None and args.workers is None:
        yield None
        return
    address = scheduler_file = None
    if args.scheduler:
        if os.path.isfile(args.scheduler):
            scheduler_file = args.scheduler
        else:
            address = args.scheduler
    extra = {} if args.dashboard_address is None else {
        "dashboard_address": args.dashboard_address}
    if not args.verbose:  # a new local cluster's workers and scheduler log nothing to
        # stderr (a failed task's "Compute Failed" block, its traceback): main reports the
        # failure in one line; --verbose shows them
        extra["silence_logs"] = logging.CRITICAL
    tls = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if any(tls):
        if not all(tls):
            raise CosmoDaskError("--tls-ca-file, --tls-cert and --tls-key go together (the "
                                 "scheduler's CA, this client's certificate and its key)")
        for path in tls:
            if not os.path.isfile(path):
                raise CosmoDaskError(f"{path}: no such TLS file")
        from distributed import Security

        extra["security"] = Security(tls_ca_file=tls[0], tls_client_cert=tls[1],
                                     tls_client_key=tls[2], require_encryption=True)
    client = connect(
        address, scheduler_file=scheduler_file, gpu=gpu, n_workers=args.workers, quiet=False,
        **extra)
    args._client = client  # for main's message if the scheduler is lost
    args._scheduler_address = getattr(client.scheduler, "address", None)
    with _one_line_logs(not args.verbose):
        try:
            if args.scheduler:  # an existing cluster: do its workers see our paths?
                from .cluster import check_worker_paths

                check_worker_paths(client, inputs=[getattr(args, n, None) for n in (
                    "snapshot", "input")], outputs=[] if args.func is cmd_power else [
                        getattr(args, "out", None)])
            yield client
        except BaseException as exc:  # judged before the client closes: main reports it
            args._scheduler_lost = _lost_scheduler(exc, client)
            if args._scheduler_lost and not args.verbose:
                _mute_distributed_logs()
            raise
        finally:
            with contextlib.suppress(Exception):  # a lost scheduler is reported by main
                client.close()


#: exceptions of futures cancelled because something else failed (reported by main)
_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)


class _OneLineLog(logging.Filter):
    """Log records with the exception's type and message instead of its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "distributed.batched" and record.levelno < logging.WARNING:
            # "Batched Comm Closed": logged the moment the scheduler goes, before main
            # judges the exception (it reports a lost connection itself)
            return False
        if record.exc_info or record.exc_text:
            exc = record.exc_info[1] if record.exc_info else None
            if isinstance(exc, _CANCELLED):  # cancelled by a failure main reports itself
                return False
            text = record.getMessage()
            if exc is not None:
                what = " ".join(f"{type(exc).__name__}: {exc}".split()).rstrip(": ")
                text = f"{text} ({what})" if text.strip() else what
            record.msg, record.args = text, None
            record.exc_info = record.exc_text = None
        record.stack_info = None
        return True


class _MuteDistributed(logging.Filter):
    """Drops the records of distributed's (and tornado's) loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(("distributed", "tornado"))


def _log_handlers() -> set[logging.Handler]:
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    return {h for lg in loggers for h in lg.handlers}


def _mute_distributed_logs() -> None:
    """Silence distributed's loggers for the rest of this process: once the scheduler is
    gone the client logs reconnection attempts and cancelled futures while it closes, and
    the one line main prints says all there is to say."""
    mute = _MuteDistributed()
    for h in _log_handlers():
        h.addFilter(mute)


@contextlib.contextmanager
def _one_line_logs(enabled: bool = True):
    """No tracebacks from the loggers (distributed's) while the cluster is up."""
    if not enabled:
        yield
        return
    handlers = _log_handlers()
    one_line = _OneLineLog()
    for h in handlers:
        h.addFilter(one_line)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(one_line)


def _check_files(args) -> None:
    """Refuse, before any work, a --plot or --out file that would replace an existing file
    (without --overwrite), lies inside a Zarr store (an input store too), cannot be created
    there, or has a format this command cannot write."""
    from pathlib import Path

    from .atomic import check_can_create, inside_store

    for flag, path in (("--plot", getattr(args, "plot", None)),
                       ("--out", getattr(args, "out", None) if args.func is cmd_power else None)):
        if not path:
            continue
        p = Path(path).expanduser()
        suffix = p.suffix.lower().lstrip(".")
        if flag == "--plot":
            from matplotlib.figure import Figure

            formats = sorted(Figure().canvas.get_supported_filetypes())
            if suffix not in formats:
                raise CosmoDaskError(f"{flag} {path}: matplotlib cannot write "
                                     f"'.{suffix}' files; use one of .{', .'.join(formats)}")
        elif suffix not in ("csv", "nc"):
            raise CosmoDaskError(f"{flag} {path}: the table is written as .csv or .nc")
        outer = inside_store(Path(os.path.realpath(p)))  # the input store among them
        if outer is not None:
            raise CosmoDaskError(f"{flag} {path}: lies inside the Zarr store {outer}; "
                                 "write it outside")
        if p.is_dir():
            raise CosmoDaskError(f"{flag} {path}: is a directory; give a file name")
        if p.exists() and not getattr(args, "overwrite", False):
            raise CosmoDaskError(f"{flag} {path}: already exists; pass --overwrite to "
                                 "replace it")
        if not p.parent.is_dir():
            raise CosmoDaskError(f"{flag} {path}: directory {p.parent} does not exist")
        check_can_create(p.parent, p, "file")


def _output_kind(args) -> tuple[str, str]:
    """(what, format) of the store the command writes."""
    name = args.func.__name__
    if name in ("cmd_generate", "cmd_convert"):
        from .validation import FORMAT
        return "snapshot store", FORMAT
    if name == "cmd_halos":
        from .halos.result import FORMAT
        return "halo store", FORMAT
    if name == "cmd_expand":
        from .expansion.output import FORMAT
        return "expansion store", FORMAT
    if name == "cmd_gravity":
        from .gravity.output import FORMAT
        return "gravity store", FORMAT
    if getattr(args, "method", None) == "pse":
        from .density.octree_store import FORMAT
        return "density octree store", FORMAT
    from .density.mesh_store import FORMAT
    return "mesh store", FORMAT


def _check_out(args) -> None:
    """Refuse, before any work, an output that is the input, lies inside or around it, lies
    inside a Zarr store, exists (without --overwrite), or is no store of this kind."""
    from .atomic import check_writable_target

    what, fmt = _output_kind(args)
    inputs = [getattr(args, name, None) for name in ("snapshot", "input")]
    check_writable_target(args.out, overwrite=args.overwrite, what=what, fmt=fmt,
                          inputs=[i for i in inputs if i])


def _say(text: str) -> None:
    print(text, flush=True)


def _theory_cosmology(args, snap, say: bool = True):
    """The cosmology of a --plot's theory curve: the snapshot's, with --sigma8 and
    --cosmology on top; None (after one line saying what is missing, unless ``say`` is
    False: the check before work) when a parameter the curve needs is known to neither.
    A CosmoDaskError when the values are no valid cosmology."""
    from .models.cosmology import Cosmology

    overrides = dict(args.cosmology or {})
    if args.sigma8 is not None:
        overrides["sigma8"] = args.sigma8
    if not say:
        return Cosmology.for_theory(snap.cosmology, overrides)[0]
    if not snap.cosmology and not overrides:
        _say("--plot: the snapshot carries no cosmology, so the plot shows the measurement "
             "only (pass --cosmology Omega_m=...,Omega_b=...,h=...,n_s=... --sigma8 ... "
             "for the theory curve)")
        return None
    cosmo, missing = Cosmology.for_theory(snap.cosmology, overrides)
    if missing:
        flags = " ".join("--sigma8 VALUE" if k == "sigma8" else f"--cosmology {k}=VALUE"
                         for k in missing)
        _say(f"--plot: the theory curve needs {', '.join(missing)}, which the snapshot does "
             f"not carry: the plot shows the measurement only (pass {flags})")
    return cosmo


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


# --------------------------------------------------------------------------- generate
def _generate_snapshot(args):
    from . import models

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


def cmd_generate(args) -> int:
    snap = _generate_snapshot(args)
    _check_out(args)  # before a cluster starts
    check_disk_space(snap.nbytes, args.out, "OUT.zarr")
    with _cluster(args):
        t0 = time.perf_counter()
        path = snap.to_zarr(args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
    _say(
        f"wrote {args.model} snapshot: N={snap.n_particles} -> {path} "
        f"({_human_bytes(snap.nbytes)}, {dt:.2f} s)"
    )
    return 0


def cmd_ics(args) -> int:
    from .models import lpt_ics

    snap = lpt_ics(args.n_side, box_size=args.box_size, redshift=args.redshift,
                   order=args.order, power_spectrum=args.power, cosmology=args.cosmology,
                   seed=args.seed, precision=args.precision, chunks=args.chunk_size,
                   fixed_amplitude=args.fixed_amplitude, paired=args.paired,
                   slabs=args.slabs, device="gpu" if args.gpu else "cpu")
    _check_out(args)  # before a cluster starts
    check_disk_space(snap.nbytes, args.out, "OUT.zarr")
    with _cluster(args):
        t0 = time.perf_counter()
        path = snap.to_zarr(args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
    power = args.power or "Eisenstein & Hu no-wiggle"
    order = "2LPT" if args.order == 2 else "Zel'dovich (1LPT)"
    field = ", ".join(k for k, on in (("fixed amplitudes", args.fixed_amplitude),
                                      ("paired", args.paired)) if on)
    order += f" ({field})" if field else ""
    _say(f"wrote {order} ICs at z = "
         f"{args.redshift:g}: {args.n_side}^3 particles in {args.box_size:g} Mpc/h, "
         f"P(k) {power} -> {path} ({_human_bytes(snap.nbytes)}, {dt:.2f} s)")
    return 0


def _redshift_list(text: str) -> tuple[float, ...]:
    """``3,1,0`` -> (3.0, 1.0, 0.0)."""
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected redshifts like 3,1,0, got {text!r}") from None


def cmd_simulate(args) -> int:
    from .simulation import run
    from .simulation.run import check_run
    from .snapshot import open_snapshot

    ics = open_snapshot(args.ics, device="gpu" if args.gpu else "cpu")
    analyses = tuple(a for a in (args.analyses or "").split(",") if a)
    params = dict(z_final=args.z_final, n_steps=args.n_steps, method=args.method,
                  n_mesh=args.n_mesh, softening=args.softening, theta=args.theta,
                  steps=args.schedule, outputs=args.outputs or (), out=args.out,
                  checkpoint_every=args.checkpoint_every, resume=args.resume,
                  analyses=analyses, precision=args.precision, overwrite=args.overwrite,
                  write_particles=not args.no_particles, show=True)
    check_run(ics, **params)  # every parameter, the ICs and OUT, before a cluster starts
    with _cluster(args):
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
    from .snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    with _cluster(args, needed=False):
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


def _unit_triple(text: str) -> dict[str, str]:
    """``Mpc/h,km/s,1e10 Msun/h`` -> {length, velocity, mass} (empty entries: unchanged)."""
    parts = [t.strip() for t in text.split(",")]
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(
            f"expected LENGTH,VELOCITY,MASS (e.g. Mpc/h,km/s,1e10 Msun/h; an empty entry "
            f"keeps that unit), got {text!r}")
    return {q: t for q, t in zip(("length", "velocity", "mass"), parts, strict=True) if t}


def _part_types(text: str) -> int | list[int] | str:
    """``--part-type``: ``1`` -> 1, ``0,1,4`` -> [0, 1, 4], ``all`` -> "all" (the reader
    checks the numbers against its format's types)."""
    text = text.strip()
    if text == "all":
        return text
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a particle type (1), a comma list of types (0,1,4) or 'all', got "
            f"{text!r}") from None
    return values if "," in text else values[0]


def cmd_convert(args) -> int:
    from . import io

    snap = getattr(io, CONVERT_FORMATS[args.format])(args.input, part_type=args.part_type)
    counts = snap.gadget_info.n_per_type
    if args.units:
        snap = snap.to_units(**args.units)  # lazy: converted as the store is written
    _check_out(args)  # before a cluster starts
    check_disk_space(snap.nbytes, args.out, "OUT.zarr")
    with _cluster(args):
        path = snap.to_zarr(args.out, overwrite=args.overwrite)
    units = ", ".join(f"{k} {v}" for k, v in (snap.units or {}).items())
    types = ", ".join(f"PartType{t}: {n}" for t, n in counts.items())
    _say(f"converted {args.input} ({types}; N={snap.n_particles}; {units}) -> {path}")
    return 0


# --------------------------------------------------------------------------- halos
#: spherical-overdensity variables renamed in the halo catalog (``R_max`` would clash
#: with the FOF extent ``r_max`` on a case-insensitive file system)
SO_RENAMES = {"R_max": "R_Vmax", "search_radius": "so_search_radius", "r": "r_profile"}


def _so_deltas(text: str | None) -> tuple[str, ...]:
    """``--so 200c,200m,vir`` as a tuple of deltas; CosmoDaskError for a bad list."""
    from .halos.parameters import DELTAS, check_deltas

    if text is None:
        return ()
    names = [d.strip() for d in text.split(",")]
    if not any(names) or not all(names):
        raise CosmoDaskError(f"--so {text!r}: give a comma list of {', '.join(DELTAS)}")
    unknown = [d for d in names if d not in DELTAS]
    if unknown:
        raise CosmoDaskError(f"--so: unknown overdensity {unknown[0]!r}; use a comma list of "
                             f"{', '.join(DELTAS)}")
    try:
        return check_deltas(names)
    except CosmoDaskError as err:  # repeated
        raise CosmoDaskError(f"--so {text!r}: {str(err).split(': ', 1)[-1]}") from None


def _so_center(centers: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(centre spherical_overdensity uses, the centres fof computes): the most-bound
    particle when --centers has mbp or mbp_grid, else the most-connected particle when it
    has mcp, else mbp is added to the centres computed."""
    if "mbp" in centers or "mbp_grid" in centers:
        return "mbp", centers
    if "mcp" in centers:
        return "mcp", centers
    return "mbp", centers + ("mbp",)


def _add_so(result, so) -> None:
    """Merge the spherical_overdensity Dataset ``so`` into ``result.catalog`` (renaming
    :data:`SO_RENAMES`, its attrs as ``so_*`` catalog attrs) and record it in the
    parameters."""
    so = so.rename({k: v for k, v in SO_RENAMES.items() if k in so.variables})
    if "halo" in so.coords:
        so = so.drop_vars("halo")
    cat = result.catalog.assign(**{k: so[k] for k in so.data_vars})
    cat = cat.assign_coords(**{k: so.coords[k] for k in so.coords})
    for key, value in so.attrs.items():
        cat.attrs[f"so_{key}"] = value
    result.catalog = cat
    result.parameters["so"] = list(so.attrs["deltas"])
    result.parameters["so_center"] = so.attrs["center"]


def _so_summary(cat, deltas) -> str:
    import numpy as np

    n = int(cat.sizes.get("halo", 0))
    parts = []
    for d in deltas:
        m = np.asarray(cat[f"M_{d}"].values, dtype=float)
        ok = np.isfinite(m)
        text = f"{int(ok.sum())}/{n} with M_{d}"
        if ok.any():
            text += f" (median {np.median(m[ok]):.4g} {cat[f'M_{d}'].attrs.get('units', '')})"
        parts.append(text)
    for key, label in (("c_nfw_fit", "c (NFW fit)"), ("c_vmax", "c (V_max/V_200c)")):
        c = np.asarray(cat[key].values, dtype=float)
        c = c[np.isfinite(c)]
        parts.append(f"median {label} {np.median(c):.3g}" if c.size else f"no {label}")
    return "spherical overdensity: " + "; ".join(parts)


def cmd_halos(args) -> int:
    from .halos import fof
    from .halos.api import check_parameters
    from .snapshot import open_snapshot

    centers = tuple(c for c in args.centers.split(",") if c) if args.centers else ()
    deltas = _so_deltas(args.so)  # before opening anything
    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    so_center = None
    if deltas:
        from .halos.spherical_overdensity import check_parameters as check_so

        so_center, centers = _so_center(centers)
        try:
            check_so(snap, deltas)
        except CosmoDaskError as err:
            raise CosmoDaskError(f"--so: {str(err).split(': ', 1)[-1]}") from None
    check_parameters(snap, args.linking_length, absolute=args.absolute,
                     min_members=args.min_members, min_friends=args.min_friends,
                     centers=centers, n_domains=args.domains)  # before starting a cluster
    if args.plot:  # a mass function needs a box; its theory curve a valid cosmology
        if snap.box_size is None:
            raise CosmoDaskError("--plot: a mass function needs a periodic snapshot (box size)")
        _theory_cosmology(args, snap, say=False)
    _check_out(args)  # before a cluster starts
    with _cluster(args):
        t0 = time.perf_counter()
        result = fof(snap, args.linking_length, absolute=args.absolute,
                     min_members=args.min_members, min_friends=args.min_friends,
                     centers=centers, n_domains=args.domains)
        if deltas:
            from .halos.spherical_overdensity import spherical_overdensity

            _add_so(result, spherical_overdensity(snap, result.catalog, deltas,
                                                  center=so_center))
        path = result.to_zarr(args.out, overwrite=args.overwrite)
        dt = time.perf_counter() - t0
    n = result.n_halos
    largest = int(result.catalog["n_members"][0]) if n else 0
    in_halos = int(result.catalog["n_members"].sum()) if n else 0
    _say(f"{n} halo{'s' * (n != 1)} (largest {largest} members; {in_halos} of "
         f"{snap.n_particles} particles "
         f"in halos), linking length {result.parameters['linking_length']:.4g}, "
         f"{dt:.2f} s -> {path}")
    if deltas:
        _say(_so_summary(result.catalog, deltas) + f" (centre {so_center})")
    if args.plot:
        from .halos.mass_function import mass_function, plot_mass_function

        if n == 0:
            raise CosmoDaskError("--plot: no halos to plot")
        ds = mass_function(result.catalog, min(20, max(1, n // 5)), snap.box_size)
        cosmo = _theory_cosmology(args, snap)
        plot_mass_function(ds, cosmology=cosmo, redshift=snap.redshift or 0.0,
                           path=args.plot, **({} if cosmo else {"fits": ()}))
        _say(f"mass function plot -> {args.plot}")
    return 0


# --------------------------------------------------------------------------- expand
def _center_arg(text: str):
    from .expansion.parameters import CENTERS

    if text in CENTERS:
        return text
    try:
        c = [float(v) for v in text.split(",")]
    except ValueError:
        c = []
    if len(c) != 3:
        raise argparse.ArgumentTypeError(f"expected {', '.join(CENTERS)} or x,y,z; got {text!r}")
    return c


def cmd_expand(args) -> int:
    import numpy as np

    from .expansion import MEX, SCF
    from .expansion.output import write_expansion
    from .snapshot import open_snapshot

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
        from .expansion.particles import expansion_input

        expansion_input(snap, center=args.center, defer_checks=True,
                        what=args.method.upper())
    _check_out(args)  # before a cluster starts
    with _cluster(args):
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


# --------------------------------------------------------------------------- density, power
def cmd_density(args) -> int:
    from .density import paint
    from .density.mesh_store import write_mesh
    from .density.paint import particles_input
    from .density.parameters import check_n_mesh
    from .snapshot import open_snapshot

    if args.method == "pse":
        return _density_pse(args)
    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    # before a cluster starts: the mesh side, the box and the masses (the mesh's memory is
    # checked by paint against the workers just started)
    check_n_mesh(args.n_mesh, "paint")
    particles_input(snap, None, args.box_size, what="paint")
    box = args.box_size if args.box_size is not None else snap.box_size
    _check_out(args)  # before a cluster starts
    with _cluster(args):
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
        from .density.mesh_store import open_mesh, plot_mesh_slice

        plot_mesh_slice(open_mesh(path)[0], box, path=args.plot)
        _say(f"slice plot -> {args.plot}")
    return 0


def _density_pse(args) -> int:
    import numpy as np

    from .density import pse_density
    from .density.parameters import check_block
    from .density.pse import check_parameters
    from .snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    _check_out(args)  # before a cluster starts
    shape = check_parameters(snap, patch_size=args.patch_size, max_level=args.max_level,
                             max_tets_per_node=args.max_tets_per_node,
                             strategy=args.strategy)[0]
    check_block(args.block, shape)
    with _cluster(args):
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


def cmd_power(args) -> int:
    from .analysis import plot_power_spectrum, power_spectrum
    from .analysis.parameters import check_los_poles
    from .density.paint import particles_input
    from .density.parameters import check_n_mesh
    from .snapshot import open_snapshot

    snap = open_snapshot(args.snapshot, device="gpu" if args.gpu else "cpu")
    poles = args.poles
    # before a cluster starts: the multipoles, the mesh side, the box and masses, and the
    # plot's theory cosmology (the mesh's memory is checked against the workers started)
    check_los_poles(args.los, poles)
    check_n_mesh(args.n_mesh, "power")
    particles_input(snap, None, None, what="power")
    if args.plot:
        _theory_cosmology(args, snap, say=False)
    with _cluster(args):
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
        reference = None
        cosmo = _theory_cosmology(args, snap)
        if cosmo is not None and snap.scale_factor:
            from .analysis import linear_power

            reference = linear_power(cosmo, snap.scale_factor, ds.attrs["length_unit"])
        elif cosmo is not None:
            _say("--plot: the snapshot has no scale factor: the plot shows the measurement "
                 "only")
        plot_power_spectrum(ds, args.plot, reference=reference)
        _say(f"P(k) plot -> {args.plot}")
    return 0


# --------------------------------------------------------------------------- gravity


def cmd_gravity(args) -> int:
    import math

    import dask.array as da

    from .gravity import accelerations
    from .gravity.api import prepare
    from .snapshot import open_snapshot

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
    with _cluster(args):
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


# --------------------------------------------------------------------------- demo
def cmd_clean(args) -> int:
    from .atomic import clean, clean_tree, local_path
    from .simulation.store import is_simulation_store

    # a simulation store: its checkpoint and outputs too
    sim = is_simulation_store(local_path(args.path))
    done = clean_tree(args.path) if sim else clean(args.path)
    for entry, what in done:
        _say(f"{entry}: {what}")
    if not done:
        _say(f"{args.path}: no temporary stores left by earlier writes")
    return 0


def cmd_demo(args) -> int:
    from .checks import check_seed
    from .demo import run_demo
    from .models import lpt_ics
    from .simulation.run import check_run

    # the demo's ICs (lazy: nothing computed) and its PM run, checked before the cluster
    ics = lpt_ics(args.n_side, box_size=args.box_size, redshift=args.redshift, order=2,
                  seed=check_seed(args.seed))
    check_run(ics, z_final=0.0, n_steps=args.n_steps, method="pm")
    with _cluster(args) as client:
        run_demo(
            directory=args.dir,
            n_side=args.n_side,
            box_size=args.box_size,
            redshift=args.redshift,
            n_steps=args.n_steps,
            seed=args.seed,
            client=client,
            say=_say,
        )
    return 0


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from .analysis import parameters as ap
    from .density import parameters as dp
    from .expansion import parameters as ep
    from .gravity import parameters as gp
    from .gravity.parameters import (
        KERNELS,
        METHODS,
        R_CUT_SPLITS,
        R_SPLIT_CELLS,
        THETA_DEFAULT,
        THETA_MAX,
    )
    from .halos import parameters as hp
    from .models import parameters as mp
    from .simulation import parameters as sp

    parser = _Parser(
        prog="cosmo-dask",
        description="Distributed N-body analysis on Dask (CPU or GPU workers).",
    )
    parser.add_argument("--version", action="version", version=f"cosmo_dask {__version__}")
    _add_cluster_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def _add_theory_options(parser):
        parser.add_argument("--sigma8", type=_positive_float, default=None,
                            help="sigma8 of the --plot theory curve (Gadget headers have none)")
        parser.add_argument("--cosmology", type=_cosmology_overrides, default=None,
                            metavar="KEY=VALUE,...",
                            help="cosmological parameters of the --plot theory curve, on top "
                            "of the snapshot's (Omega_m, Omega_b, Omega_L, h, sigma8, n_s)")

    def _add_generator_outputs(parser):
        """The options of commands that generate a snapshot store: dtype, chunks, overwrite."""
        parser.add_argument("--precision", choices=PRECISIONS, default=None)
        parser.add_argument("--chunk-size", type=_positive_int, default=None,
                            help="particles per chunk (default: dask config "
                            "cosmo_dask.chunk_size)")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace an existing store")

    def subparser(name, **kw):
        p = sub.add_parser(name, **kw)
        _add_cluster_options(p, suppress=True)
        return p

    g = subparser(
        "generate",
        help="write a synthetic snapshot",
        description="Generate a synthetic snapshot into a Zarr store.",
    )
    g.add_argument("model", choices=mp.MODELS)
    g.add_argument("out", metavar="OUT.zarr")
    g.add_argument("--n", type=_positive_int,
                   help="particles (plummer, hernquist, ferrers, blobs)")
    g.add_argument("--n-side", type=_positive_int, help="particles per side (lattice, zeldovich)")
    g.add_argument(
        "--box-size", type=float, help="periodic box side (lattice: box units; zeldovich: Mpc/h)"
    )
    g.add_argument("--redshift", type=float, help="zeldovich: output redshift")
    g.add_argument("--seed", type=int, default=mp.SEED_DEFAULT)
    g.add_argument("--scale", type=float, default=mp.SCALE_DEFAULT,
                   help="plummer/hernquist scale radius")
    g.add_argument("--mass", type=float, default=mp.MASS_DEFAULT,
                   help="total mass (isolated models)")
    g.add_argument(
        "--axes",
        type=float,
        nargs=3,
        default=mp.FERRERS_AXES_DEFAULT,
        metavar=("A", "B", "C"),
        help="ferrers semi-axes",
    )
    g.add_argument("--index", type=int, default=mp.FERRERS_INDEX_DEFAULT,
                   help="ferrers index n")
    g.add_argument("--n-halos", type=_positive_int, default=mp.N_HALOS_DEFAULT,
                   help="blobs: number of Plummer halos")
    g.add_argument(
        "--amplitude", type=float, default=mp.LATTICE_AMPLITUDE_DEFAULT,
        help="lattice: offset amplitude in cells"
    )
    _add_generator_outputs(g)
    g.set_defaults(func=cmd_generate)

    ic = subparser("ics", help="cosmological initial conditions (Zel'dovich or 2LPT)",
                   description="Initial conditions for a periodic LambdaCDM box: particles "
                   "on a lattice displaced by first- (Zel'dovich) or second-order (2LPT) "
                   "Lagrangian perturbation theory; positions in Mpc/h, peculiar velocities "
                   "in km/s, masses in 1e10 Msun/h.")
    ic.add_argument("out", metavar="OUT.zarr")
    ic.add_argument("--n-side", type=_positive_int, required=True, help="particles per side")
    ic.add_argument("--box-size", type=float, required=True, help="box side in Mpc/h")
    ic.add_argument("--redshift", type=float, required=True, help="starting redshift")
    ic.add_argument("--order", type=int, choices=mp.LPT_ORDERS, default=mp.LPT_ORDER_DEFAULT,
                    help=f"Lagrangian perturbation order (default {mp.LPT_ORDER_DEFAULT})")
    ic.add_argument("--power", default=None, metavar="camb|class|FILE",
                    help="linear P(k) at z = 0: 'camb' or 'class' (computed when installed) "
                    "or a two-column table (k in h/Mpc, P in (Mpc/h)^3); default: Eisenstein "
                    "& Hu no-wiggle normalised to sigma8")
    ic.add_argument("--cosmology", type=_cosmology_overrides, default=None,
                    metavar="KEY=VALUE,...", help="cosmological parameters (Omega_m, Omega_b, "
                    "Omega_L, h, sigma8, n_s) on top of the Planck 2018-like defaults")
    ic.add_argument("--seed", type=int, default=mp.SEED_DEFAULT)
    ic.add_argument("--fixed-amplitude", action="store_true",
                    help="every mode's amplitude set to sqrt(P(k)) (random phases kept): "
                    "much less sample variance in P(k) and the mass function")
    ic.add_argument("--paired", action="store_true",
                    help="the sign-flipped field (the pair of a paired-and-fixed set)")
    ic.add_argument("--slabs", type=_positive_int, default=None,
                    help="mesh slabs of the FFTs (default: one per 64 MiB of the complex "
                    "mesh and per worker thread on the CPU, per 256 MiB with --gpu)")
    _add_generator_outputs(ic)
    ic.set_defaults(func=cmd_ics)

    sm = subparser("simulate", help="evolve cosmological ICs with PM or TreePM",
                   description="Evolve periodic cosmological initial conditions (a store "
                   "from `cosmo-dask ics`) to --z-final: kick-drift-kick leapfrog in the "
                   "scale factor, forces from PM or TreePM, snapshots at the --outputs "
                   "redshifts in a simulation store (see docs/simulation.md). One line per "
                   "step: a, z, step and force seconds.")
    sm.add_argument("ics", metavar="ICS.zarr")
    sm.add_argument("out", metavar="OUT", help="simulation store (a directory)")
    sm.add_argument("--z-final", type=float, default=sp.Z_FINAL_DEFAULT,
                    help=f"final redshift (default {sp.Z_FINAL_DEFAULT:g})")
    sm.add_argument("--steps", dest="n_steps", type=_positive_int, required=True,
                    help="steps from the ICs to --z-final (TreePM: 128 for P(k) converged "
                    "to 1%% up to k = 1 h/Mpc at 1 Mpc/h spacing, see docs/simulation.md)")
    sm.add_argument("--schedule", choices=sp.STEP_KINDS, default=None,
                    help="steps uniform in log a or in a (default: "
                    f"{', '.join(f'{v} for {k}' for k, v in sp.DEFAULT_STEPS.items())})")
    sm.add_argument("--method", choices=sp.METHODS, default=sp.METHOD_DEFAULT,
                    help="PM (FastPM kick/drift factors) or TreePM (default "
                    f"{sp.METHOD_DEFAULT})")
    sm.add_argument("--n-mesh", type=_positive_int, default=None,
                    help="PM mesh per side (default: twice the particles per side for pm, "
                    "once for treepm)")
    sm.add_argument("--softening", type=float, default=None,
                    help="TreePM Plummer softening in Mpc/h (default 1/30 of the mean "
                    "interparticle spacing)")
    sm.add_argument("--theta", type=float, default=THETA_DEFAULT,
                    help=f"TreePM opening angle, in (0, {THETA_MAX})")
    sm.add_argument("--outputs", type=_redshift_list, default=None, metavar="Z,Z,...",
                    help="output redshifts (--z-final is always one)")
    sm.add_argument("--analyses", default=None, metavar=",".join(sp.ANALYSES),
                    help="P(k) and/or FOF catalogs computed at each output")
    sm.add_argument("--no-particles", action="store_true",
                    help="store only the analyses of each output, not its particles")
    sm.add_argument("--checkpoint-every", type=_positive_int, default=None, metavar="K",
                    help="write a checkpoint every K steps (atomically)")
    sm.add_argument("--resume", action="store_true",
                    help="continue the run in OUT from its last checkpoint")
    sm.add_argument("--precision", choices=PRECISIONS, default=None)
    sm.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    sm.set_defaults(func=cmd_simulate)

    i = subparser("info", help="describe and validate a snapshot")
    i.add_argument("snapshot", metavar="SNAP")
    i.add_argument("--quick", action="store_true", help="metadata only (reads no particle data)")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=cmd_info)

    c = subparser("convert", help="convert a foreign snapshot to a cosmo_dask store")
    c.add_argument("format", choices=tuple(CONVERT_FORMATS),
                   help="gadget: Gadget/AREPO HDF5; gadget-binary: Gadget format 1 or 2; "
                   "swift: SWIFT HDF5 (single, distributed or virtual file)")
    c.add_argument("input", metavar="IN", help="file, first file of a set, base name or glob")
    c.add_argument("out", metavar="OUT.zarr")
    c.add_argument("--part-type", type=_part_types, default=1, metavar="TYPE[,TYPE...]|all",
                   help="particle type (Gadget 0..5, SWIFT 0..6; 1: dark matter), a comma "
                   "list (0,1,4) or 'all': several types give one snapshot with a ptype array "
                   "and per-particle masses")
    c.add_argument("--units", type=_unit_triple, default=None, metavar="LENGTH,VELOCITY,MASS",
                   help="convert to these units while writing, e.g. 'Mpc/h,,1e10 Msun/h' "
                   "(an empty entry keeps that unit)")
    c.add_argument("--overwrite", action="store_true")
    c.set_defaults(func=cmd_convert)

    h = subparser("halos", help="friends-of-friends halos and their catalog",
                  description="Find friends-of-friends halos and write labels + catalog.")
    h.add_argument("snapshot", metavar="SNAP")
    h.add_argument("out", metavar="OUT.zarr")
    h.add_argument("--linking-length", type=float, default=hp.LINKING_LENGTH_DEFAULT,
                   help="in mean interparticle spacings (box units with --absolute; "
                   f"default {hp.LINKING_LENGTH_DEFAULT:g})")
    h.add_argument("--absolute", action="store_true", help="linking length in box units")
    h.add_argument("--min-members", type=int, default=hp.MIN_MEMBERS_DEFAULT,
                   help=f"smallest halo kept (>= {hp.MIN_MEMBERS_MIN})")
    h.add_argument("--min-friends", type=int, default=hp.MIN_FRIENDS_DEFAULT,
                   help=f"friends a particle needs to link (>= {hp.MIN_FRIENDS_MIN}; 1: "
                   "classic FOF)")
    h.add_argument("--centers", default=",".join(hp.CLI_CENTERS_DEFAULT),
                   help=f"comma list of {', '.join(hp.CENTERS)} (empty for none)")
    h.add_argument("--domains", type=_positive_int, default=None, help="domain count")
    h.add_argument("--so", metavar=",".join(hp.DELTAS), default=None,
                   help="also spherical-overdensity masses and radii (comma list of "
                   f"{', '.join(hp.DELTAS)}), profiles, V_max and NFW concentrations, "
                   "around the mbp centre (mcp when --centers has mcp but no mbp; mbp is "
                   "added when --centers has neither), written into the catalog")
    h.add_argument("--plot", metavar="PNG", default=None, help="mass function plot (with "
                   "the Warren and Watson fits when the cosmology is known)")
    _add_theory_options(h)
    h.add_argument("--overwrite", action="store_true")
    h.set_defaults(func=cmd_halos)

    e = subparser("expand", help="SCF or MEX expansion of an isolated snapshot",
                  description="Fit an SCF (Hernquist-Ostriker) or MEX (multipole) expansion "
                  "and write coefficients and/or accelerations to a Zarr store.")
    e.add_argument("snapshot", metavar="SNAP")
    e.add_argument("out", metavar="OUT.zarr")
    e.add_argument("--method", choices=ep.METHODS, default=ep.METHODS[0])
    e.add_argument("--nmax", type=int, default=ep.NMAX_DEFAULT,
                   help=f"SCF radial order (0 to {ep.NMAX_LIMIT})")
    e.add_argument("--lmax", type=int, default=ep.LMAX_DEFAULT,
                   help=f"angular order (0 to {ep.LMAX_LIMIT})")
    e.add_argument("--scale-radius", type=float, default=ep.SCALE_RADIUS_DEFAULT,
                   help="SCF basis scale radius")
    e.add_argument("--softening", type=float, default=ep.SOFTENING_DEFAULT,
                   help="MEX softening length")
    e.add_argument("--center", type=_center_arg, default=ep.CENTER_DEFAULT,
                   help=f"{', '.join(ep.CENTERS)} or x,y,z (needed for periodic snapshots)")
    e.add_argument("--precision", choices=PRECISIONS, default=ep.PRECISION_DEFAULT)
    e.add_argument("--accelerations", action="store_true",
                   help="SCF: also store accelerations and potentials at the particles "
                   "(MEX always does)")
    e.add_argument("--overwrite", action="store_true")
    e.set_defaults(func=cmd_expand)

    m = subparser("density", help="PSE density on an adaptive octree, or a painted mesh",
                  description="--method pse: phase-space-element density (exact tetrahedron "
                  "deposits) on an adaptive octree of grid patches, written as a multiscale "
                  "Zarr group. --method ngp|cic|tsc|pcs: mass per cell on a periodic mesh.")
    m.add_argument("snapshot", metavar="SNAP")
    m.add_argument("out", metavar="OUT.zarr")
    m.add_argument("--method", choices=(*dp.SCHEMES, "pse"), default=dp.SCHEME_DEFAULT)
    m.add_argument("--n-mesh", type=_positive_int, default=dp.CLI_N_MESH_DEFAULT)
    m.add_argument("--box-size", type=float, default=None, help="for isolated snapshots")
    m.add_argument("--patch-size", type=_positive_int, default=dp.PATCH_SIZE_DEFAULT,
                   help="pse: cells per leaf patch side (a power of two)")
    m.add_argument("--strategy", choices=dp.STRATEGIES, default=dp.STRATEGIES[0],
                   help="pse: scheduling of the leaf deposits")
    m.add_argument("--max-level", type=int, default=None,
                   help="pse: deepest octree level, at most "
                   f"{dp.MAX_LEVEL_MAX} (default: finest cells = half the Lagrangian spacing)")
    m.add_argument("--max-tets-per-node", type=float, default=None,
                   help="pse: refine nodes overlapped by more tetrahedra (default patch^3)")
    m.add_argument("--block", type=_positive_int, default=dp.BLOCK_DEFAULT,
                   help="pse: Lagrangian sub-block side in cells")
    m.add_argument("--plot", metavar="PNG", default=None, help="log-density slice plot")
    m.add_argument("--overwrite", action="store_true")
    m.set_defaults(func=cmd_density)

    p = subparser("power", help="power spectrum P(k) of a snapshot",
                  description="Window-compensated, interlaced P(k) with mode counts and shot "
                  "noise (not subtracted).")
    p.add_argument("snapshot", metavar="SNAP")
    p.add_argument("--n-mesh", type=_positive_int, default=dp.CLI_N_MESH_DEFAULT)
    p.add_argument("--scheme", choices=tuple(dp.SCHEMES), default=dp.SCHEME_DEFAULT)
    p.add_argument("--no-interlace", action="store_true")
    p.add_argument("--los", type=int, choices=tuple(ap.LOS_AXES.values()), default=None,
                   help="line-of-sight axis for multipoles")
    p.add_argument("--poles", type=_int_list, default=",".join(map(str, ap.POLES_DEFAULT)),
                   help=f"Legendre multipoles out of {', '.join(map(str, ap.POLES))}, "
                   "e.g. 0,2,4")
    p.add_argument("--out", default=None, help="write the table (.csv or .nc)")
    p.add_argument("--plot", metavar="PNG", default=None, help="P(k) plot (with linear theory "
                   "when the cosmology is known)")
    _add_theory_options(p)
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing --out and --plot files")
    p.set_defaults(func=cmd_power)

    gr = subparser("gravity", help="accelerations and potentials of every particle",
                   description="Gravitational accelerations and potentials of every particle "
                   "of a snapshot (tree, direct summation, PM or TreePM), written to a Zarr "
                   "store in the snapshot's particle order.")
    gr.add_argument("snapshot", metavar="SNAP")
    gr.add_argument("out", metavar="OUT.zarr")
    gr.add_argument("--method", choices=METHODS, default=METHODS[0])
    gr.add_argument("--theta", type=float, default=THETA_DEFAULT,
                    help=f"tree opening angle, in (0, {THETA_MAX})")
    gr.add_argument("--softening", type=float, default=gp.SOFTENING_DEFAULT,
                    help="Plummer-equivalent softening length (snapshot length units)")
    gr.add_argument("--softening-kernel", choices=KERNELS, default=KERNELS[0])
    gr.add_argument("--precision", choices=PRECISIONS,
                    default=gp.PRECISION_DEFAULT)
    gr.add_argument("--n-mesh", type=int, default=None,
                    help="pm/treepm mesh cells per side (default: the smallest power of two "
                    ">= N^(1/3), at least 16)")
    gr.add_argument("--r-split", type=float, default=None,
                    help=f"treepm force-split scale (default {R_SPLIT_CELLS:g} box / n_mesh)")
    gr.add_argument("--r-cut", type=float, default=None,
                    help=f"treepm short-range cutoff (default {R_CUT_SPLITS:g} r_split)")
    gr.add_argument("--max-leaf", type=int, default=gp.MAX_LEAF_DEFAULT,
                    help="tree leaf size (particles)")
    gr.add_argument("--max-group", type=int, default=gp.MAX_GROUP_DEFAULT,
                    help="tree group size (particles)")
    gr.add_argument("--G", dest="G", type=float, default=None,
                    help="gravitational constant (default: the snapshot's G attribute)")
    gr.add_argument("--no-potential", action="store_true", help="accelerations only")
    gr.add_argument("--overwrite", action="store_true")
    gr.set_defaults(func=cmd_gravity)

    cl = subparser("clean", help="settle what killed writes left (temporary stores)",
                   description="Settle what writes to PATH killed outright left next to it "
                   "(and, for a simulation store, next to its checkpoint and outputs): a "
                   "replace interrupted between its renames is finished or undone (the "
                   "complete store put at its path), .NAME.tmp-<hex> directories whose "
                   "writer is gone are removed. Those whose writer may still be running "
                   "are kept. The next open of or write to PATH does the same.")
    cl.add_argument("path", metavar="PATH", help="the store path that was being written")
    cl.set_defaults(func=cmd_clean)

    d = subparser("demo", help="run the end-to-end demo on a local cluster")
    d.add_argument(
        "--dir",
        default=None,
        help="directory for the demo's stores (default: a temporary directory, removed afterwards)",
    )
    d.add_argument("--n-side", type=_positive_int, default=64)
    d.add_argument("--box-size", type=float, default=100.0)
    d.add_argument("--redshift", type=float, default=49.0,
                   help="redshift of the ICs, evolved to z = 0 (default 49)")
    d.add_argument("--steps", dest="n_steps", type=_positive_int, default=10,
                   help="PM steps from the ICs to z = 0 (default 10)")
    d.add_argument("--seed", type=int, default=1)
    d.set_defaults(func=cmd_demo)
    return parser


# --------------------------------------------------------------------------- errors
#: library parameter names that the command line spells differently (name -> dest)
_PY_ALIASES = {"n_domains": "domains", "n_workers": "workers", "chunks": "chunk_size",
               "power_spectrum": "power",
               "scheduler_file": "scheduler"}
_PY_NAMES = re.compile(r"""(?<![\w.'"/\\-])[A-Za-z_]\w*(?:/[A-Za-z_]\w*)+(?![\w/\\'"]|\.\w)""")
_PY_NAME = re.compile(r"""(?<![\w.'"/\\-])([A-Za-z_]\w*)"""
                      r"""(?:=('[^']*'|"[^"]*"|[^\s,;:)\]]*))?(?![\w/\\'"]|\.\w)""")


def cli_message(message: str, parser: argparse.ArgumentParser) -> str:
    """A library message in the words of ``parser``'s command line, on one line.

    Python parameter names become the parser's options (from its argparse
    actions, dest -> option string): ``pass overwrite=True`` -> ``pass
    --overwrite``, ``gpu=False`` -> ``--cpu``, ``method='pm'`` -> ``--method pm``,
    ``n_mesh`` -> ``--n-mesh``. A bare name is translated when it holds an
    underscore or starts a clause (``theta must be ...``), so prose words stay;
    ``r_split/r_cut`` -> ``--r-split/--r-cut``;
    paths, quoted names and attributes (``'G'``, ``a/n_mesh.zarr``, ``x.n_mesh``)
    are left alone, as are names the command has no option for.
    """
    actions: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "version"):
            actions.setdefault(action.dest, []).append(action)

    def flag(action):
        return next((o for o in action.option_strings if o.startswith("--")),
                    action.option_strings[0])

    def replace(m):
        name, value = m.group(1), m.group(2)
        acts = actions.get(name) or actions.get(_PY_ALIASES.get(name, ""))
        if not acts:
            return m.group(0)
        if value is None:
            before = text[:m.start()].rstrip()
            clause = before == "" or before.endswith((":", ";"))
            return flag(acts[0]) if "_" in name or clause else m.group(0)
        if value in ("True", "False"):
            const = value == "True"
            switch = [a for a in acts if a.nargs == 0 and a.const is const]
            if switch:
                return flag(switch[0])
            if any(a.nargs == 0 for a in acts):
                return f"without {flag(acts[0])}"
        if value and value[0] in "'\"" and " " not in value:
            value = value[1:-1]
        return f"{flag(acts[0])} {value}".rstrip()

    def alternatives(m):  # "r_split/r_cut", unless some part is no option (a path)
        parts = m.group(0).split("/")
        acts = [actions.get(n) or actions.get(_PY_ALIASES.get(n, "")) for n in parts]
        return "/".join(flag(a[0]) for a in acts) if all(acts) else m.group(0)

    text = _PY_NAMES.sub(alternatives, " ".join(str(message).split()))
    return _PY_NAME.sub(replace, text)


def _command_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(getattr(args, "command", None), parser)
    return parser


def _lost_scheduler(exc: BaseException, client) -> bool:
    """Whether ``exc`` says the connection to ``client``'s scheduler is gone."""
    if client is None:
        return False
    import concurrent.futures
    import traceback

    from distributed.comm.core import CommClosedError

    running = getattr(client, "status", "running") == "running"
    if isinstance(exc, CommClosedError):
        return True
    if isinstance(exc, concurrent.futures.CancelledError):
        reason = str(getattr(exc, "reason", ""))
        return not running or "lost" in reason or "scheduler" in reason
    if isinstance(exc, (OSError, TimeoutError)):
        from_comm = any(
            f.f_globals.get("__name__", "").startswith(("distributed.comm", "distributed.core"))
            for f, _ in traceback.walk_tb(exc.__traceback__))
        return from_comm or not running
    return False


def _raised_at(exc: BaseException) -> str:
    """``package/module.py:line in function`` of the frame that raised ``exc``.

    Names where an unexpected error came from without a traceback, so a bug
    report (or a CI log) already points at the code.
    """
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return "an unknown place"
    frame, lineno = frames[-1]
    path = frame.f_code.co_filename
    parts = path.replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):  # from the top-level package on
        if parts[i] in ("site-packages", "dist-packages"):
            parts = parts[i + 1:]
            break
        if parts[i] == "cosmo_dask" and i < len(parts) - 1:
            parts = parts[i:]
            break
    else:
        parts = parts[-2:]
    return f"{'/'.join(parts)}:{lineno} in {frame.f_code.co_name}"


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that writes in progress remove their temporary stores
    (the signal's default action would end the process with no cleanup at all)."""


@contextlib.contextmanager
def _sigterm_interrupts():
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 failed, 2 bad input, 130 interrupted,
    143 terminated by SIGTERM).

    Errors are one line on stderr naming the command-line option at fault;
    ``--verbose`` prints the traceback as well.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    command = _command_parser(parser, args)
    try:
        _check_files(args)
        with _sigterm_interrupts(), dask.config.set({
                "cosmo_dask.progress": True,  # for this command only
                "cosmo_dask.verify": not args.no_verify}):
            return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        print(f"cosmo-dask: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        client = getattr(args, "_client", None)
        address = getattr(args, "_scheduler_address", None) or args.scheduler or "(unknown)"
        lost = getattr(args, "_scheduler_lost", None)  # judged by _cluster, if it ran
        if lost is None:
            lost = _lost_scheduler(exc, client)
        notes = []
        if isinstance(exc, CosmoDaskError):
            line, code = f"error: {cli_message(exc, command)}", 2
        elif isinstance(exc, NotImplementedError):
            line, code = f"not implemented: {cli_message(exc, command)}", 2
        elif lost:
            line, code = (f"error: lost the connection to the Dask scheduler at {address} "
                          f"({type(exc).__name__})"), 1
        else:
            line, code = f"error: {type(exc).__name__}: {cli_message(exc, command)}", 1
            notes.append(f"raised at {_raised_at(exc)}")
        if code == 1 and not args.verbose:
            notes.append("run with --verbose for the traceback")
        if notes:
            line += f" ({'; '.join(notes)})"
        print(f"cosmo-dask: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
