"""Densities: phase-space-element (PSE) densities on an adaptive octree, the
tessellation and exact tetrahedron deposits behind them; mesh painting
(NGP/CIC/TSC/PCS)."""

from .octree_model import DensityOctree
from .octree_store import open_density_octree
from .paint import density_contrast, paint
from .pse import pse_density
from .tessellation import block_tetrahedra, lagrangian_blocks, snapshot_tetrahedra
from .tet_volume import deposit_tets, tet_cube_volume

__all__ = [
    "DensityOctree",
    "block_tetrahedra",
    "density_contrast",
    "deposit_tets",
    "lagrangian_blocks",
    "open_density_octree",
    "paint",
    "pse_density",
    "snapshot_tetrahedra",
    "tet_cube_volume",
]
