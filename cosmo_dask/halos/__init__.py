"""Halo finding: distributed friends-of-friends, catalogs and centres."""

from .finder import fof
from .fof import FOFLabels, fof_labels
from .result import HaloResult, open_catalog

__all__ = ["fof", "fof_labels", "FOFLabels", "HaloResult", "open_catalog"]
