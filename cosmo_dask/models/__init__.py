"""Synthetic snapshot generators, lazy and chunk by chunk.

Isolated N-body models (N-body units, centred on the origin):

* :func:`plummer`   -- Plummer sphere, isotropic DF velocities;
* :func:`hernquist` -- Hernquist (1990) sphere, isotropic DF velocities;
* :func:`ferrers`   -- Ferrers ellipsoid, positions only.

Periodic boxes:

* :func:`perturbed_lattice` -- cubic lattice with uniform random offsets;
* :func:`zeldovich`         -- Zel'dovich initial conditions for flat LambdaCDM
  (see :class:`Cosmology`);
* :func:`lpt_ics`           -- Zel'dovich (order 1) or 2LPT (order 2) initial
  conditions, with the EH98, a tabulated, a callable or a CAMB/CLASS spectrum;
* :func:`halo_blobs`        -- Plummer halos with a power-law mass spectrum in a
  periodic box (a strongly clustered stand-in for an evolved snapshot).

Every generator returns a :class:`~cosmo_dask.store.snapshot.Snapshot` of dask arrays.
Random numbers come in fixed generation blocks of 2**16 particles (the
cosmological ICs: one stream per lattice plane, their fields made slab by slab
through the distributed FFT, :mod:`~cosmo_dask.models.lpt_fields`), so a given
seed gives bitwise the same particles for any chunk size. See ``docs/models.md``.
"""

from ..core.lazy import lazy_exports

#: public name -> the module defining it (loaded on first use, so that the CLI's parser
#: reads the light ``models.parameters`` without loading the generators)
_PUBLIC = {"Cosmology": "cosmology", "plummer": "isolated", "hernquist": "isolated",
           "ferrers": "isolated", "perturbed_lattice": "lattice", "zeldovich": "zeldovich_ics",
           "lpt_ics": "lpt", "halo_blobs": "clustered"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
