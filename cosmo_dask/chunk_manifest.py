"""What a cosmo_dask store wrote, and checks that it is all still there.

Every array cosmo_dask writes (:func:`zarr_write.store_arrays`) records in its
attributes, under :data:`MANIFEST`, how many chunk files it wrote, each file's
size and each file's CRC-32. Opening a store checks that every chunk file
exists with its recorded size (one ``stat`` per chunk, no data read);
:meth:`Snapshot.validate` with ``full=True`` (and ``cosmo-dask info``) also
re-reads every file and compares its CRC-32, so a chunk altered in place
(same size, other bytes) is found too.

Zarr reads a missing chunk file as the array's fill value, so without these
checks a deleted chunk would silently read as zeros.
"""

from __future__ import annotations

import os
import uuid
import zlib

import numpy as np

from .errors import SnapshotError

#: array attribute where cosmo_dask records the chunks it wrote
#: (``n_chunks``, ``sizes`` in bytes, ``crc32`` of each file, in chunk-grid order)
MANIFEST = "cosmo_dask_chunks"
#: bytes of chunk files one checksum task reads
_TASK_BYTES = 256 << 20


def local_root(zarray) -> str | None:
    """The directory of ``zarray`` on a local filesystem, or None for other stores."""
    try:
        from zarr.storage import LocalStore
    except ImportError:  # pragma: no cover - zarr layout changed
        return None
    if not isinstance(zarray.store, LocalStore):
        return None
    return os.path.join(str(zarray.store.root), zarray.path)


def chunk_files(zarray) -> list[tuple[str, int | None]] | None:
    """``(key, size or None if absent)`` of every chunk of a local Zarr v3 array, in grid
    order; None for arrays this cannot list (remote stores, Zarr v2)."""
    root = local_root(zarray)
    meta = zarray.metadata
    if root is None or getattr(meta, "zarr_format", None) != 3:
        return None
    grid = [-(-s // c) if s else 0 for s, c in zip(zarray.shape, meta.chunk_grid.chunk_shape,
                                                   strict=True)]
    out = []
    for index in np.ndindex(*grid):
        key = meta.encode_chunk_key(index)
        try:
            size = os.stat(os.path.join(root, key)).st_size
        except FileNotFoundError:
            size = None
        out.append((key, size))
    return out


def _crc32_files(root: str, keys: list[str]) -> list[int | None]:
    """CRC-32 of each chunk file (None where it is missing); a task's body."""
    out = []
    for key in keys:
        try:
            with open(os.path.join(root, key), "rb") as f:
                out.append(zlib.crc32(f.read()))
        except FileNotFoundError:
            out.append(None)
    return out


def _crc32_tasks(graph, root: str, files: list[tuple[str, int | None]]) -> list:
    """Keys of tasks in ``graph`` (a :class:`~cosmo_dask.task_graph.TaskGraph`) listing
    the CRC-32s of ``files`` in order, about :data:`_TASK_BYTES` a task."""
    batches, batch, held = [], [], 0
    for key, size in files:
        batch.append(key)
        held += size or 0
        if held >= _TASK_BYTES:
            batches.append(batch)
            batch, held = [], 0
    if batch:
        batches.append(batch)
    run = uuid.uuid4().hex  # the files' bytes are an input no name can hash: fresh keys
    return [graph.add(f"checksum-{run}-{i}", _crc32_files, root, keys).key
            for i, keys in enumerate(batches)]


def _checksum_scheduler() -> str | None:
    """Where the CRC-32 tasks run: on the active cluster's workers (None), unless it has
    fewer threads than this machine has cores: then on this machine's threads ("threads"),
    which see the same files (they were listed here). A local GPU cluster has one thread
    per GPU, so a 4.3 GB store's checksums took ~10 s on one thread of a 16-core host."""
    from .progress import active_client

    client = active_client()
    if client is None:
        return None
    try:
        threads = sum(client.nthreads().values())
    except Exception:  # noqa: BLE001 - the cluster says why when the tasks run there
        return None
    return "threads" if threads < (os.cpu_count() or 1) else None


