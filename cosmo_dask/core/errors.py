"""Error types raised by cosmo_dask.

Every error a user can provoke with bad input is one of these, with a message
that names the file, array or parameter at fault and what would be valid. The
CLI turns them into a one-line message and a non-zero exit.
"""

from __future__ import annotations


class CosmoDaskError(Exception):
    """Base class of all cosmo_dask errors caused by input or environment."""


class SnapshotError(CosmoDaskError):
    """A snapshot store or in-memory snapshot is missing, malformed or invalid."""


class ParameterError(CosmoDaskError, ValueError):
    """A function or CLI parameter is out of its valid range."""


class ClusterError(CosmoDaskError):
    """A Dask cluster could not be reached or created as asked."""


class DeviceError(CosmoDaskError):
    """A GPU was asked for but no usable GPU (or CuPy) is present."""


class ChecksumError(SnapshotError):
    """A stored chunk's bytes differ from the checksum recorded when it was written
    (the chunk was altered or corrupted after the write)."""
