"""Halo finding: distributed friends-of-friends, catalogs, centres and mass functions."""

from .api import fof
from .fof import FOFLabels, fof_labels
from .mass_function import (
    mass_function,
    plot_mass_function,
    sigma_of_mass,
    theory_mass_function,
)
from .result import HaloResult, open_catalog
from .spherical_overdensity import spherical_overdensity

__all__ = [
    "fof",
    "fof_labels",
    "FOFLabels",
    "HaloResult",
    "open_catalog",
    "mass_function",
    "plot_mass_function",
    "sigma_of_mass",
    "theory_mass_function",
    "spherical_overdensity",
]
