"""Shared test helpers."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from tests.support.gadget import BOX

FORMATS = [1, 2]


HEADER_DEFAULTS = {
    "time": 0.5, "redshift": 1.0, "BoxSize": BOX, "Omega0": 0.3, "OmegaLambda": 0.7,
    "HubbleParam": 0.7, "npartTotalHighWord": [0] * 6,
}


# the HDF5 twin states the same header and nothing a binary header cannot hold
TWIN_HEADER = {"Time": 0.5, "Redshift": 1.0, "OmegaBaryon": None, "UnitLength_in_cm": None,
               "UnitMass_in_g": None, "UnitVelocity_in_cm_per_s": None}


# ------------------------------------------------------------------------------ writer
def _record(payload: bytes, endian: str) -> bytes:
    marker = struct.pack(f"{endian}i", len(payload))
    return marker + payload + marker


def header_bytes(npart, mass, *, n_total, n_files, endian, hdr) -> bytes:
    """The 256-byte Gadget-2 ``io_header`` (npart[6] int32, mass[6] f64, time, redshift,
    flag_sfr, flag_feedback, npartTotal[6] uint32, flag_cooling, num_files, BoxSize, Omega0,
    OmegaLambda, HubbleParam, flag_stellarage, flag_metals, npartTotalHighWord[6] uint32,
    flag_entropy_instead_u, padding)."""
    data = struct.pack(
        f"{endian}6i6d2d2i6I2i4d2i6Ii", *npart, *mass, hdr["time"], hdr["redshift"], 1, 1,
        *n_total, 1, n_files, hdr["BoxSize"], hdr["Omega0"], hdr["OmegaLambda"],
        hdr["HubbleParam"], 0, 0, *hdr["npartTotalHighWord"], 0,
    )
    assert len(data) == 196
    return data + bytes(256 - len(data))


def write_binary(path: Path, parts: dict[int, dict[str, np.ndarray]], *, snap_format=1,
                 endian="<", mass_table=None, n_total=None, n_files=1, npart=None,
                 header=None) -> dict[str, tuple[int, int, int]]:
    """Write one Gadget binary file; ``parts`` maps type -> {HDF5 dataset name: array}.

    Blocks: HEAD, POS, VEL, ID, MASS (types with particles and no MassTable entry), and
    for gas U and RHO. ``npart`` overrides the header's counts (to write bad files).
    Returns label -> (offset of the record's leading marker, of its data, data bytes).
    """
    mass_table = [0.0] * 6 if mass_table is None else list(mass_table)
    counts = [len(parts[t]["Coordinates"]) if t in parts else 0 for t in range(6)]
    hdr = dict(HEADER_DEFAULTS, **(header or {}))
    head = header_bytes(counts if npart is None else npart, mass_table,
                        n_total=counts if n_total is None else n_total, n_files=n_files,
                        endian=endian, hdr=hdr)
    types = [t for t in range(6) if counts[t]]

    def block(name, which):
        arrays = [parts[t][name] for t in which]
        return b"".join(a.astype(a.dtype.newbyteorder(endian)).tobytes() for a in arrays)

    blocks = [("HEAD", head), ("POS", block("Coordinates", types)),
              ("VEL", block("Velocities", types)), ("ID", block("ParticleIDs", types))]
    with_mass = [t for t in types if mass_table[t] == 0]
    if with_mass:
        blocks.append(("MASS", block("Masses", with_mass)))
    if counts[0]:
        gas = np.arange(counts[0], dtype=f"{endian}f4")
        blocks += [("U", (gas + 100).tobytes()), ("RHO", (gas * 0.5).tobytes())]
    out, where = b"", {}
    for label, data in blocks:
        if snap_format == 2:
            out += _record(label.ljust(4).encode() + struct.pack(f"{endian}i", len(data) + 8),
                           endian)
        where[label] = (len(out), len(out) + 4, len(data))
        out += _record(data, endian)
    path.write_bytes(out)
    return where


def make_parts(rng, n, *, float_dtype=np.float32, id_dtype=np.uint64, id_start=0, masses=False):
    fields = {
        "Coordinates": rng.uniform(0, BOX, size=(n, 3)).astype(float_dtype),
        "Velocities": rng.normal(0, 300, size=(n, 3)).astype(float_dtype),
        "ParticleIDs": np.arange(id_start, id_start + n, dtype=id_dtype),
    }
    if masses:
        fields["Masses"] = rng.uniform(0.5, 2.0, size=n).astype(float_dtype)
    return fields
