"""Atomic creation of a directory store (snapshots and every product store).

``atomic_directory(path, overwrite=...)`` yields a temporary sibling directory;
the caller writes the whole store into it; on success it is renamed onto
``path``. Any exception (KeyboardInterrupt included) removes the temporary
directory, so a failed or interrupted write leaves nothing at ``path`` and an
existing store there untouched. A write killed outright (SIGKILL, a lost node)
cannot clean up: its ``.<name>.tmp-<hex>`` directory is removed by the next
write to the same path, or by ``cosmo-dask clean PATH``.

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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from .errors import SnapshotError


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
_TEMP = re.compile(r"^\.(?P<target>.+)\.(?P<kind>tmp|old)-[0-9a-f]{12}$")
#: file in a temporary store naming its writer ("host pid"), removed before the rename
WRITER_FILE = ".cosmo_dask_writer"


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
    """The Zarr store ``path`` lies inside, if any (our own temporary stores excepted)."""
    for parent in path.parents:
        if _TEMP.match(parent.name):
            return None  # a writer filling its own temporary store (nested groups)
        if (parent / "zarr.json").is_file():
            return parent
    return None


def check_writable_target(path: str | os.PathLike, *, overwrite: bool, what: str = "store",
                          fmt: str | None = None, inputs=()) -> Path:
    """Refuse targets that cannot or must not be written; return the local path.

    Refused, whatever ``overwrite`` says: a remote URL; a path equal to an input,
    inside one or containing one (``inputs``: the stores the result is made
    from); a path inside any Zarr store; a file. An existing path is replaced
    only with ``overwrite`` and only when it is an empty directory or a
    cosmo_dask store of this kind (``fmt``, e.g. ``"cosmo_dask.halos"``; any
    cosmo_dask store when None), never an arbitrary folder.
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
        if found is None:
            ok = p.is_dir() and not any(p.iterdir())
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


def _writer_alive(tmp: Path) -> bool:
    """Whether the writer named in ``tmp``'s writer file may still be writing."""
    try:
        host, pid = (tmp / WRITER_FILE).read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        # no writer file: an older cosmo_dask, or a writer killed at once; give it a minute
        try:
            return time.time() - tmp.stat().st_mtime < 60
        except OSError:
            return False
    if host != socket.gethostname():
        return True  # cannot tell from here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(path: str | os.PathLike) -> list[tuple[Path, bool]]:
    """Temporary stores of earlier writes to ``path``: ``(directory, writer alive)``."""
    target = local_path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return []
    found = []
    for entry in parent.iterdir():
        m = _TEMP.match(entry.name)
        if m and m.group("target") == target.name and entry.is_dir():
            found.append((entry, _writer_alive(entry)))
    return sorted(found)


def remove_leftovers(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary stores that killed writes to ``path`` left; returns them.

    Those whose writer (named in the store, by host and process id) may still be
    running are kept: another host's, or a live process on this one.
    """
    removed = []
    for entry, alive in leftovers(path):
        if not alive:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def atomic_directory(
    path: str | os.PathLike, *, overwrite: bool = False, what: str = "store",
    fmt: str | None = None, inputs=(),
) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` that becomes ``path`` on success.

    The target is checked first (:func:`check_writable_target` with ``fmt`` and
    ``inputs``), and temporary stores that killed writes to it left behind are
    removed (:func:`remove_leftovers`). With ``overwrite=True`` an existing
    ``path`` is replaced only after the new content is complete (moved aside,
    new one renamed in, old one removed).
    """
    target = check_writable_target(path, overwrite=overwrite, what=what, fmt=fmt,
                                   inputs=inputs)
    remove_leftovers(target)
    token = uuid.uuid4().hex[:12]
    tmp = target.parent / f".{target.name}.tmp-{token}"
    try:
        tmp.mkdir()
        (tmp / WRITER_FILE).write_text(f"{socket.gethostname()} {os.getpid()}\n")
        yield tmp
        (tmp / WRITER_FILE).unlink(missing_ok=True)
        if target.exists():
            if not overwrite:  # appeared while we were writing
                raise SnapshotError(f"{target}: was created by someone else during the write")
            old = target.parent / f".{target.name}.old-{token}"
            os.rename(target, old)
            try:
                os.rename(tmp, target)
            except BaseException:
                os.rename(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        _remove_eventually(tmp)
        raise


def _remove_eventually(tmp: Path) -> None:
    """Remove ``tmp``, again if a writer that was already in flight recreates it."""
    for delay in (0.0, 0.05, 0.2, 0.5):
        time.sleep(delay)
        shutil.rmtree(tmp, ignore_errors=True)
