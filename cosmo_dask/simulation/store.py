"""The simulation store: parameters, step log, outputs, analyses and the checkpoint.

Layout (a plain directory, so that every member is its own store, written
atomically by the project's writers)::

    sim/
      simulation.json          {"format": "cosmo_dask.simulation", "format_version": 1,
                                "parameters": {...}, "outputs": [...], "log": [...]}
                               rewritten atomically (temporary file + rename) after
                               every step
      outputs/<NNN>_z<z>/      one directory per output redshift (NNN: output index)
        snapshot/              a cosmo_dask snapshot store (Snapshot.to_zarr; open it
                               with cosmo_dask.open_snapshot), unless write_particles=False
        power/                 P(k) table: a Zarr group of format
                               "cosmo_dask.simulation_table" holding the
                               power_spectrum Dataset as its group "table"
        halos/                 FOF catalog Dataset (halo x axis), the same way
        members/               with halos: each halo's member ids, most bound first,
                               with their binding energies and the halo offsets
                               (cosmo_dask.halos.members; read with members(z))
      checkpoint/              Zarr v3 group, format "cosmo_dask.simulation_checkpoint":
                               pos, mom (p = a^2 dx/dt), acc (the force at a), ids;
                               attrs step, scale_factor, parameters, chunks, log
      lightcone/step_<NNNNN>/  with run(lightcone=...): the light-cone crossings of one step,
                               a Zarr v3 group of format "cosmo_dask.lightcone_piece"
                               (pos, vel, ids, redshift), listed in the manifest's
                               "lightcone" entry (see cosmo_dask.simulation.lightcone)

``outputs`` entries: ``{"name", "index", "redshift", "scale_factor", "step",
"snapshot", "power", "halos", "members"}`` (the last four: whether written;
``members`` absent in stores written before member ids were kept); ``name`` is
one directory name under ``outputs/`` (checked on reading: no ``/``, ``..`` or
absolute path). ``log``
rows: ``{"step", "a_start", "a", "z", "seconds", "force_seconds"}``.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path

import xarray as xr
import zarr

from ..core.errors import ParameterError, SnapshotError
from ..store.atomic import (
    atomic_directory,
    check_writable_target,
    clean,
    clean_tree,
    local_path,
    recover,
    store_format,
)
from ..store.chunk_manifest import verify_default
from ..store.zarr_read import open_product_group, product_store, read_array
from ..store.zarr_write import plain_attrs, store_arrays, store_dataset

FORMAT = "cosmo_dask.simulation"
CHECKPOINT_FORMAT = "cosmo_dask.simulation_checkpoint"
TABLE_FORMAT = "cosmo_dask.simulation_table"
FORMAT_VERSION = 1
MANIFEST = "simulation.json"
CHECKPOINT = "checkpoint"

#: parameters that must agree between a checkpoint and the run resuming it
RESUME_KEYS = ("method", "factors", "n_mesh", "softening", "theta", "precision", "schedule",
               "outputs", "z_final", "a_initial", "n_particles", "box_size", "cosmology", "G",
               "h0", "chunks", "lightcone")


def output_name(index: int, z: float) -> str:
    return f"{index:03d}_z{z:.4f}"


# ----------------------------------------------------------------------------- target checks
def is_simulation_store(path: Path) -> bool:
    try:
        doc = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def check_target(out, *, overwrite: bool, resume: bool, inputs=()) -> Path:
    """The local path of ``out`` after checking it can be (re)used; nothing is written but
    the settling of what killed writes left (:func:`cosmo_dask.store.atomic.clean`: a replace of
    ``out`` interrupted between its renames is finished or undone; with ``resume``, also
    those of its checkpoint and outputs, and dead writers' temporary stores removed).

    New run: ``out`` must not exist (ParameterError), unless ``overwrite`` and it is
    a simulation store or an empty directory; never inside a Zarr store or an input.
    Resume: ``out`` must be a simulation store holding a checkpoint.
    """
    p = local_path(out)
    if resume:
        clean_tree(p)
        for part in p.glob(f".{MANIFEST}.*.part") if p.is_dir() else ():
            part.unlink(missing_ok=True)  # a manifest write the killed run left
        if not is_simulation_store(p):
            raise ParameterError(f"resume=True: {p} is not a simulation store (no "
                                 f"{MANIFEST}); start the run without resume")
        if not (p / CHECKPOINT / "zarr.json").is_file():
            raise ParameterError(f"resume=True: {p} holds no checkpoint; run it again with "
                                 "checkpoint_every= (and without resume)")
        return p
    clean(p)
    if p.exists():
        if not overwrite:
            raise ParameterError(f"out: {p} already exists; pass overwrite=True to replace "
                                 "it or resume=True to continue its run")
        empty = p.is_dir() and not any(p.iterdir())
        if not (empty or is_simulation_store(p)):
            raise ParameterError(f"out: {p} is neither a simulation store nor an empty "
                                 "directory; overwrite=True replaces only those")
        for source in inputs:  # replacing the store must not delete the run's own input
            src = local_path(source).resolve()
            if src == p.resolve() or p.resolve() in src.parents:
                raise ParameterError(f"out: {p} holds the ICs ({src}); overwrite=True would "
                                     "delete them: write the run elsewhere")
    try:  # inside a Zarr store or an input, unwritable parent
        return check_writable_target(p, overwrite=overwrite, what="simulation store",
                                     inputs=inputs, replaceable=is_simulation_store)
    except SnapshotError as exc:
        raise ParameterError(f"out: {exc}") from None


# ----------------------------------------------------------------------------- manifest
def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` as JSON atomically (temporary file in the same directory + rename),
    with the permissions of any new file (0666 less the umask)."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.part"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(plain_attrs(doc), f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(path: Path) -> dict:
    try:
        doc = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{path}: not a readable simulation store ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError(f"{path}: not a cosmo_dask simulation store (format "
                            f"{doc.get('format') if isinstance(doc, dict) else None!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{path}: simulation store format_version "
                            f"{doc.get('format_version')!r} is not supported")
    outputs = doc.get("outputs")
    if not isinstance(outputs, list) or not all(isinstance(e, dict) for e in outputs):
        raise SnapshotError(f"{path / MANIFEST}: 'outputs' must be a list of objects")
    for e in outputs:
        check_member_name(e.get("name"), path / MANIFEST)
    return doc


def check_member_name(name, where: Path) -> str:
    """``name`` if it names one directory inside the store (one path component: not
    empty, ``.`` or ``..``, no separator, not absolute); else SnapshotError naming
    ``where`` (names read from a store's metadata must not lead outside it)."""
    bad = (not isinstance(name, str) or name in ("", ".", "..") or "/" in name
           or "\\" in name or "\0" in name or os.path.isabs(name)
           or (os.altsep is not None and os.altsep in name))
    if bad:
        raise SnapshotError(f"{where}: output name {name!r} is not a directory name inside "
                            "the store (one path component, no '..', not absolute)")
    return name


def create_store(path: Path, parameters: dict) -> dict:
    """Fill the new, empty directory ``path`` (a run's temporary store, see
    :class:`cosmo_dask.store.atomic.Replacement`) as a simulation store; returns its manifest."""
    (path / "outputs").mkdir()
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "parameters": parameters,
           "outputs": [], "log": []}
    write_json(path / MANIFEST, doc)
    return doc


def record_output(doc: dict, entry: dict) -> None:
    doc["outputs"] = [e for e in doc["outputs"] if e["name"] != entry["name"]] + [entry]
    doc["outputs"].sort(key=lambda e: e["index"])


# ----------------------------------------------------------------------------- tables
def is_table_store(path: Path) -> bool:
    """An analysis table store: format :data:`TABLE_FORMAT`, or (written before the
    format attribute) a directory holding only the Zarr group ``table``."""
    found = store_format(path)
    if found is not None:
        return found == TABLE_FORMAT
    try:
        names = [p.name for p in path.iterdir()]
    except OSError:
        return False
    return names == ["table"] and (path / "table" / "zarr.json").is_file()


def write_table(ds: xr.Dataset, path: Path, what: str) -> None:
    """An analysis table (an in-memory Dataset) as a Zarr store at ``path``, atomically
    (replacing the table there: a resume rewrites the outputs after its checkpoint)."""
    ds = ds.drop_vars([n for n in ("axis", "ell") if n in ds.coords and ds[n].dtype.kind == "U"])
    ds.attrs = {k: plain_attrs(v) for k, v in ds.attrs.items()}
    with atomic_directory(path, overwrite=True, what=what, fmt=TABLE_FORMAT,
                          replaceable=is_table_store) as tmp:
        zarr.open_group(str(tmp), mode="w", zarr_format=3,
                        attributes={"format": TABLE_FORMAT, "format_version": FORMAT_VERSION,
                                    "table": path.name})
        store_dataset(ds, tmp / "table", label=f"writing {path}")


def read_table(path: Path, verify: bool | None = None) -> xr.Dataset:
    """The analysis table at ``path``, each chunk checked against its recorded CRC-32
    when ``verify`` (default: dask config ``cosmo_dask.verify``, True)."""
    if not path.exists():
        recover(path)  # a replace of the table interrupted between its two renames
    ds = xr.open_zarr(product_store(path / "table", verify), consolidated=False).load()
    if "axis" in ds.dims and "axis" not in ds.coords:
        ds = ds.assign_coords(axis=["x", "y", "z"][:ds.sizes["axis"]])
    return ds


# ----------------------------------------------------------------------------- checkpoint
def write_checkpoint(path: Path, state: dict, attrs: dict) -> None:
    """``state`` (pos, mom, acc, ids dask arrays) and ``attrs`` as ``path/checkpoint``."""
    target = path / CHECKPOINT
    with atomic_directory(target, overwrite=True, what="simulation checkpoint",
                          fmt=CHECKPOINT_FORMAT) as tmp:
        meta = {"format": CHECKPOINT_FORMAT, "format_version": FORMAT_VERSION, **attrs}
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3,
                                attributes=plain_attrs(meta))
        store_arrays(group, {k: v for k, v in state.items() if v is not None}, root=tmp,
                     label=f"writing {target}", show=False)


