"""The ``cosmo-dask`` command (:func:`main`; ``python -m cosmo_dask``).

The parser and its argument types (:mod:`.parser`), what the command prints
(:mod:`.messages`), what the commands share (:mod:`.common`: the cluster, output checks),
one module per command group (:mod:`.data`, :mod:`.halos`, :mod:`.expand`,
:mod:`.density`, :mod:`.gravity`, :mod:`.demo`) and the entry point (:mod:`.app`).
"""

from .app import main

__all__ = ["main"]
