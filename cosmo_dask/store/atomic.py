"""Atomic creation of a directory store (snapshots, every product store, simulations).

``atomic_directory(path, overwrite=...)`` yields a temporary sibling directory;
the caller writes the whole store into it; on success it is renamed onto
``path``. Any exception (KeyboardInterrupt included) removes the temporary
directory, so a failed or interrupted write leaves nothing at ``path`` and an
existing store there untouched. :class:`Replacement` is the same write without
the ``with`` block, for a writer that decides itself when the new content is
complete enough to take the target's place (a simulation run: after its first
output or checkpoint).

A write is one token ``T`` and up to three siblings of ``path`` (``NAME``)::

    .NAME.tmp-T           the new store, being written
    .NAME.tmp-T.writer    its writer, for the whole life of .NAME.tmp-T: JSON
                          {"host", "pid", "start"} (process start time, s since
                          the epoch), its mtime refreshed every minute
    .NAME.old-T           the store being replaced, only between the two renames
                          of an overwrite (``path`` -> ``.old-T``, ``.tmp-T`` ->
                          ``path``); it exists only once ``.tmp-T`` is complete

A write killed outright (SIGKILL, a lost node) cannot clean up. What it left is
settled by the next open of ``path`` (:func:`recover`), the next write to it,
or ``cosmo-dask clean PATH`` (:func:`clean`), and only once its writer is gone
(:func:`writer_state`): a replace interrupted between its renames is finished
(``.tmp-T`` renamed onto ``path``, since it is complete) or, without
``.tmp-T``, undone (``.old-T`` put back), never deleted; an unfinished
``.tmp-T`` is removed.

Targets are guarded (:func:`check_writable_target`): never an input, inside or
around one, or inside a Zarr store; ``overwrite`` replaces only a cosmo_dask
store of the same kind or an empty directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from ..core.errors import ClusterError, SnapshotError


def is_remote(path: str | os.PathLike) -> bool:
    """True for fsspec-style URLs (``s3://...``), which have no atomic rename."""
    return "://" in str(path) and not str(path).startswith("file://")


def local_path(path: str | os.PathLike) -> Path:
    """The absolute local path of ``path`` (``file://`` and ``~`` resolved).

    Absolute on the client, before it enters any graph: a worker that runs in
    another directory must find the same store (a relative path would name a
    different, or no, store there)."""
    s = str(path)
    if s.startswith("file://"):
        s = s[len("file://") :]
    return Path(os.path.abspath(Path(s).expanduser()))


#: name of a temporary store: ``.<target name>.tmp-<12 hex>`` (``.old-`` while replacing)
_TEMP = re.compile(r"^\.(?P<target>.+)\.(?P<kind>tmp|old)-(?P<token>[0-9a-f]{12})$")
#: suffix of the writer marker next to a temporary store (``.<name>.tmp-<hex>.writer``)
MARKER_SUFFIX = ".writer"
#: writer file inside a temporary store written by cosmo_dask before the marker moved
#: next to the store ("host pid"); still read, never written
WRITER_FILE = ".cosmo_dask_writer"
#: seconds between two refreshes of a live writer's marker (its mtime)
HEARTBEAT_SECONDS = 60.0
#: another host's writer whose marker was not refreshed for this long is gone (seconds)
STALE_SECONDS = 3600.0
#: a temporary store without any writer record (an older cosmo_dask) is left alone while
#: it was modified within this many seconds
NO_MARKER_GRACE = 60.0
#: two start times of one process agree to this (s): psutil derives them from the boot
#: time, which the kernel may report one second apart
START_TOLERANCE = 1.0


def store_format(path: Path) -> str | None:
    """``format`` attribute of the Zarr v3 store at ``path``: None when ``path`` holds no
    ``zarr.json``, "" for a Zarr store without one (or an unreadable ``zarr.json``)."""
    meta = path / "zarr.json"
    if not meta.is_file():
        return None
    try:
        doc = json.loads(meta.read_text())
    except (OSError, ValueError):
        return ""
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    return str(attrs.get("format", "")) if isinstance(attrs, dict) else ""


def inside_store(path: Path) -> Path | None:
    """The Zarr store ``path`` lies inside, if any.

    A writer filling its own temporary store (``.NAME.tmp-T``, nested groups) may
    write below it: the Zarr groups between ``path`` and the nearest temporary store
    are that store's own; above it, any Zarr store counts (a directory named like a
    temporary store inside an input store is still inside the input)."""
    parents = list(path.parents)
    nearest = next((i for i, p in enumerate(parents) if _TEMP.match(p.name)), None)
    for parent in parents if nearest is None else parents[nearest + 1:]:
        if (parent / "zarr.json").is_file():
            return parent
    return None


def check_writable_target(path: str | os.PathLike, *, overwrite: bool, what: str = "store",
                          fmt: str | None = None, inputs=(),
                          replaceable: Callable[[Path], bool] | None = None) -> Path:
    """Refuse targets that cannot or must not be written; return the local path.

    Refused, whatever ``overwrite`` says: a remote URL; a path equal to an input,
    inside one or containing one (``inputs``: the stores the result is made
    from); a path inside any Zarr store (:func:`inside_store`, symbolic links and
    empty directories inside the store included); a file. An existing path is
    replaced only with ``overwrite`` and only when it is an empty directory or a
    cosmo_dask store of this kind (``fmt``, e.g. ``"cosmo_dask.halos"``; any
    cosmo_dask store when None; ``replaceable(path)`` decides instead when given),
    never an arbitrary folder.
    """
    if is_remote(path):
        raise NotImplementedError(
            f"{path}: writing to remote URLs is not implemented (no atomic rename there); "
            "write to a local or shared-filesystem path"
        )
    p = local_path(path)
    real = Path(os.path.realpath(p))
    for source in inputs:
        if not isinstance(source, (str, os.PathLike)) or is_remote(source):
            continue
        src = Path(os.path.realpath(local_path(source)))
        if real == src:
            raise SnapshotError(f"{p}: is the input {source}; write the {what} to another path")
        if src in real.parents:
            raise SnapshotError(f"{p}: lies inside the input {source}; write the {what} "
                                "outside it")
        if real in src.parents:
            raise SnapshotError(f"{p}: contains the input {source}; write the {what} to "
                                "another path")
    outer = inside_store(real)
    if outer is not None:
        raise SnapshotError(f"{p}: lies inside the Zarr store {outer}; write the {what} "
                            "outside it")
    if p.is_file():
        raise SnapshotError(f"{p}: is a file; a {what} is a directory, choose another path")
    if p.exists():
        if not overwrite:
            raise SnapshotError(f"{p}: already exists; pass overwrite=True to replace it")
        found = store_format(p)
        if p.is_dir() and not any(p.iterdir()):
            ok = True
        elif replaceable is not None:
            ok = replaceable(p)
        elif found is None:
            ok = False
        else:
            ok = found == fmt if fmt is not None else found.startswith("cosmo_dask.")
        if not ok:
            what_is = ("a directory that is not a cosmo_dask store" if found is None
                       else f"a Zarr store of format {found!r}" if found
                       else "a Zarr store that is not cosmo_dask's")
            raise SnapshotError(
                f"{p}: is {what_is}; overwrite=True replaces only an existing {what}"
                f"{f' (format {fmt!r})' if fmt else ''} or an empty directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise SnapshotError(f"{p}: parent directory {parent} does not exist")
    check_can_create(parent, p, what)
    return p


def check_can_create(parent: Path, target: Path, what: str) -> None:
    """SnapshotError unless a directory can be created in ``parent`` (tried, then removed):
    a read-only filesystem or a folder without write permission is found before any work,
    not by the first chunk write."""
    try:
        probe = tempfile.mkdtemp(prefix=".cosmo_dask-probe-", dir=parent)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SnapshotError(f"{target}: cannot create the {what} in {parent} ({reason}); "
                            "write it to a directory you can write to") from None
    os.rmdir(probe)


# ----------------------------------------------------------------------------- writers
def process_start(pid: int) -> float | None:
    """Start time of process ``pid`` (seconds since the epoch), None if there is none."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return None
    except (psutil.Error, OSError):
        return float("nan")  # exists, start unknown (access denied)


def _marker(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + MARKER_SUFFIX)


def _tmp_of(entry: Path) -> Path:
    """The ``.tmp-T`` store of a write's ``.tmp-T`` or ``.old-T`` directory."""
    m = _TEMP.match(entry.name)
    return entry.with_name(f".{m.group('target')}.tmp-{m.group('token')}")


def _read_record(tmp: Path) -> tuple[dict | None, float | None]:
    """``(record, age of the record in s)`` of the writer of ``tmp``: its marker, else the
    writer file inside it (older cosmo_dask); ``(None, None)`` without either."""
    for where, legacy in ((_marker(tmp), False), (tmp / WRITER_FILE, True)):
        try:
            text = where.read_text()
            age = time.time() - where.stat().st_mtime
        except OSError:
            continue
        try:
            if legacy:
                host, pid = text.split()
                return {"host": host, "pid": int(pid), "start": None}, age
            doc = json.loads(text)
            return {"host": str(doc["host"]), "pid": int(doc["pid"]),
                    "start": None if doc.get("start") is None else float(doc["start"])}, age
        except (ValueError, KeyError, TypeError):
            return {"host": "?", "pid": -1, "start": None}, age  # garbled: judged by age
    return None, None


def writer_state(tmp: Path) -> tuple[bool, str]:
    """``(alive, why)``: whether the writer of the temporary store ``tmp`` may still be
    writing, and why.

    Gone: its process on this host is not running, or its process id now belongs to a
    process started at another time; on another host, its marker was not refreshed for
    :data:`STALE_SECONDS`; without any record, ``tmp`` unmodified for
    :data:`NO_MARKER_GRACE` s. Alive otherwise.
    """
    record, age = _read_record(tmp)
    if record is None:
        try:
            idle = time.time() - tmp.stat().st_mtime
        except OSError:
            return False, "no writer record"
        if idle < NO_MARKER_GRACE:
            return True, f"no writer record, modified {idle:.0f} s ago"
        return False, f"no writer record, unmodified for {idle:.0f} s"
    host, pid, start = record["host"], record["pid"], record["start"]
    if host != socket.gethostname():
        if age is not None and age > STALE_SECONDS:
            return False, (f"its writer on host {host} gave no sign of life for {age:.0f} s "
                           f"(more than {STALE_SECONDS:.0f} s)")
        return True, f"its writer runs on host {host} (process {pid})"
    now = process_start(pid) if pid > 0 else None
    if now is None:
        return False, f"its writer (process {pid} on this host) is not running"
    if start is not None and now == now and abs(now - start) > START_TOLERANCE:
        return False, (f"its writer (process {pid} on this host) is gone; the process id now "
                       "belongs to another process")
    return True, f"its writer (process {pid} on this host) is running"


class _Heartbeat:
    """One daemon thread refreshing the mtime of every live writer marker of this process."""

    def __init__(self):
        self.markers: set[Path] = set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, marker: Path) -> None:
        with self.lock:
            self.markers.add(marker)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="cosmo_dask-writer",
                                               daemon=True)
                self.thread.start()

    def discard(self, marker: Path) -> None:
        with self.lock:
            self.markers.discard(marker)

    def _run(self) -> None:
        while True:
            time.sleep(HEARTBEAT_SECONDS)
            with self.lock:
                markers = list(self.markers)
            for marker in markers:
                with contextlib.suppress(OSError):
                    os.utime(marker)


