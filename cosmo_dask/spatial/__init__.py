"""Spatial structures shared by every capability: the one domain decomposition of
cosmo_dask (a :class:`DomainLayout` from :func:`decompose`: particles to domains with
ghost zones, and results back to chunk order). FOF ghosts (linking length) and tree /
TreePM gravity domains use it; ``docs/spatial.md`` names the other decompositions
(mesh slabs, MEX's radial buckets, PSE's Lagrangian columns) and why they stay apart."""

from .domains import DomainGrid, DomainPart, domain_grid, rows_by_chunk
from .layout import DomainLayout, decompose

__all__ = ["DomainGrid", "DomainLayout", "DomainPart", "decompose", "domain_grid",
           "rows_by_chunk"]