def read_checkpoint(path: Path, verify: bool | None = None) -> tuple[dict, dict]:
    """``(arrays, attrs)`` of ``path/checkpoint``: lazy dask arrays in the stored row
    chunks of the run (``attrs["chunks"]``).

    Before anything is read: the format, every array's length against the run's
    ``n_particles`` and its chunk count against its manifest, every chunk file present
    with its written size (a missing chunk would otherwise read as zeros and resume a
    wrong state). With ``verify`` (default: dask config ``cosmo_dask.verify``, True)
    every chunk's CRC-32 is compared with the manifest's as it is read
    (:class:`~cosmo_dask.core.errors.ChecksumError` naming the chunk).
    """
    target = path / CHECKPOINT
    verify = verify_default(verify)
    group, attrs = open_product_group(target, fmt=CHECKPOINT_FORMAT, verify=verify,
                                      what="simulation checkpoint")
    parameters = attrs.get("parameters") or {}
    rows = tuple(int(c) for c in parameters["chunks"])
    n = parameters.get("n_particles")
    arrays = {}
    for name, arr in group.arrays():
        if n is not None and arr.shape[0] != int(n):
            raise SnapshotError(f"{target}: array '{name}' has {arr.shape[0]} rows but the "
                                f"run has n_particles = {int(n)}; the checkpoint's metadata "
                                "was altered: run again without resume")
        x = read_array(arr, name, str(target), verify=verify)
        arrays[name] = x.rechunk((rows,) + tuple(-1 for _ in x.shape[1:]))
    return arrays, attrs