_HEARTBEAT = _Heartbeat()


class Replacement:
    """One atomic write of ``target``: a temporary sibling, its writer marker, the swap.

    :meth:`start` writes the marker and creates :attr:`tmp`; the caller fills
    ``tmp``; :meth:`commit` renames it onto ``target`` (moving an existing
    ``target`` aside first and removing it after); :meth:`abort` removes ``tmp``.
    No target checks here: see :func:`check_writable_target`.
    """

    def __init__(self, target: Path):
        self.target = Path(target)
        token = uuid.uuid4().hex[:12]
        self.tmp = self.target.parent / f".{self.target.name}.tmp-{token}"
        self.old = self.target.parent / f".{self.target.name}.old-{token}"
        self.marker = _marker(self.tmp)

    def start(self) -> Path:
        """Write the writer marker, then create :attr:`tmp`; returns it."""
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "start": process_start(os.getpid())}
        with open(self.marker, "x") as f:
            json.dump(record, f)
        try:
            self.tmp.mkdir()
        except BaseException:
            self.marker.unlink(missing_ok=True)
            raise
        _HEARTBEAT.add(self.marker)
        return self.tmp

    def commit(self, *, overwrite: bool) -> Path:
        """Put the complete :attr:`tmp` at the target (replacing it only with
        ``overwrite``); returns the target."""
        target = self.target
        if target.exists() or target.is_symlink():
            if not overwrite:  # appeared while we were writing
                raise SnapshotError(f"{target}: was created by someone else during the write")
            os.rename(target, self.old)
            try:
                os.rename(self.tmp, target)
            except BaseException:
                os.rename(self.old, target)
                raise
            shutil.rmtree(self.old, ignore_errors=True)
        else:
            os.rename(self.tmp, target)
        self._release()
        return target

    def abort(self) -> None:
        """Remove :attr:`tmp` (and the marker); the target is left as it is."""
        _remove_eventually(self.tmp)
        self._release()

    def _release(self) -> None:
        _HEARTBEAT.discard(self.marker)
        self.marker.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- leftovers
