"""Importers of foreign snapshot formats into :class:`cosmo_dask.snapshot.Snapshot`."""

from .gadget import GadgetInfo, find_gadget_files, from_gadget_hdf5

__all__ = ["GadgetInfo", "find_gadget_files", "from_gadget_hdf5"]