def compare_parameters(stored: dict, current: dict) -> None:
    """ParameterError naming every resume-relevant parameter that differs."""
    diff = []
    for key in RESUME_KEYS:
        a, b = stored.get(key), current.get(key)
        if not _same(a, b):
            diff.append(f"{key}: checkpoint {_short(a)}, now {_short(b)}")
    if diff:
        raise ParameterError("resume=True: the run's parameters differ from the checkpoint's "
                             "(" + "; ".join(diff) + "); resume with the same parameters or "
                             "start a new run")


def _same(a, b) -> bool:
    a, b = plain_attrs(a), plain_attrs(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return a == b


def _short(value) -> str:
    text = json.dumps(plain_attrs(value))
    return text if len(text) < 60 else text[:57] + "..."


# ----------------------------------------------------------------------------- reading
class SimulationStore:
    """A simulation store opened by :func:`open_simulation` (metadata only; particles lazily).

    Attributes: ``path``, ``parameters`` (dict), ``log`` (list of per-step dicts),
    ``outputs`` (list of output entries, in order of decreasing redshift),
    ``redshifts`` (list of floats). :meth:`snapshot`, :meth:`power`,
    :meth:`halos`, :meth:`members` read one output; iterating (or :meth:`series`) gives
    ``(z, Snapshot)`` pairs for the outputs with particles.
    """

    def __init__(self, path: Path, doc: dict):
        self.path = path
        self.parameters = dict(doc["parameters"])
        self.log = list(doc["log"])
        self.outputs = sorted(doc["outputs"], key=lambda e: e["index"])

    @property
    def redshifts(self) -> list[float]:
        return [float(e["redshift"]) for e in self.outputs]

    def _entry(self, z: float) -> dict:
        for e in self.outputs:
            if math.isclose(float(e["redshift"]), float(z), rel_tol=1e-6, abs_tol=1e-6):
                return e
        have = ", ".join(f"{r:g}" for r in self.redshifts) or "none"
        raise ParameterError(f"{self.path}: no output at z = {z!r}; outputs at z = {have}")

    def snapshot(self, z: float, **kwargs):
        """The output snapshot at redshift ``z`` (``cosmo_dask.open_snapshot`` kwargs)."""
        from ..store.snapshot import open_snapshot

        e = self._entry(z)
        if not e.get("snapshot"):
            raise ParameterError(f"{self.path}: the output at z = {z:g} has no particles "
                                 "(written with write_particles=False)")
        return open_snapshot(self.path / "outputs" / e["name"] / "snapshot", **kwargs)

    def power(self, z: float, verify: bool | None = None) -> xr.Dataset:
        """The P(k) table at redshift ``z`` (``verify``: see :func:`read_table`)."""
        e = self._entry(z)
        if not e.get("power"):
            raise ParameterError(f"{self.path}: no power spectrum at z = {z:g}")
        return read_table(self.path / "outputs" / e["name"] / "power", verify)

    def halos(self, z: float, verify: bool | None = None) -> xr.Dataset:
        """The FOF catalog at redshift ``z`` (``verify``: see :func:`read_table`)."""
        e = self._entry(z)
        if not e.get("halos"):
            raise ParameterError(f"{self.path}: no halo catalog at z = {z:g}")
        return read_table(self.path / "outputs" / e["name"] / "halos", verify)

    def lightcone(self, verify: bool | None = None):
        """The recorded light cone (:class:`~cosmo_dask.simulation.lightcone.Lightcone`, lazy
        arrays; each chunk checked against its CRC-32 as read when ``verify``, default
        dask config ``cosmo_dask.verify``); ParameterError if the run recorded none."""
        from .lightcone import open_lightcone

        doc = read_manifest(self.path)
        entry = doc.get("lightcone")
        for piece in (entry or {}).get("pieces") or []:
            if piece.get("n"):
                check_member_name(piece.get("name"), self.path / MANIFEST)
        return open_lightcone(self.path, entry, doc["parameters"].get("precision", "float64"),
                              verify)
    def members(self, z: float, *, device: str = "cpu", verify: bool | None = None):
        """The halo members at redshift ``z``: an xarray Dataset with lazy ``ids`` and
        ``binding_energy`` (dim ``member``, halo by halo, most bound first) and
        ``offsets`` (halo h is rows ``offsets[h]:offsets[h+1]``), see
        :func:`cosmo_dask.halos.members.open_members` (``device``, ``verify``)."""
        from ..halos.members import open_members

        e = self._entry(z)
        if not e.get("members"):
            raise ParameterError(f"{self.path}: no halo members at z = {z:g} (outputs keep "
                                 "them when the run computes analyses=['halos'])")
        return open_members(self.path / "outputs" / e["name"] / "members", device=device,
                            verify=verify)

    def series(self) -> list:
        """``[(z, Snapshot), ...]`` of the outputs with particles, decreasing z."""
        return [(float(e["redshift"]), self.snapshot(e["redshift"])) for e in self.outputs
                if e.get("snapshot")]

    def __iter__(self):
        return iter(self.series())

    def __len__(self) -> int:
        return len(self.outputs)

    def __repr__(self) -> str:
        zs = ", ".join(f"{z:g}" for z in self.redshifts)
        return (f"<SimulationStore {self.path}: {self.parameters.get('method')}, "
                f"{len(self.log)} steps, outputs at z = [{zs}]>")


def open_simulation(path) -> SimulationStore:
    """Open a simulation store written by :func:`cosmo_dask.simulation.run` with ``out=``."""
    p = local_path(path)
    if not p.exists():
        recover(p)  # a replace of the store interrupted between its renames
    if not p.is_dir():
        raise SnapshotError(f"{p}: no such simulation store")
    return SimulationStore(p, read_manifest(p))


__all__ = ["open_simulation", "SimulationStore", "FORMAT", "CHECKPOINT_FORMAT"]


def as_entry(index: int, z: float, a: float, step: int, *, snapshot: bool, power: bool,
             halos: bool, members: bool = False) -> dict:
    return {"name": output_name(index, z), "index": index, "redshift": float(z),
            "scale_factor": float(a), "step": int(step), "snapshot": bool(snapshot),
            "power": bool(power), "halos": bool(halos), "members": bool(members)}
