"""Computing dask collections with an optional progress display.

With an active ``distributed.Client`` the work runs there; otherwise on the
local scheduler dask would use. Whether progress is shown defaults to dask
config ``cosmo_dask.progress`` (the CLI turns it on).

The display (on stderr; stdout stays for results) names the stage (the
``label`` of :func:`compute`) and counts tasks per kind (dask's ``key_split``
of the task key: ``fof-domain``, ``gravity-group``, ``pse-leaf``, ...)::

    [friends-of-friends] fof-domain 3/8, fof-merge 0/1 | 12.3 s elapsed, ~20 s left

On a terminal the line is redrawn in place (``\\r``) at most ten times a
second. Written to a file or pipe it is one line when the stage starts, one
every :data:`LOG_INTERVAL` seconds while it runs and one when it ends, with
its time. The estimate of the time left weights each kind by its mean task
duration (measured here on the local schedulers; the scheduler's per-prefix
average with distributed) and appears once every kind with tasks left has one.
Computations without a label are shown only once they run longer than
:data:`UNLABELLED_MINIMUM` seconds.

Counts come from a :class:`dask.callbacks.Callback` on the local schedulers and
from distributed's ``MultiProgress`` scheduler plugin (keys grouped by
prefix; tasks already finished when the computation is submitted are not
counted) through a text subclass of ``MultiProgressBar``.

Under a client the wait is on the futures, not on the display: the first task
that fails ends it at once (the scheduler fails every task depending on it), its
exception is raised and the other futures are cancelled. A shown :func:`persist`
waits too and raises, so nothing is computed on a failed graph. While every
worker is paused (its memory above ``distributed.worker.memory.pause``, so it runs
nothing) for dask config ``cosmo_dask.pause_timeout`` seconds, the wait ends with
a one-line :class:`~cosmo_dask.core.errors.ClusterError` (:func:`wait` for persisted
collections does the same).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
from collections import Counter

import dask
from dask.callbacks import Callback
from dask.utils import key_split

#: seconds between redraws on a terminal
REDRAW_INTERVAL = 0.1
#: seconds between progress lines when stderr is not a terminal
LOG_INTERVAL = 10.0
#: unlabelled computations are shown only after running this long (seconds)
UNLABELLED_MINIMUM = 0.5
#: at most this many task kinds are named; the others are summed as "+N kinds"
MAX_KINDS = 6
#: seconds the display may take, once the work is done, to draw its final counts
FINAL_DRAW_WAIT = 10.0
#: seconds the scheduler waits for a displayed computation's keys to arrive (a graph
#: cancelled before they are seen is not displayed, and leaves nothing behind)
SETUP_WAIT = 60.0


def worker_count() -> int:
    """Workers of the active distributed client (1 without one): what a mesh or a domain
    decomposition is spread over."""
    client = active_client()
    if client is None:
        return 1
    return max(1, len(client.scheduler_info().get("workers", {})))


def worker_addresses() -> list[str]:
    """Addresses of the active distributed client's workers, sorted (empty without one):
    where tasks pinned one per worker go."""
    client = active_client()
    if client is None:
        return []
    return sorted(client.scheduler_info(n_workers=-1).get("workers", {}))


def worker_threads() -> int:
    """Threads of the active distributed client's workers (this machine's cores without
    one): what a computation's tasks run on."""
    client = active_client()
    if client is not None:
        threads = sum(client.nthreads().values())
        if threads:
            return threads
    return os.cpu_count() or 1


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