def leftovers(path: str | os.PathLike) -> list[tuple[Path, bool]]:
    """Temporary stores of earlier writes to ``path`` (``.tmp-T`` and ``.old-T``
    directories): ``(directory, writer alive)``."""
    target = local_path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return []
    found = []
    for entry in parent.iterdir():
        m = _TEMP.match(entry.name)
        if m and m.group("target") == target.name and entry.is_dir():
            found.append((entry, writer_state(_tmp_of(entry))[0]))
    return sorted(found)


def recover(path: str | os.PathLike) -> list[tuple[Path, str]]:
    """Settle replaces of ``path`` interrupted between their two renames; returns
    ``(directory, what was done)`` per ``.old-T`` found.

    Only once the write's writer is gone (:func:`writer_state`). No store at
    ``path``: ``.tmp-T`` (complete, since ``.old-T`` exists only then) is renamed
    onto ``path`` and ``.old-T`` removed, or, without ``.tmp-T``, ``.old-T`` is put
    back. A store at ``path`` (the second rename happened): ``.old-T`` is what it
    replaced and is removed. A complete store is never deleted.
    """
    target = local_path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return []
    done = []
    olds = sorted(e for e in parent.iterdir() if e.is_dir() and (m := _TEMP.match(e.name))
                  and m.group("kind") == "old" and m.group("target") == target.name)
    for old in olds:
        tmp = _tmp_of(old)
        alive, why = writer_state(tmp)
        if alive:
            done.append((old, f"kept ({why})"))
            continue
        if not (target.exists() or target.is_symlink()):
            try:
                if tmp.is_dir():
                    os.rename(tmp, target)
                    shutil.rmtree(old, ignore_errors=True)
                    done.append((old, f"replace finished: the new store {tmp.name} moved to "
                                      f"{target} ({why})"))
                else:
                    os.rename(old, target)
                    done.append((old, f"restored to {target} ({why})"))
            except OSError as exc:  # another process settled it first
                done.append((old, f"kept (changed while settling it: {exc.strerror})"))
                continue
        elif not tmp.exists():
            shutil.rmtree(old, ignore_errors=True)
            done.append((old, f"removed: {target} replaced it ({why})"))
        else:
            done.append((old, f"kept: {target} exists and {tmp.name} too, which is the "
                              "complete store is unclear; remove one yourself"))
            continue
        _marker(tmp).unlink(missing_ok=True)
    return done


