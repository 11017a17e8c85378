"""Densities: phase-space-element (PSE) densities on an adaptive octree, the
tessellation and exact tetrahedron deposits behind them; mesh painting
(NGP/CIC/TSC/PCS).

The public names load on first use (:func:`cosmo_dask.core.lazy.lazy_exports`), so that
importing the light ``density.parameters`` (as the CLI's parser does) loads no kernels.
"""

from ..core.lazy import lazy_exports

#: public name -> the module defining it
_PUBLIC = {"DensityOctree": "octree_model", "block_tetrahedra": "tessellation",
           "density_contrast": "painting", "deposit_tets": "tetrahedra",
           "lagrangian_blocks": "tessellation", "open_density_octree": "octree_model",
           "paint": "painting", "pse_density": "pse", "snapshot_tetrahedra": "tessellation",
           "tet_cube_volume": "tetrahedra"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