# --------------------------------------------------------------------------- display
def format_seconds(t: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if t < 59.95:
        return f"{t:.1f} s"
    m, s = divmod(int(round(t)), 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _format_left(t: float) -> str:
    return f"~{max(1, round(t))} s" if t < 59.5 else "~" + format_seconds(t).replace(".0 s", " s")


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 100


def _shown_kinds(totals) -> dict:
    """Task counts per kind without dask's bookkeeping ``finalize-...`` tasks."""
    return {k: int(n) for k, n in totals.items() if not str(k).startswith("finalize")}


class StageProgress:
    """Text progress of one stage: task counts per kind, elapsed and remaining time.

    Thread-safe. ``begin`` (once the counts are known), ``tick`` (often; it
    decides what to write), ``finish`` (once). Counts come through
    :meth:`set_counts` or :meth:`set_totals` + :meth:`task_done`.
    """

    def __init__(self, label: str | None, stream=None, *, tty: bool | None = None,
                 minimum: float | None = None, log_interval: float | None = None,
                 redraw_interval: float | None = None):
        self.label = label or "compute"
        self.stream = sys.stderr if stream is None else stream
        self.tty = _isatty(self.stream) if tty is None else bool(tty)
        self.minimum = (0.0 if label else UNLABELLED_MINIMUM) if minimum is None else minimum
        self.log_interval = LOG_INTERVAL if log_interval is None else log_interval
        self.redraw_interval = REDRAW_INTERVAL if redraw_interval is None else redraw_interval
        self.t0 = time.monotonic()
        self.totals: dict[str, int] = {}
        self.done: Counter = Counter()
        self.durations: dict[str, float] = {}  # mean seconds per task, by kind
        self._sums: Counter = Counter()  # measured durations (local schedulers)
        self._lock = threading.Lock()
        self._begun = self._shown = self._finished = False
        self._last = -float("inf")  # time of the last write
        self._width = 0  # length of the line on the terminal

    # ---- counts
    def set_totals(self, totals) -> None:
        with self._lock:
            self.totals = _shown_kinds(totals)

    def task_done(self, kind: str, duration: float | None = None) -> None:
        with self._lock:
            self.done[kind] += 1
            if duration is not None:
                self._sums[kind] += duration
                self.durations[kind] = self._sums[kind] / self.done[kind]

    def set_counts(self, totals, done, durations=None) -> None:
        with self._lock:
            self.totals = _shown_kinds(totals)
            self.done = Counter(done)
            if durations:
                self.durations = {k: v for k, v in durations.items() if v and v > 0}

    # ---- text
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def remaining(self, elapsed: float | None = None) -> float | None:
        """Seconds left: elapsed x (work left / work done), each task weighted by
        its kind's mean duration; None while a kind with tasks left has no
        measured duration yet (or nothing is done, or in the first second).
        """
        elapsed = self.elapsed() if elapsed is None else elapsed
        done = left = 0.0
        for kind, total in self.totals.items():
            n = min(self.done.get(kind, 0), total)
            w = self.durations.get(kind)
            if w is None:
                if n < total:
                    return None
                continue
            done += w * n
            left += w * (total - n)
        if done <= 0 or left <= 0 or elapsed < 1.0:
            return None
        return elapsed * left / done

    def kinds_text(self) -> str:
        kinds = sorted(self.totals, key=lambda k: (-self.totals[k], k))  # most tasks first
        if len(kinds) > MAX_KINDS:  # name unfinished kinds first, sum the rest
            unfinished = [k for k in kinds if self.done.get(k, 0) < self.totals[k]]
            shown = set((unfinished + [k for k in kinds if k not in unfinished])[:MAX_KINDS - 1])
        else:
            shown = set(kinds)
        parts = [f"{k} {min(self.done.get(k, 0), self.totals[k])}/{self.totals[k]}"
                 for k in kinds if k in shown]
        rest = [k for k in kinds if k not in shown]
        if rest:
            n_done = sum(min(self.done.get(k, 0), self.totals[k]) for k in rest)
            parts.append(f"+{len(rest)} kinds {n_done}/{sum(self.totals[k] for k in rest)}")
        return ", ".join(parts)

    def line(self, tail: str) -> str:
        kinds = self.kinds_text()
        return f"[{self.label}] {kinds} | {tail}" if kinds else f"[{self.label}] {tail}"

    def _running_tail(self, elapsed: float) -> str:
        left = self.remaining(elapsed)
        tail = f"{format_seconds(elapsed)} elapsed"
        return tail + (f", {_format_left(left)} left" if left is not None else "")

    def _write(self, text: str, *, newline: bool) -> None:
        with contextlib.suppress(ValueError, OSError):  # a closed stream stops the display
            if self.tty:
                cols = _columns(self.stream) - 1
                if len(text) > cols > 3:
                    text = text[:cols - 3] + "..."
                pad = " " * max(0, self._width - len(text))
                self.stream.write("\r" + text + pad + ("\n" if newline else ""))
                self._width = 0 if newline else len(text)
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        self._last = time.monotonic()

    # ---- life cycle
    def begin(self) -> None:
        with self._lock:
            self._begun = True
        self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        with self._lock:
            if not self._begun or self._finished:
                return
            now = time.monotonic()
            elapsed = now - self.t0
            if elapsed < self.minimum:
                return
            if not self._shown:  # the first line
                self._shown = True
                self._write(self.line("started"), newline=not self.tty)
                return
            interval = self.redraw_interval if self.tty else self.log_interval
            if force or now - self._last >= interval:
                self._write(self.line(self._running_tail(elapsed)), newline=False)

    def finish(self, ok: bool = True) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            elapsed = self.elapsed()
            if not self._shown:
                if not self._begun or elapsed < self.minimum:
                    return  # never started, or too short to show
                if not self.tty:  # its start line too
                    self._write(self.line("started"), newline=True)
            what = f"done in {format_seconds(elapsed)}" if ok else \
                f"failed after {format_seconds(elapsed)}"
            self._write(self.line(what), newline=True)


# --------------------------------------------------------------------------- local schedulers
class _LocalCounts(Callback):
    """Counts finished tasks per kind and times them (dask's local schedulers).

    Callbacks of computations nested inside a task (another thread, or depth
    > 1 on the synchronous scheduler) are ignored.
    """

    def __init__(self, display: StageProgress):
        super().__init__()
        self.display = display
        self._thread = threading.get_ident()
        self._depth = 0
        self._t: dict = {}
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def _ours(self) -> bool:
        return threading.get_ident() == self._thread

    def _start(self, dsk):
        if self._ours():
            self._depth += 1

    def _start_state(self, dsk, state):
        if not self._ours() or self._depth != 1 or self._timer is not None:
            return
        keys = [*state["ready"], *state["waiting"], *state["running"], *state["finished"]]
        self.display.set_totals(Counter(key_split(k) for k in keys))
        self.display.begin()
        self._timer = threading.Thread(target=self._tick, name="cosmo-dask-progress",
                                       daemon=True)
        self._timer.start()

    def _tick(self):
        while not self._stop.wait(self.display.redraw_interval):
            self.display.tick()

    def _pretask(self, key, dsk, state):
        if self._ours() and self._depth == 1:
            self._t[key] = time.monotonic()

    def _posttask(self, key, result, dsk, state, worker_id):
        if self._ours() and self._depth == 1:
            t = self._t.pop(key, None)
            self.display.task_done(key_split(key), None if t is None else time.monotonic() - t)

    def _finish(self, dsk, state, errored):
        if self._ours():
            self._depth -= 1

    def close(self, ok: bool) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        self.display.finish(ok)


# --------------------------------------------------------------------------- distributed
def _text_multi_progress_bar():
    from distributed.diagnostics.progressbar import MultiProgressBar

    class TextMultiProgressBar(MultiProgressBar):
        """``MultiProgressBar`` drawing into a :class:`StageProgress`.

        ``listen`` is the base's, with the scheduler's mean task duration per
        prefix added to each report (to weight the estimate of the time left).
        """

        def __init__(self, keys, display: StageProgress, client, interval="100ms"):
            super().__init__(keys, scheduler=client.scheduler.address, interval=interval,
                             complete=False)
            self.display = display
            self.status = None

        async def listen(self):
            from distributed.core import connect
            from distributed.diagnostics.progress import MultiProgress
            from distributed.protocol.pickle import dumps

            complete, keys, group_by = self.complete, self.keys, self.group_by
            give_up_after = SETUP_WAIT  # the functions below run on the scheduler, which
            # may not have cosmo_dask: they refer to nothing of this module

            async def setup(scheduler):
                import asyncio
                import time

                p = MultiProgress(keys, scheduler, complete=complete, group_by=group_by)
                # MultiProgress.setup waits until every key is on the scheduler: keys
                # cancelled before it looks (a computation that failed at once) would
                # keep it polling for the scheduler's life
                give_up = time.monotonic() + give_up_after
                while not p.keys.issubset(scheduler.tasks):
                    if time.monotonic() > give_up:
                        return None
                    await asyncio.sleep(0.05)
                await p.setup()
                return p

            def function(scheduler, p=None):
                if p is None:  # the keys never came, or went
                    return {"all": {}, "remaining": {}, "status": "gone"}
                prefixes = scheduler.task_prefixes
                result = {
                    "all": {k: len(v) for k, v in p.all_keys.items()},
                    "remaining": {k: len(v) for k, v in p.keys.items()},
                    "status": p.status,
                    "durations": {k: prefixes[k].duration_average for k in p.all_keys
                                  if k in prefixes},
                }
                if p.status == "error":
                    result.update(p.extra)
                return result

            def teardown(scheduler, p=None):  # the comm closed: the plugin goes too
                if p is not None and scheduler.plugins.get(p.name) is p:
                    scheduler.remove_plugin(name=p.name)

            client = self.client() if self.client else None
            self.comm = await connect(self.scheduler,
                                      **(client.connection_args if client else {}))
            try:
                await self.comm.write({"op": "feed", "setup": dumps(setup),
                                       "function": dumps(function),
                                       "teardown": dumps(teardown),
                                       "interval": self.interval})
                while True:
                    response = await self.comm.read(
                        deserializers=client._deserializers if client else None)
                    self.status = response["status"]
                    if self.status == "gone":
                        break
                    self._draw_bar(**response)
                    if response["status"] in ("error", "finished"):
                        break
            finally:
                with contextlib.suppress(Exception):
                    await self.comm.close()

        def _draw_bar(self, remaining, all, status=None, durations=None, **kwargs):
            done = {k: n - remaining.get(k, 0) for k, n in all.items()}
            self.display.set_counts(all, done, durations)
            if not self.display._begun:
                self.display.begin()
            else:
                self.display.tick()

    return TextMultiProgressBar


# --------------------------------------------------------------------------- waiting
#: seconds between checks for paused workers while a computation is awaited
POLL_INTERVAL = 1.0


def pause_timeout() -> float | None:
    """Seconds every worker may stay paused before a computation gives up: dask config
    ``cosmo_dask.pause_timeout`` (seconds, or a string such as ``"2 minutes"``; None
    waits for ever). ParameterError for anything else."""
    from dask.utils import parse_timedelta

    from .errors import ParameterError

    value = dask.config.get("cosmo_dask.pause_timeout", None)
    if value is None:
        return None
    try:
        seconds = None if isinstance(value, bool) else parse_timedelta(value, default="s")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or not 0 <= seconds < float("inf"):
        raise ParameterError(f"dask config cosmo_dask.pause_timeout is {value!r}; expected "
                             "seconds >= 0 (a number, or a string like '30s') or None")
    return float(seconds)


def _paused_workers(client) -> tuple[int, list[str]]:
    """(number of workers, a description of each paused one) of ``client``'s cluster."""
    workers = client.scheduler_info(n_workers=-1).get("workers", {}) or {}
    paused = []
    for address, w in workers.items():
        if w.get("status") != "paused":
            continue
        limit = w.get("memory_limit") or 0
        used = (w.get("metrics") or {}).get("memory") or 0
        paused.append(f"{address} uses {used / 1e6:.0f} MB"
                      + (f" of its {limit / 1e6:.0f} MB limit" if limit else ""))
    return len(workers), paused


def _paused_error(client, seconds: float, paused: list[str]):
    from .errors import ClusterError

    more = f", and {len(paused) - 1} more" if len(paused) > 1 else ""
    return ClusterError(
        f"every worker of the Dask cluster at {getattr(client.scheduler, 'address', '?')} "
        f"has been paused for {seconds:g} s (memory above distributed.worker.memory.pause: "
        f"{paused[0]}{more}), so no task can run: give the workers more memory "
        "(memory_limit), fewer threads each or smaller chunks, or set dask config "
        "cosmo_dask.pause_timeout to wait longer")


async def _first_failure(futures):
    """None once every future is finished, or the first that failed (erred or cancelled)
    as soon as one does. Each is awaited as ``distributed.wait`` does: a result lost with
    a worker is waited for again while the scheduler computes it anew."""
    import asyncio

    async def one(future):
        await future._state.wait()
        return future if future.status in ("error", "cancelled") else None

    outcome = asyncio.get_running_loop().create_future()
    left = [len(futures)]

    def seen(task):  # O(1) per future, however many there are
        if outcome.done() or task.cancelled():
            return
        if task.result() is not None:
            outcome.set_result(task.result())
            return
        left[0] -= 1
        if left[0] == 0:
            outcome.set_result(None)

    tasks = [asyncio.ensure_future(one(f)) for f in futures]
    for t in tasks:
        t.add_done_callback(seen)
    try:
        return await outcome
    finally:
        for t in tasks:
            t.cancel()


def _settle(client, futures, timeout: float | None):
    """Block until every future is finished; return None, or the first future that failed
    (erred or cancelled) as soon as one does. The scheduler fails every dependent of a
    failed task at once, so one failure anywhere ends the wait.

    Every :data:`POLL_INTERVAL` seconds the workers are looked at: ClusterError once
    all of them have been paused (memory above distributed's pause threshold: they run
    nothing) for ``timeout`` seconds (None: no limit)."""
    import asyncio
    import concurrent.futures

    unique = list({f.key: f for f in futures}.values())
    if not unique:
        return None
    outcome = asyncio.run_coroutine_threadsafe(_first_failure(unique),
                                               client.loop.asyncio_loop)
    paused_since = None
    try:
        while True:
            try:
                return outcome.result(timeout=POLL_INTERVAL)
            except concurrent.futures.TimeoutError:
                pass
            if timeout is None:
                continue
            n_workers, paused = _paused_workers(client)
            if not n_workers or len(paused) < n_workers:
                paused_since = None
                continue
            now = time.monotonic()
            paused_since = now if paused_since is None else paused_since
            if now - paused_since >= timeout:
                raise _paused_error(client, timeout, paused)
    finally:
        outcome.cancel()


def _await_distributed(client, futures, display: StageProgress | None,
                       timeout: float | None) -> None:
    """Wait for ``futures`` (:func:`_settle`; ``timeout``: the pause timeout, seconds)
    while ``display`` (if any) shows their progress; raise the first failed task's
    exception. The display only reports: the futures decide when the wait ends, so keys
    that can no longer complete (those of a failed computation) never hold it."""
    from distributed import futures_of

    keys = futures_of(futures)
    shown = None
    if display is not None:
        import asyncio

        bar = _text_multi_progress_bar()(keys, display, client)
        shown = asyncio.run_coroutine_threadsafe(bar.listen(), client.loop.asyncio_loop)
    failed, ok = None, False
    try:
        failed = _settle(client, keys, timeout)
        ok = failed is None
        if shown is not None and (ok or not display._begun):
            # the last counts (the scheduler says "finished" or "error"); after a failure
            # only when nothing was drawn yet: a task that failed before the bar's first
            # update would otherwise leave the stage without a line
            with contextlib.suppress(Exception):
                shown.result(timeout=FINAL_DRAW_WAIT)
    finally:
        if shown is not None:
            shown.cancel()
            display.finish(ok)
    if failed is not None:
        failed.result()  # raises the task's exception (CancelledError if cancelled)


# --------------------------------------------------------------------------- compute / persist
def _run(persist: bool, collections, label, show, scheduler=None):
    if show is None:
        show = bool(dask.config.get("cosmo_dask.progress", False))
    client = active_client(*collections) if scheduler is None else None
    if client is not None:
        timeout = pause_timeout()
        display = StageProgress(label) if show else None
        futures = (client.persist if persist else client.compute)(list(collections))
        try:
            if not persist or display is not None:
                _await_distributed(client, futures, display, timeout)
            # an unshown persist returns at once: whatever reads it waits (and fails)
            return tuple(futures) if persist else tuple(client.gather(futures))
        except BaseException:
            with contextlib.suppress(Exception):  # the scheduler may be gone
                client.cancel(futures)  # stop queued tasks of a failed computation
            raise
    run = dask.persist if persist else dask.compute
    if scheduler is not None:
        run = functools.partial(run, scheduler=scheduler)
    if not show:
        return run(*collections)
    counts = _LocalCounts(StageProgress(label))
    ok = False
    try:
        with counts:
            result = run(*collections)
        ok = True
        return result
    finally:
        counts.close(ok)


def wait(*collections, client=None) -> None:
    """Block until persisted collections (:func:`persist`) or futures are computed; raise
    the first failed task's exception, or ClusterError when every worker stays paused
    longer than dask config ``cosmo_dask.pause_timeout``. ``client``: the one holding
    them (default: the one dask would use for them); nothing to wait for without one."""
    collections = [c for c in collections if c is not None]
    client = client or active_client(*collections)
    if client is not None:
        _await_distributed(client, collections, None, pause_timeout())


def compute(*collections, label: str | None = None, show: bool | None = None,
            scheduler: str | None = None):
    """``dask.compute`` that shows progress when asked; returns the results tuple.

    ``scheduler``: a local dask scheduler ("threads", "sync") to use instead of the
    active client, for work that must run on this machine."""
    return _run(False, collections, label, show, scheduler)


def persist(*collections, label: str | None = None, show: bool | None = None):
    """``dask.persist`` with the same client choice and progress display as :func:`compute`.

    With a distributed client the results stay in worker memory.
    """
    return _run(True, collections, label, show)
