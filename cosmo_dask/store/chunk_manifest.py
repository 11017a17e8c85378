"""What a cosmo_dask store wrote, and checks that it is all still there.

Every array cosmo_dask writes (:func:`zarr_write.store_arrays`) records in its
attributes, under :data:`MANIFEST`, how many chunk files it wrote, each file's
size and each file's CRC-32. Opening a store first compares the chunk count the
array's shape implies with the manifest's (:func:`check_grid`: arithmetic only, so
an edited shape is refused before any chunk is listed), then checks that every
chunk file exists with its recorded size (one ``stat`` per chunk, no data read).

Every read verifies (unless ``verify=False``, ``--no-verify`` or the dask config
``cosmo_dask.verify`` is False): each chunk file's CRC-32 is computed over its raw
bytes as they are read (:func:`crc32`, no second read) and compared with the
manifest's; a mismatch raises :class:`~cosmo_dask.core.errors.ChecksumError` naming the
store, array and chunk. Snapshot reads do it in :mod:`cosmo_dask.store.zarr_read`; every
read through the zarr library (products, tables) goes through :class:`VerifiedStore`.
:meth:`Snapshot.validate` with ``full=True`` (and ``cosmo-dask info``) re-reads every
file and lists every altered chunk.

Zarr reads a missing chunk file as the array's fill value, so without these
checks a deleted chunk would silently read as zeros.
"""

from __future__ import annotations

import functools
import json
import math
import os
import uuid

import numpy as np
from zarr.storage import LocalStore

from ..core.errors import ChecksumError, SnapshotError

try:  # the same CRC-32 as zlib's, 5-10 times faster (ISA-L; zlib-ng): optional
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from zlib_ng.zlib_ng import crc32
    except ImportError:
        from zlib import crc32

#: array attribute where cosmo_dask records the chunks it wrote
#: (``n_chunks``, ``sizes`` in bytes, ``crc32`` of each file, in chunk-grid order)
MANIFEST = "cosmo_dask_chunks"
#: bytes of chunk files one checksum task reads
_TASK_BYTES = 256 << 20


def local_root(zarray) -> str | None:
    """The directory of ``zarray`` on a local filesystem, or None for other stores."""
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
                out.append(crc32(f.read()))
        except FileNotFoundError:
            out.append(None)
    return out


def _crc32_tasks(graph, root: str, files: list[tuple[str, int | None]]) -> list:
    """Keys of tasks in ``graph`` (a :class:`~cosmo_dask.core.task_graph.TaskGraph`) listing
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
    per GPU: too few threads for the checksums of a large store (benchmarks/RESULTS.md,
    CLI pipeline on one GPU)."""
    from ..core.progress import active_client

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
    from ..core.task_graph import TaskGraph

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


def verify_default(verify: bool | None) -> bool:
    """``verify``, or the dask config ``cosmo_dask.verify`` (default True) when None."""
    if verify is None:
        import dask

        return bool(dask.config.get("cosmo_dask.verify", True))
    return bool(verify)


