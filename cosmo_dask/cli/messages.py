"""What the ``cosmo-dask`` command prints: progress lines (:func:`_say`), one-line logs
while a command runs, and one-line error messages in the command line's terms
(:func:`cli_message`, :func:`_raised_at`)."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import re
import traceback

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


def _say(text: str) -> None:
    print(text, flush=True)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


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
