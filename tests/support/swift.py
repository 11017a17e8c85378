"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

#: SWIFT's default snapshot units (Mpc, 1e10 Msun, Mpc / (km/s)), in cgs
UNITS_CGS = {"U_L": 3.08567758e24, "U_M": 1.98841e43, "U_t": 3.08567758e19}


BOX = 50.0


A = 0.5


H = 0.6777


COSMOLOGY = {"Omega_m": 0.307, "Omega_b": 0.0482, "Omega_lambda": 0.693, "h": H}


#: dataset -> (U_L, U_M, U_t exponents, a-scale exponent) as SWIFT writes them
EXPONENTS = {"Coordinates": (1, 0, 0, 1.0), "Velocities": (1, 0, -1, 0.0),
             "Masses": (0, 1, 0, 0.0), "ParticleIDs": (0, 0, 0, 0.0)}


MASKED = object()  # leave an attribute or group out


# ------------------------------------------------------------------------------ writers
def one(value):
    """SWIFT writes scalar attributes as arrays of length 1."""
    return np.atleast_1d(np.asarray(value))


def write_swift_file(path: Path, parts: dict[int, dict[str, np.ndarray]], *, n_total=None,
                     n_files: int = 1, this_file: int = 0, box=(BOX, BOX, BOX), a: float = A,
                     cosmological: bool = True, units=UNITS_CGS, periodic=None,
                     exponents: dict | None = None,
                     virtual: list[tuple[str, dict]] | None = None) -> None:
    """One SWIFT-layout file; ``parts`` maps type -> {dataset: array}. ``virtual``:
    [(sub-file name, its parts)], making every dataset a virtual dataset over the
    sub-files (SWIFT's meta-snapshot of a distributed snapshot)."""
    n_this = np.zeros(7, dtype=np.int64)
    for t, fields in parts.items():
        n_this[t] = len(fields["Coordinates"])
    total = np.asarray(n_this if n_total is None else n_total)
    attrs = {
        "BoxSize": np.asarray(box, dtype=np.float64), "Time": one(0.8), "Dimension": one(3),
        "Redshift": one(1 / a - 1), "Scale-factor": one(a), "Code": np.bytes_("SWIFT"),
        "NumPart_ThisFile": n_this, "NumPart_Total": total.astype(np.uint32),
        "NumPart_Total_HighWord": (total >> 32).astype(np.uint32),
        "MassTable": np.zeros(7), "NumFilesPerSnapshot": one(n_files),
        "ThisFile": one(this_file), "Virtual": one(int(virtual is not None)),
    }
    exponents = {**EXPONENTS, **(exponents or {})}
    with h5py.File(path, "w") as f:
        h = f.create_group("Header")
        h.attrs.update(attrs)
        if units is not MASKED:
            g = f.create_group("Units")
            g.attrs.update({
                "Unit length in cgs (U_L)": one(units["U_L"]),
                "Unit mass in cgs (U_M)": one(units["U_M"]),
                "Unit time in cgs (U_t)": one(units["U_t"]),
                "Unit current in cgs (U_I)": one(1.0), "Unit temperature in cgs (U_T)": one(1.0),
            })
            f.copy(g, "InternalCodeUnits")
        c = f.create_group("Cosmology")
        c.attrs["Cosmological run"] = one(np.int32(cosmological))
        c.attrs.update({k: one(v if cosmological else 0.0) for k, v in COSMOLOGY.items()})
        c.attrs.update({"w_0": one(-1.0), "Redshift": one(1 / a - 1), "Scale-factor": one(a)})
        p = f.create_group("Parameters")
        if periodic is not None:
            p.attrs["InitialConditions:periodic"] = np.bytes_(str(periodic))
        for t, fields in parts.items():
            g = f.create_group(f"PartType{t}")
            for name, data in fields.items():
                ds = _dataset(g, t, name, data, virtual)
                u_l, u_m, u_t, a_exp = exponents[name]
                if a_exp is MASKED:
                    a_exp = None
                base = UNITS_CGS if units is MASKED else units
                cgs = base["U_L"] ** u_l * base["U_M"] ** u_m * base["U_t"] ** u_t
                ds.attrs.update({
                    "U_L exponent": one(np.float32(u_l)), "U_M exponent": one(np.float32(u_m)),
                    "U_t exponent": one(np.float32(u_t)), "U_I exponent": one(np.float32(0)),
                    "U_T exponent": one(np.float32(0)), "h-scale exponent": one(np.float32(0)),
                    "Conversion factor to CGS (not including cosmological corrections)":
                        one(cgs),
                    "Expression for physical CGS units": np.bytes_("[ see exponents ]"),
                    "Description": np.bytes_(f"{name} of the particles"),
                })
                if a_exp is not None:
                    ds.attrs["a-scale exponent"] = one(np.float32(a_exp))
                    ds.attrs["Conversion factor to physical CGS (including cosmological "
                             "corrections)"] = one(cgs * a**a_exp)


def _dataset(group: h5py.Group, t: int, name: str, data: np.ndarray,
             virtual: list[tuple[str, dict]] | None) -> h5py.Dataset:
    if virtual is None:
        return group.create_dataset(name, data=data)
    layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
    start = 0
    for file_name, parts in virtual:
        n = len(parts.get(t, {}).get(name, ()))
        if n:  # the source named relative to the virtual file, as SWIFT does
            layout[start:start + n] = h5py.VirtualSource(file_name, f"PartType{t}/{name}",
                                                         shape=(n,) + data.shape[1:])
        start += n
    return group.create_virtual_dataset(name, layout)


def make_parts(rng, n, *, id_start=0, float_dtype=np.float32):
    """SWIFT dtypes: double coordinates, float velocities and masses, uint64 ids."""
    return {
        "Coordinates": rng.uniform(0, BOX, size=(n, 3)),
        "Velocities": rng.normal(0, 300, size=(n, 3)).astype(float_dtype),
        "Masses": rng.uniform(0.5, 2.0, size=n).astype(float_dtype),
        "ParticleIDs": np.arange(id_start, id_start + n, dtype=np.uint64),
    }
