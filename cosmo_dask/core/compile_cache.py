"""Compile each numba kernel once per machine, not once per process.

numba caches a compiled kernel on disk (``cache=True``, under ``NUMBA_CACHE_DIR`` or the
package's ``__pycache__``), but a process only looks at the cache before it starts
compiling: the worker processes of a local cluster that reach a kernel at the same time
all compile it, and the last to finish overwrites the cache index the others wrote
(numba reads, extends and rewrites the index of a source file without a lock).

:func:`install` makes a process take an exclusive file lock, next to the kernel's cache
index, around each compilation of a cached kernel. A second process that needs the same
kernel waits for the lock, then finds the first one's result in the cache and loads it
(milliseconds) instead of compiling it again; the index is written by one process at a
time. Kernels without ``cache=True``, or whose cache directory is not writable, compile
as before, unlocked. :func:`install` is called in the client process and, through
:class:`CompileLockPlugin`, in the workers of a local cluster that
:func:`cosmo_dask.connect` starts.
"""

from __future__ import annotations

import contextlib
import os
import threading

try:  # the workers' plugin base class; the plugin is used only where Dask is
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except ImportError:  # pragma: no cover - distributed is a dependency
    _WorkerPlugin = object

__all__ = ["CompileLockPlugin", "install", "installed"]

_installed = False
_install_lock = threading.Lock()
#: the lock files this thread holds (a kernel compiled inside another's compilation
#: takes its own lock; the same file is never locked twice by one thread)
_held = threading.local()


def _lock_path(dispatcher) -> str | None:
    """The lock file of ``dispatcher``'s on-disk cache, ``None`` without one."""
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    index = getattr(cache_file, "_index_path", None)
    return None if index is None else index + ".lock"


@contextlib.contextmanager
def _file_lock(path: str):
    import fcntl

    held = _held.__dict__.setdefault("paths", set())
    if path in held:
        yield
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # no writable cache directory: numba will not cache either
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some network mounts): unlocked
            locked = False
        else:
            locked = True
            held.add(path)
        try:
            yield
        finally:
            if locked:
                held.discard(path)
    finally:
        os.close(fd)  # releases the lock


def install() -> None:
    """Lock each cached numba compilation in this process against other processes' (once
    per process; idempotent, thread-safe).

    The lock is taken inside numba's own (in-process) compiler lock, so that two threads
    of one process never wait on each other through the file.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.dispatcher import Dispatcher

        original = Dispatcher.compile

        def compile(self, sig):  # noqa: A001 - numba's method name
            path = _lock_path(self)
            if path is None or not self._can_compile:
                return original(self, sig)
            with global_compiler_lock, _file_lock(path):
                return original(self, sig)

        compile.__wrapped__ = original
        compile.__doc__ = original.__doc__
        Dispatcher.compile = compile
        _installed = True


def installed() -> bool:
    """Whether :func:`install` ran in this process."""
    return _installed


class CompileLockPlugin(_WorkerPlugin):
    """A Dask worker plugin that calls :func:`install` in each worker process (and in
    workers that join later)."""

    name = "cosmo-dask-compile-lock"

    def setup(self, worker=None) -> None:
        install()