def clean(path: str | os.PathLike) -> list[tuple[Path, str]]:
    """Settle what killed writes to ``path`` left; returns ``(entry, what was done)``.

    :func:`recover` first; then the ``.tmp-T`` stores (and orphan markers) whose
    writer is gone are removed, those whose writer may still be running kept.
    """
    target = local_path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return []
    done = recover(target)
    for entry in sorted(parent.iterdir()):
        name = entry.name
        is_marker = name.endswith(MARKER_SUFFIX)
        m = _TEMP.match(name[: -len(MARKER_SUFFIX)] if is_marker else name)
        if not m or m.group("target") != target.name or m.group("kind") != "tmp":
            continue
        tmp = entry.with_name(name[: -len(MARKER_SUFFIX)]) if is_marker else entry
        if is_marker and tmp.exists():
            continue  # judged with its store
        if not is_marker and not entry.is_dir():
            continue
        if (parent / f".{m.group('target')}.old-{m.group('token')}").exists():
            continue  # part of a replace recover() kept
        alive, why = writer_state(tmp)
        if alive:
            done.append((entry, f"kept ({why})"))
            continue
        if is_marker:
            entry.unlink(missing_ok=True)
        else:
            shutil.rmtree(entry, ignore_errors=True)
            _marker(entry).unlink(missing_ok=True)
        done.append((entry, f"removed ({why})"))
    return done


