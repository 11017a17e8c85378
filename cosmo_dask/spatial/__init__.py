"""Spatial structures shared by every capability: the one domain decomposition
(with ghost zones) of cosmo_dask. FOF ghosts (linking length), short-range
gravity ghosts (cutoff) and PSE sub-block gathering all use it."""

from .domains import (
                      DomainGrid,
                      DomainPart,
                      chunk_pieces,
                      domain_grid,
                      rows_by_chunk,
                      scatter_to_domains,
)

__all__ = ["DomainGrid", "DomainPart", "chunk_pieces", "domain_grid", "rows_by_chunk",
           "scatter_to_domains"]
