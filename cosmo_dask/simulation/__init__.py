"""Cosmological N-body runs: evolve periodic initial conditions with PM or TreePM forces.

::

    from cosmo_dask.models import zeldovich
    from cosmo_dask.simulation import run, open_simulation

    ics = zeldovich(64, box_size=1000.0, redshift=19.0, seed=1)
    res = run(ics, z_final=0.0, n_steps=10, outputs=(1.0,), out="sim",
              analyses=("power", "halos"))
    sim = open_simulation("sim")          # sim.redshifts, sim.snapshot(1.0), sim.log

See ``docs/simulation.md``: :mod:`.integrator` (equations, kick/drift factors),
:mod:`.schedule` (step schedule), :mod:`.store` (store layout, checkpoints),
:mod:`.runner` (:func:`run`).
"""

from ..core.lazy import lazy_exports

#: public name -> the module defining it; loaded on first use
#: (:func:`cosmo_dask.core.lazy.lazy_exports`), so that importing the light
#: ``simulation.parameters`` (as the CLI's parser does) loads no kernels
_PUBLIC = {"run": "runner", "open_simulation": "store", "SimulationResult": "runner",
           "SimulationStore": "store", "SimulationInterrupted": "runner"}

__all__ = ["run", "open_simulation", "SimulationResult", "SimulationStore",
           "SimulationInterrupted"]

lazy_exports(__name__, _PUBLIC)