def remove_leftovers(path: str | os.PathLike) -> list[Path]:
    """:func:`clean` ``path``; returns the entries removed or moved back."""
    return [entry for entry, what in clean(path) if not what.startswith("kept")]


def clean_tree(path: str | os.PathLike, depth: int = 3) -> list[tuple[Path, str]]:
    """:func:`clean` ``path`` and every store below it in directories that are not
    Zarr stores (a simulation store's checkpoint and outputs), ``depth`` levels down."""
    root = local_path(path)
    done = clean(root)
    if depth <= 0 or not root.is_dir() or (root / "zarr.json").exists():
        return done
    targets = set()
    for entry in sorted(root.iterdir()):
        name = entry.name[: -len(MARKER_SUFFIX)] if entry.name.endswith(MARKER_SUFFIX) \
            else entry.name
        m = _TEMP.match(name)
        if m:
            targets.add(m.group("target"))
        elif entry.is_dir() and not entry.is_symlink():
            done += clean_tree(entry, depth - 1)
    for name in sorted(targets):
        if not (root / name).is_dir():
            done += clean(root / name)
    return done


@contextlib.contextmanager
def atomic_directory(
    path: str | os.PathLike, *, overwrite: bool = False, what: str = "store",
    fmt: str | None = None, inputs=(), replaceable: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` that becomes ``path`` on success.

    What killed writes to ``path`` left is settled first (:func:`clean`: an
    interrupted replace finished or undone, dead writers' temporary stores
    removed); then the target is checked (:func:`check_writable_target` with
    ``fmt``, ``inputs`` and ``replaceable``). With ``overwrite=True`` an existing
    ``path`` is replaced only after the new content is complete (moved aside,
    new one renamed in, old one removed).
    """
    if not is_remote(path):
        clean(path)
    target = check_writable_target(path, overwrite=overwrite, what=what, fmt=fmt,
                                   inputs=inputs, replaceable=replaceable)
    write = Replacement(target)
    write.start()
    try:
        yield write.tmp
        write.commit(overwrite=overwrite)
    except BaseException:
        write.abort()
        raise


def _remove_eventually(tmp: Path) -> None:
    """Remove ``tmp``, again if a writer that was already in flight recreates it."""
    for delay in (0.0, 0.05, 0.2, 0.5):
        time.sleep(delay)
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ workers' view
def _paths_seen(inputs, parents):
    """On a worker: the inputs it cannot see and the output parents it cannot create in
    (tried as on the client, :func:`check_can_create`)."""
    from pathlib import Path

    missing = [p for p in inputs if not os.path.exists(p)]
    unwritable = []
    for p in parents:
        try:
            check_can_create(Path(p), Path(p), "output")
        except (SnapshotError, FileNotFoundError, NotADirectoryError):
            unwritable.append(p)
    return missing, unwritable


def check_worker_paths(client, inputs=(), outputs=()) -> None:
    """ClusterError unless a worker of ``client`` sees every input path and can create
    every output (its parent directory exists there and is writable).

    One small task on one worker; paths are made absolute here, on the client.
    Call it before any work on a cluster whose workers may run on other hosts
    or in other directories.
    """
    ins = [str(local_path(p)) for p in inputs if p]
    parents = [str(local_path(p).parent) for p in outputs if p]
    if not ins and not parents:
        return
    from ..core.progress import wait

    future = client.submit(_paths_seen, ins, parents, pure=False,
                           key=f"check-paths-{os.getpid()}-{id(ins)}")
    wait(future, client=client)  # bounded while the workers are paused
    missing, unwritable = future.result()
    if missing:
        raise ClusterError(
            f"{missing[0]}: the workers cannot see this path; a store must be on a filesystem "
            "the workers share with this machine, at the same path")
    if unwritable:
        raise ClusterError(
            f"{unwritable[0]}: the workers cannot write into this directory; outputs must be "
            "on a filesystem the workers share with this machine, at the same path")