def _checksums(arrays: list, label: str,
               show: bool | None = None) -> list[tuple[list, list] | None]:
    """``(chunk_files, CRC-32s)`` of each array (None for an array that cannot be listed),
    computed by dask tasks (on the cluster's workers when a client is active)."""
    from .task_graph import TaskGraph

    listed = [(local_root(a), chunk_files(a)) for a in arrays]
    g = TaskGraph()
    tasks = [_crc32_tasks(g, root, files) if files is not None else [] for root, files in listed]
    flat = [t for ts in tasks for t in ts]
    results = iter(g.compute(flat, label=label, show=show, scheduler=_checksum_scheduler())
                   if flat else ())
    out = []
    for (_, files), ts in zip(listed, tasks, strict=True):
        out.append(None if files is None else (files, [c for _ in ts for c in next(results)]))
    return out


def write_manifests(arrays: list, label: str, show: bool | None = None) -> None:
    """Record the chunks of just-written arrays (count, sizes, CRC-32s) in their attributes."""
    for arr, found in zip(arrays, _checksums(arrays, label, show), strict=True):
        if found is not None:
            files, crcs = found
            arr.attrs.update({MANIFEST: {"n_chunks": len(files),
                                         "sizes": [size for _, size in files],
                                         "crc32": crcs}})


def check_chunks(zarray, name: str, source: str, *, allow_missing: bool = False,
                 required: bool = True) -> None:
    """SnapshotError unless every chunk of ``zarray`` is there with its written size.

    With a manifest (stores cosmo_dask wrote): every chunk must exist with its
    recorded size. Without one (other writers, which may skip chunks that hold
    only the fill value): a missing chunk is an error unless ``allow_missing``.
    ``required=False`` checks only arrays that have a manifest. Remote stores
    are not listed (nothing checked). Reads no data; see :func:`checksum_problems`.
    """
    manifest = zarray.attrs.get(MANIFEST)
    if manifest is None and not required:
        return
    files = chunk_files(zarray)
    if files is None:
        return
    what = f"{source}: array '{name}'"
    if manifest is not None:
        sizes = list(manifest.get("sizes", []))
        if len(sizes) != len(files):
            raise SnapshotError(f"{what} has {len(files)} chunks, its manifest records "
                                f"{len(sizes)}; the store was altered after it was written")
        for (key, size), want in zip(files, sizes, strict=True):
            if size is None:
                raise SnapshotError(f"{what}: chunk {key} is missing (the store was written "
                                    "complete); restore it or re-create the store")
            if size != want:
                raise SnapshotError(f"{what}: chunk {key} has {size} bytes, {want} when it "
                                    "was written; the chunk was altered or truncated")
        return
    missing = [key for key, size in files if size is None]
    if missing and not allow_missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise SnapshotError(
            f"{what}: chunk {missing[0]}{more} missing; a missing chunk would read as the fill "
            f"value ({zarray.metadata.fill_value}); if the writer skipped chunks that hold "
            "only the fill value, open with allow_missing_chunks=True")


def checksum_problems(named_arrays: dict, source: str) -> list[str]:
    """Re-read every chunk file of the arrays whose manifest holds CRC-32s and compare.

    Returns one message per array with altered chunks (naming the first chunk
    and how many differ); arrays without checksums are skipped. Reads every
    chunk file once, in dask tasks.
    """
    checked = {n: a for n, a in named_arrays.items()
               if (a.attrs.get(MANIFEST) or {}).get("crc32") is not None}
    if not checked:
        return []
    found = _checksums(list(checked.values()), f"checksums of {source}")
    problems = []
    for (name, arr), listed in zip(checked.items(), found, strict=True):
        if listed is None:
            continue
        files, crcs = listed
        want = arr.attrs[MANIFEST]["crc32"]
        if len(want) != len(crcs):
            problems.append(f"{source}: array '{name}' has {len(crcs)} chunks, its manifest "
                            f"records {len(want)}; the store was altered after it was written")
            continue
        bad = [key for (key, _), got, w in zip(files, crcs, want, strict=True) if got != w]
        if bad:
            more = f" (and {len(bad) - 1} more chunks)" if len(bad) > 1 else ""
            problems.append(f"{source}: array '{name}': chunk {bad[0]}{more} does not match "
                            "the CRC-32 recorded when it was written; the chunk was altered "
                            "or corrupted: restore it or re-create the store")
    return problems
