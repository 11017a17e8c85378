"""Atomic creation of a directory store (snapshots and every product store).

``atomic_directory(path, overwrite=...)`` yields a temporary sibling directory;
the caller writes the whole store into it; on success it is renamed onto
``path``. Any exception (KeyboardInterrupt included) removes the temporary
directory, so a failed or interrupted write leaves nothing at ``path`` and an
existing store there untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from .errors import SnapshotError


def is_remote(path: str | os.PathLike) -> bool:
    """True for fsspec-style URLs (``s3://...``), which have no atomic rename."""
    return "://" in str(path) and not str(path).startswith("file://")


def local_path(path: str | os.PathLike) -> Path:
    s = str(path)
    if s.startswith("file://"):
        s = s[len("file://") :]
    return Path(s).expanduser()


def check_writable_target(path: str | os.PathLike, *, overwrite: bool, what: str = "store") -> Path:
    """Refuse targets that cannot be written; return the local path."""
    if is_remote(path):
        raise NotImplementedError(
            f"{path}: writing to remote URLs is not implemented (no atomic rename there); "
            "write to a local or shared-filesystem path"
        )
    p = local_path(path)
    if p.is_file():
        raise SnapshotError(f"{p}: is a file; a {what} is a directory, choose another path")
    if p.exists() and not overwrite:
        raise SnapshotError(f"{p}: already exists; pass overwrite=True to replace it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise SnapshotError(f"{p}: parent directory {parent} does not exist")
    return p


@contextlib.contextmanager
def atomic_directory(
    path: str | os.PathLike, *, overwrite: bool = False, what: str = "store"
) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` that becomes ``path`` on success.

    With ``overwrite=True`` an existing ``path`` is replaced only after the new
    content is complete (moved aside, new one renamed in, old one removed).
    """
    target = check_writable_target(path, overwrite=overwrite, what=what)
    token = uuid.uuid4().hex[:12]
    tmp = target.parent / f".{target.name}.tmp-{token}"
    try:
        tmp.mkdir()
        yield tmp
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
