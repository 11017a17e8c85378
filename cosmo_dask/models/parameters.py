"""The generators' parameters, declared once: defaults and choices shared by the model
functions (:mod:`cosmo_dask.models`) and ``cosmo-dask generate`` / ``cosmo-dask ics``.

A light module (no NumPy kernels, no dask): the CLI's parser reads it before any
generator loads. The generators check their values where they are given.
"""

from __future__ import annotations

__all__ = ["MODELS", "SEED_DEFAULT", "SCALE_DEFAULT", "MASS_DEFAULT", "FERRERS_AXES_DEFAULT",
           "FERRERS_INDEX_DEFAULT", "LATTICE_AMPLITUDE_DEFAULT", "N_HALOS_DEFAULT",
           "LPT_ORDERS", "LPT_ORDER_DEFAULT"]

#: the models of ``cosmo-dask generate`` (``blobs`` is :func:`~cosmo_dask.models.halo_blobs`)
MODELS = ("plummer", "hernquist", "ferrers", "lattice", "zeldovich", "blobs")
#: the random seed of every generator by default
SEED_DEFAULT = 0
#: the isolated models' scale radius and total mass (N-body units) by default
SCALE_DEFAULT = 1.0
MASS_DEFAULT = 1.0
#: the Ferrers ellipsoid's semi-axes and index n by default
FERRERS_AXES_DEFAULT = (1.0, 0.5, 0.25)
FERRERS_INDEX_DEFAULT = 1
#: the perturbed lattice's offset amplitude, in lattice cells
LATTICE_AMPLITUDE_DEFAULT = 0.5
#: the clustered box's number of Plummer halos by default
N_HALOS_DEFAULT = 400
#: Lagrangian perturbation orders of the cosmological ICs (1: Zel'dovich, 2: 2LPT)
LPT_ORDERS = (1, 2)
LPT_ORDER_DEFAULT = 2
