"""Shared test helpers."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np

MPC_CM = 3.085678e24


MSUN10_G = 1.989e43


BOX = 100.0


# ------------------------------------------------------------------------------ writers
def write_gadget_file(path: Path, parts: dict[int, dict[str, np.ndarray]], *, n_total=None,
                      n_files: int = 1, mass_table=None, header: dict | None = None,
                      parameters: dict | None = None) -> None:
    """Write one Gadget-layout HDF5 file; ``parts`` maps type -> {dataset name: array}."""
    n_this = np.zeros(6, dtype=np.uint32)
    for t, fields in parts.items():
        n_this[t] = len(fields["Coordinates"])
    attrs = {
        "NumPart_ThisFile": n_this,
        "NumPart_Total": np.asarray(n_this if n_total is None else n_total, dtype=np.uint32),
        "NumPart_Total_HighWord": np.zeros(6, dtype=np.uint32),
        "MassTable": np.asarray(np.zeros(6) if mass_table is None else mass_table, np.float64),
        "NumFilesPerSnapshot": np.int32(n_files),
        "Time": 0.5,
        "Redshift": 1.0,
        "BoxSize": BOX,
        "Omega0": 0.3,
        "OmegaLambda": 0.7,
        "OmegaBaryon": 0.05,
        "HubbleParam": 0.7,
        "UnitLength_in_cm": MPC_CM,
        "UnitMass_in_g": MSUN10_G,
        "UnitVelocity_in_cm_per_s": 1e5,
    }
    attrs.update(header or {})
    with h5py.File(path, "w") as f:
        h = f.create_group("Header")
        for key, value in attrs.items():
            if value is not None:
                h.attrs[key] = value
        if parameters is not None:
            p = f.create_group("Parameters")
            for key, value in parameters.items():
                p.attrs[key] = value
        for t, fields in parts.items():
            g = f.create_group(f"PartType{t}")
            for name, data in fields.items():
                g.create_dataset(name, data=data)


def make_parts(rng, n, *, masses=False, pos_dtype=np.float32, id_start=0):
    fields = {
        "Coordinates": rng.uniform(0, BOX, size=(n, 3)).astype(pos_dtype),
        "Velocities": rng.normal(0, 300, size=(n, 3)).astype(np.float32),
        "ParticleIDs": np.arange(id_start, id_start + n, dtype=np.uint64),
    }
    if masses:
        fields["Masses"] = rng.uniform(0.5, 2.0, size=n)
    return fields


def wrapped(pos):
    out = np.where(pos >= BOX, pos - np.float32(BOX), pos)
    return np.where(out < 0, out + np.float32(BOX), out).astype(pos.dtype)


def scaled(vel, a):
    return (vel.astype(np.float64) * math.sqrt(a)).astype(vel.dtype)
