"""cosmo_dask: N-body cosmology and galactic-dynamics analysis as Dask task graphs.

Quick start::

    import cosmo_dask
    from cosmo_dask.models import zeldovich

    with cosmo_dask.connect() as client:          # LocalCluster / LocalCUDACluster
        snap = zeldovich(64, box_size=100.0, redshift=0.0, seed=1)
        snap.to_zarr("ics.zarr")
        snap = cosmo_dask.open_snapshot("ics.zarr")   # lazy dask arrays
        print(snap.pos.mean(axis=0).compute())

``import cosmo_dask`` is light: the subpackages (``cosmo_dask.io``, ``.models``,
``.gravity``, ``.expansion``, ``.density``, ``.analysis``, ``.halos``,
``.spatial``) and the top-level names below are imported on first use
(module ``__getattr__``, PEP 562), so ``cosmo_dask.halos.fof`` works after a
bare ``import cosmo_dask``.
"""

from __future__ import annotations

import importlib

from .core import config as _config  # noqa: E402,F401  (registers dask config defaults)
from .core.errors import CosmoDaskError, DeviceError, ParameterError, SnapshotError  # noqa: E402
from .core.version import __version__  # noqa: E402,F401

#: subpackages reachable as attributes, imported on first access
SUBPACKAGES = ("analysis", "density", "expansion", "gravity", "halos", "io", "models", "spatial")
#: top-level names, imported on first access: name -> defining module
_LAZY_NAMES = {"connect": "core.cluster", "open_snapshot": "store.snapshot",
               "Snapshot": "store.snapshot"}

__all__ = [
    "__version__",
    "connect",
    "open_snapshot",
    "Snapshot",
    "CosmoDaskError",
    "SnapshotError",
    "ParameterError",
    "DeviceError",
]


def __getattr__(name: str):
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    elif name in SUBPACKAGES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_NAMES) | set(SUBPACKAGES))
