"""The ``cosmo-dask`` command.

::

    cosmo-dask [--scheduler ADDR] [--gpu|--cpu] [--workers N] [--verbose] COMMAND ...

    generate {plummer,hernquist,ferrers,lattice,zeldovich} OUT.zarr [options]
    info SNAP [--quick] [--json]
    convert gadget|gadget-binary|swift IN OUT.zarr [--part-type 1|0,1,4|all] [--units L,V,M]
    halos SNAP OUT.zarr [--linking-length 0.2] [--centers mbp,mcp] [--so 200c,200m,vir]
    subhalos SNAP HALOS OUT.zarr [--min-members 20] [--labels] [--plot PNG]
    hod CATALOG OUT.zarr [--logMmin ...] [--satellites particles|nfw] [--seed S] [--plot P]
    gravity SNAP OUT.zarr [--method tree|direct|pm|treepm] [--theta 0.5] [--softening EPS]
    xi SNAP OUT.zarr --r-max R [--bins N] [--mu-bins M --los z --poles 0 2 4] [--plot FILE]
    demo [--dir DIR] [--n-side 64]

Bad input exits with status 2 and one line ``cosmo-dask: error: ...`` naming
the problem and the option at fault; any other failure (a lost scheduler
included) exits with status 1 and one line; ``--verbose`` adds the traceback.
Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Sequence

import dask

from ..core.errors import CosmoDaskError
from .common import _check_files
from .messages import _command_parser, _lost_scheduler, _raised_at, cli_message
from .parser import build_parser


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
