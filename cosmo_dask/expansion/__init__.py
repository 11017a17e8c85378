"""Basis-function expansions of isolated systems: SCF and MEX (see docs/expansions.md).

The public names load on first use (:func:`cosmo_dask.core.lazy.lazy_exports`), so that
importing the light ``expansion.parameters`` (as the CLI's parser does) loads no kernels.
"""

from __future__ import annotations

from ..core.lazy import lazy_exports

#: public name -> the module defining it
_PUBLIC = {"MEX": "mex", "ExpansionInput": "particles", "expansion_input": "particles",
           "SCF": "scf", "fit_series": "scf"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
