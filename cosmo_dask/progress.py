"""Computing dask collections with an optional progress display.

With an active ``distributed.Client`` the work runs there and progress is
shown with distributed's text/notebook progress bar; otherwise the local
scheduler runs it under ``dask.diagnostics.ProgressBar``. Whether progress is
shown defaults to dask config ``cosmo_dask.progress`` (the CLI turns it on).
"""

from __future__ import annotations

import contextlib
import sys

import dask


def active_client(*collections):
    """The distributed Client dask would use for ``collections`` now, or None.

    Follows dask's own scheduler resolution, so ``dask.config.set(scheduler=...)``
    and ``compute(scheduler=...)`` choices are respected.
    """
    from dask.base import get_scheduler

    collections = [c for c in collections if dask.is_dask_collection(c)]
    scheduler = get_scheduler(collections=collections or None)
    owner = getattr(scheduler, "__self__", None)
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is a core dependency
        return None
    return owner if isinstance(owner, Client) else None


def _run(persist: bool, collections, label, show):
    if show is None:
        show = bool(dask.config.get("cosmo_dask.progress", False))
    client = active_client(*collections)
    if label and show:
        print(f"cosmo-dask: {label}", file=sys.stderr, flush=True)
    if client is not None:
        futures = (client.persist if persist else client.compute)(list(collections))
        try:
            if show:
                from distributed import progress

                with contextlib.redirect_stdout(sys.stderr):  # keep stdout for results
                    progress(futures, notebook=False)
                print(file=sys.stderr, flush=True)
            return tuple(futures) if persist else tuple(client.gather(futures))
        except BaseException:
            client.cancel(futures)  # stop queued tasks of a failed computation
            raise
    run = dask.persist if persist else dask.compute
    if show:
        from dask.diagnostics import ProgressBar

        with ProgressBar(out=sys.stderr, minimum=0.5):
            return run(*collections)
    return run(*collections)


def compute(*collections, label: str | None = None, show: bool | None = None):
    """``dask.compute`` that shows progress when asked; returns the results tuple."""
    return _run(False, collections, label, show)


def persist(*collections, label: str | None = None, show: bool | None = None):
    """``dask.persist`` with the same client choice and progress display as :func:`compute`.

    With a distributed client the results stay in worker memory.
    """
    return _run(True, collections, label, show)
