"""Importers of foreign snapshot formats into :class:`cosmo_dask.store.snapshot.Snapshot`."""

from .gadget import GadgetInfo, find_gadget_files, from_gadget_hdf5
from .gadget_binary import from_gadget_binary
from .swift import from_swift

__all__ = ["GadgetInfo", "find_gadget_files", "from_gadget_binary", "from_gadget_hdf5",
           "from_swift"]
