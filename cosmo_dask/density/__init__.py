"""Densities: phase-space-element (PSE) tessellation and exact tetrahedron deposits;
mesh painting (NGP/CIC/TSC/PCS)."""

from .paint import density_contrast, paint
from .tessellation import block_tetrahedra, lagrangian_blocks, snapshot_tetrahedra
from .tet_volume import deposit_tets, tet_cube_volume

__all__ = [
    "block_tetrahedra",
    "density_contrast",
    "deposit_tets",
    "lagrangian_blocks",
    "paint",
    "snapshot_tetrahedra",
    "tet_cube_volume",
]
