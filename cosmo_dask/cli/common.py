"""What every ``cosmo-dask`` command shares: its cluster (:func:`_cluster`) and the
checks of its output files made before any work."""

from __future__ import annotations

import contextlib
import logging
import os

from ..core.errors import CosmoDaskError
from .messages import _lost_scheduler, _mute_distributed_logs, _one_line_logs, _say


@contextlib.contextmanager
def _cluster(args, needed: bool = True):
    """A client for the command: the asked scheduler, or a local cluster when ``needed``."""
    from ..core.cluster import connect

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
                from ..store.atomic import check_worker_paths

                check_worker_paths(client, inputs=[getattr(args, n, None) for n in (
                    "snapshot", "input")], outputs=[] if args.command == "power" else [
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


def _check_files(args) -> None:
    """Refuse, before any work, a --plot or --out file that would replace an existing file
    (without --overwrite), lies inside a Zarr store (an input store too), cannot be created
    there, or has a format this command cannot write."""
    from pathlib import Path

    from ..store.atomic import check_can_create, inside_store

    power = args.command == "power"
    for flag, path in (("--plot", getattr(args, "plot", None)),
                       ("--out", getattr(args, "out", None) if power else None)):
        if not path:
            continue
        p = Path(path).expanduser()
        suffix = p.suffix.lower().lstrip(".")
        if flag == "--plot":
            from ..plot.formats import figure_formats

            formats = figure_formats()
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
    if name in ("cmd_generate", "cmd_convert", "cmd_hod"):
        from ..store.validation import FORMAT
        return "snapshot store", FORMAT
    if name == "cmd_halos":
        from ..halos.result import FORMAT
        return "halo store", FORMAT
    if name == "cmd_subhalos":
        from ..halos.subhalo_result import FORMAT
        return "subhalo store", FORMAT
    if name == "cmd_expand":
        from ..expansion.output import FORMAT
        return "expansion store", FORMAT
    if name == "cmd_gravity":
        from ..gravity.output import FORMAT
        return "gravity store", FORMAT
    if name == "cmd_xi":
        from ..analysis.correlation import FORMAT
        return "correlation store", FORMAT
    if name == "cmd_bispectrum":
        from ..analysis.parameters import BISPECTRUM_FORMAT
        return "bispectrum store", BISPECTRUM_FORMAT
    if getattr(args, "method", None) == "pse":
        from ..density.octree_store import FORMAT
        return "density octree store", FORMAT
    from ..density.mesh_store import FORMAT
    return "mesh store", FORMAT


def _check_out(args) -> None:
    """Refuse, before any work, an output that is the input, lies inside or around it, lies
    inside a Zarr store, exists (without --overwrite), or is no store of this kind."""
    from ..store.atomic import check_writable_target

    what, fmt = _output_kind(args)
    inputs = [getattr(args, name, None) for name in ("snapshot", "input", "halos")]
    check_writable_target(args.out, overwrite=args.overwrite, what=what, fmt=fmt,
                          inputs=[i for i in inputs if i])


def _theory_cosmology(args, snap, say: bool = True):
    """The cosmology of a --plot's theory curve: the snapshot's, with --sigma8 and
    --cosmology on top; None (after one line saying what is missing, unless ``say`` is
    False: the check before work) when a parameter the curve needs is known to neither.
    A CosmoDaskError when the values are no valid cosmology."""
    from ..models.cosmology import Cosmology

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
