"""cosmo_dask: N-body cosmology and galactic-dynamics analysis as Dask task graphs.

Quick start::

    import cosmo_dask
    from cosmo_dask.models import zeldovich

    with cosmo_dask.connect() as client:          # LocalCluster / LocalCUDACluster
        snap = zeldovich(64, box_size=100.0, redshift=0.0, seed=1)
        snap.to_zarr("ics.zarr")
        snap = cosmo_dask.open_snapshot("ics.zarr")   # lazy dask arrays
        print(snap.pos.mean(axis=0).compute())
"""

__version__ = "0.1.0"

from . import config as _config  # noqa: E402,F401  (registers dask config defaults)
from .cluster import connect  # noqa: E402
from .errors import CosmoDaskError, DeviceError, ParameterError, SnapshotError  # noqa: E402
from .snapshot import Snapshot, open_snapshot  # noqa: E402

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