def grid_count(shape, chunk_shape) -> int:
    """Chunks of a regular grid (arithmetic: nothing is listed or allocated)."""
    return math.prod(-(-int(s) // int(c)) if s else 0
                     for s, c in zip(shape, chunk_shape, strict=True))


def check_grid(zarray, name: str, source: str) -> None:
    """SnapshotError unless the chunk count ``zarray``'s shape implies is the one its
    manifest records (arrays without a manifest pass). Arithmetic on the metadata only,
    so an edited shape (``[1e12, 3]``) is refused at once, before any chunk is listed."""
    manifest = zarray.attrs.get(MANIFEST)
    if not isinstance(manifest, dict):
        return
    chunk_shape = getattr(getattr(zarray.metadata, "chunk_grid", None), "chunk_shape", None)
    if chunk_shape is None:
        return
    n = grid_count(zarray.shape, chunk_shape)
    recorded = [manifest.get("n_chunks"), *(len(manifest[k]) for k in ("sizes", "crc32")
                                            if isinstance(manifest.get(k), list))]
    if any(r != n for r in recorded):
        raise SnapshotError(
            f"{source}: array '{name}' has shape {tuple(zarray.shape)} in chunks of "
            f"{tuple(chunk_shape)}, {n} chunks, but its manifest records "
            f"{recorded[0]} chunks; the metadata was altered after the store was written")


def expected_crcs(zarray) -> list[int] | None:
    """The CRC-32 of each chunk file of ``zarray`` in grid order, as its manifest records
    them (None without one)."""
    crcs = (zarray.attrs.get(MANIFEST) or {}).get("crc32")
    return list(crcs) if isinstance(crcs, list) else None


def checksum_error(what: str, key: str) -> ChecksumError:
    """The one-line error of a chunk whose bytes differ from its recorded CRC-32."""
    return ChecksumError(f"{what}: chunk {key} does not match the CRC-32 recorded when it "
                         "was written; the chunk was altered or corrupted: restore it or "
                         "re-create the store (verify=False or --no-verify reads it anyway)")


def _gf2_times(mat: tuple[int, ...], vec: int) -> int:
    """The 32x32 GF(2) matrix ``mat`` (its columns as ints) times the bit vector ``vec``."""
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


@functools.lru_cache(maxsize=256)
def _zeros_operator(length: int) -> tuple[int, ...]:
    """The GF(2) matrix that advances a CRC-32 register over ``length`` zero bytes (zlib's
    ``crc32_combine`` squarings, composed into one matrix). Cached: the pieces of a read
    come in a few lengths, so each read combines in O(32) operations per piece."""
    def square(mat):
        return tuple(_gf2_times(mat, m) for m in mat)

    def compose(a, b):  # a after b
        return tuple(_gf2_times(a, m) for m in b)

    result = tuple(1 << n for n in range(32))  # identity
    op = (0xEDB88320,) + tuple(1 << n for n in range(31))  # one zero bit
    for _ in range(3):
        op = square(op)  # one zero byte
    while length:  # the operators of the set bits of length, composed
        if length & 1:
            result = compose(op, result)
        op = square(op)
        length >>= 1
    return result


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``A + B`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and ``len(B)``
    (zlib's ``crc32_combine``: the CRC register advanced over ``len2`` zero bytes in
    GF(2)), for pieces of one chunk checksummed by different threads."""
    if len2 <= 0:
        return crc1
    return _gf2_times(_zeros_operator(len2), crc1) ^ crc2


def _chunk_index(rel: str, encoding: dict) -> tuple[int, ...] | None:
    """The grid index of chunk key ``rel`` (relative to its array), None if it is none."""
    name = encoding.get("name", "default")
    sep = (encoding.get("configuration") or {}).get("separator",
                                                     "/" if name == "default" else ".")
    if name == "default":
        if rel == "c":
            return ()
        if not rel.startswith("c" + sep):
            return None
        rel = rel[2:]
    try:
        return tuple(int(p) for p in rel.split(sep))
    except ValueError:
        return None


class VerifiedStore(LocalStore):
    """A local Zarr store that checks every chunk it reads whole against the CRC-32
    in its array's manifest (:class:`~cosmo_dask.core.errors.ChecksumError` on a mismatch,
    or when a chunk the manifest records is missing). Arrays without a manifest,
    metadata and byte-range reads pass unchecked. Read-only."""

    def __init__(self, root, *, read_only: bool = True):
        super().__init__(root, read_only=read_only)
        self._arrays: dict[str, dict | bool] = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_arrays"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def _array(self, prefix: str) -> dict | bool:
        """What checking the chunks of the array at ``prefix`` needs (cached): a dict;
        False when no array is there, True for an array without recorded CRC-32s."""
        if prefix not in self._arrays:
            info: dict | bool = False
            try:
                meta = json.loads((self.root / prefix / "zarr.json").read_text())
            except (OSError, ValueError):
                meta = None
            if isinstance(meta, dict) and meta.get("node_type") == "array":
                info = True
                manifest = (meta.get("attributes") or {}).get(MANIFEST)
                crcs = manifest.get("crc32") if isinstance(manifest, dict) else None
                try:
                    chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
                    grid = tuple(-(-int(s) // int(c)) for s, c in
                                 zip(meta["shape"], chunks, strict=True))
                except (KeyError, TypeError, ValueError, ZeroDivisionError):
                    grid = None
                # a count that disagrees with the shape: check_grid refuses it on opening
                if isinstance(crcs, list) and grid is not None and \
                        len(crcs) == math.prod(grid):
                    info = {"crcs": crcs, "grid": grid,
                            "encoding": meta.get("chunk_key_encoding") or {}}
            self._arrays[prefix] = info
        return self._arrays[prefix]

    def _expected(self, key: str):
        """``(what, chunk key, CRC-32)`` of a chunk of a manifested array, else None."""
        parts = key.split("/")
        for j in range(len(parts) - 1, -1, -1):
            prefix = "/".join(parts[:j])
            info = self._array(prefix)
            if info is False:
                continue
            if info is True:
                return None
            rel = "/".join(parts[j:])
            index = _chunk_index(rel, info["encoding"])
            if index is None or len(index) != len(info["grid"]) or any(
                    not 0 <= i < g for i, g in zip(index, info["grid"], strict=True)):
                return None
            flat = int(np.ravel_multi_index(index, info["grid"])) if index else 0
            return f"{self.root}: array '{prefix}'", rel, info["crcs"][flat]
        return None

    async def get(self, key, prototype=None, byte_range=None):
        buf = await super().get(key, prototype, byte_range)
        if byte_range is not None or key.rsplit("/", 1)[-1] == "zarr.json":
            return buf
        found = self._expected(key)
        if found is None:
            return buf
        what, rel, want = found
        if want is None:  # recorded as not written (a chunk of only the fill value)
            return buf
        if buf is None:
            raise ChecksumError(f"{what}: chunk {rel} is missing (the store was written "
                                "complete); restore it or re-create the store")
        if crc32(buf.as_numpy_array()) != want:
            raise checksum_error(what, rel)
        return buf


def verified_store(path) -> VerifiedStore:
    """A read-only :class:`VerifiedStore` over the local store directory ``path``: every
    whole chunk read through it is checked against its array's manifest."""
    return VerifiedStore(str(path), read_only=True)


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
    check_grid(zarray, name, source)  # before listing: an edited shape lists nothing
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
