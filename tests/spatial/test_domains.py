"""Domain decomposition with ghost zones, against a brute-force reference."""

from __future__ import annotations

import itertools

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.spatial import decompose, domain_grid
from cosmo_dask.spatial.domains import _factor3


@pytest.mark.parametrize("n, shape", [(1, (1, 1, 1)), (8, (2, 2, 2)), (27, (3, 3, 3)),
                                      (12, (3, 2, 2)), (4, (2, 2, 1)), (7, (7, 1, 1))])
def test_factor3(n, shape):
    assert _factor3(n) == shape


def _expected(pos, grid, gw, d):
    """Brute force: indices of everything domain d must hold (owned or ghost)."""
    cell = np.array(np.unravel_index(d, grid.shape))
    lo = np.asarray(grid.origin) + cell * grid.width
    hi = lo + grid.width
    shape = np.asarray(grid.shape)
    found = set()
    shifts = [(0.0,)] * 3
    if grid.box_size is not None:
        shifts = [(-grid.box_size, 0.0, grid.box_size) if shape[a] > 1 else (0.0,)
                  for a in range(3)]
    for s in itertools.product(*shifts):
        img = pos + np.asarray(s)
        inside = np.ones(len(pos), bool)
        for a in range(3):
            if shape[a] > 1:
                inside &= (img[:, a] >= lo[a] - gw) & (img[:, a] < hi[a] + gw)
        found |= set(np.nonzero(inside)[0].tolist())
    return found


@pytest.mark.parametrize("n_domains", [1, 8, 27, (3, 1, 2)])
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("gw", [0.7, 3.0])  # 3.0: on 2-domain axes, near both faces
def test_owned_once_and_ghosts_complete(rng, n_domains, periodic, dtype, gw):
    n, box = 3000, 10.0
    pos = rng.random((n, 3)) * box
    pos[:50] = rng.choice([0.0, box * (1 - 1e-12), 3.3333333333, 0.7], size=(50, 3))
    if dtype == np.float32:
        pos = pos.astype(np.float32)
        pos[pos >= box] = 0.0
    if periodic:
        grid = domain_grid(n_domains, box_size=box)
    else:
        grid = domain_grid(n_domains, bounds=(pos.min(0), pos.max(0)))
    ids = da.from_array(np.arange(n) * 7 + 3, chunks=700)
    layout = decompose(da.from_array(pos, chunks=(700, 3)), grid, ghost_width=gw)
    parts = dask.compute(*layout.exchange(ids=ids))
    owners = np.concatenate([p.index[p.owned] for p in parts])
    assert np.array_equal(np.sort(owners), np.arange(n))
    for d, part in enumerate(parts):
        assert len(set(part.index.tolist())) == part.index.size, "a particle twice"
        assert set(part.index.tolist()) == _expected(pos, grid, gw, d), f"domain {d}"
        assert part.pos.dtype == pos.dtype
        np.testing.assert_array_equal(part.pos, pos[part.index])  # as stored, never shifted
        assert part.owned[: part.n_owned].all() and not part.owned[part.n_owned:].any()
        assert np.all(np.diff(part.index[: part.n_owned]) > 0)  # owned rows in index order
        ghosts = set(part.index[~part.owned].tolist())
        exported_elsewhere = {i for q in parts if q is not part for i in q.index[~q.owned]}
        assert set(part.index[part.exported].tolist()) == \
            set(part.index[part.owned].tolist()) & exported_elsewhere
        assert not (ghosts & set(part.index[part.owned].tolist()))
        np.testing.assert_array_equal(part.extra["ids"], part.index * 7 + 3)
    # owner_of gives every row the domain that owns it (what FOF routes ghosts by), and a
    # ghost's owner is always one of the domain's neighbours
    owner = np.empty(n, np.int64)
    for d, part in enumerate(parts):
        owner[part.index[:part.n_owned]] = d
    for d, part in enumerate(parts):
        np.testing.assert_array_equal(grid.owner_of(part.pos), owner[part.index])
        assert set(owner[part.index[part.n_owned:]].tolist()) <= set(grid.neighbours(d))


@pytest.mark.parametrize("shape, periodic, d, want", [
    ((1, 1, 1), True, 0, ()),
    ((2, 1, 1), True, 0, (1,)),                       # both faces lead to the one neighbour
    ((2, 2, 2), True, 5, (0, 1, 2, 3, 4, 6, 7)),
    ((3, 3, 3), False, 0, (1, 3, 4, 9, 10, 12, 13)),  # a corner: 7 of the 26 offsets
    ((3, 3, 3), False, 13, tuple(d for d in range(27) if d != 13)),
    ((3, 3, 3), True, 0, tuple(range(1, 27))),        # across periodic faces: all 26
    ((4, 1, 1), False, 0, (1,)),
])
def test_neighbours(shape, periodic, d, want):
    """The domains that touch one domain (faces, edges, corners, across periodic faces),
    and the relation is symmetric."""
    grid = (domain_grid(shape, box_size=12.0) if periodic
            else domain_grid(shape, bounds=(np.zeros(3), np.full(3, 12.0))))
    assert grid.neighbours(d) == want
    for e in range(grid.n_domains):
        assert all(e in grid.neighbours(f) for f in grid.neighbours(e))


def test_kernel_periods_and_ghost_width_limit():
    grid = domain_grid((2, 1, 1), box_size=4.0)
    np.testing.assert_array_equal(grid.kernel_periods, [4.0, 4.0, 4.0])
    assert domain_grid(8, bounds=(np.zeros(3), np.ones(3))).kernel_periods.tolist() == [0] * 3
    with pytest.raises(ParameterError, match="not smaller than the domain side 2"):
        grid.check_ghost_width(2.5)
    with pytest.raises(ParameterError, match="n_domains must be a positive integer"):
        domain_grid(0, box_size=1.0)


@pytest.mark.parametrize("periodic", [True, False])
def test_one_domain_split_is_the_chunk_in_order(rng, periodic):
    """One domain owns every row of a chunk in chunk order, with no ghosts and nothing
    exported (what the per-axis split gives, read straight off), as copies of the chunk."""
    from cosmo_dask.spatial.domains import split_chunk

    pos = (rng.random((300, 3)) * 10).astype(np.float32)
    ids = np.arange(300) * 5
    grid = (domain_grid(1, box_size=10.0) if periodic
            else domain_grid(1, bounds=(np.zeros(3), np.full(3, 10.0))))
    ((p, index, n_owned, exported, i),) = split_chunk(pos, 1000, grid, 0.5, ids)
    np.testing.assert_array_equal(p, pos)
    np.testing.assert_array_equal(i, ids)
    np.testing.assert_array_equal(index, np.arange(1000, 1300))
    assert index.dtype == np.int64 and n_owned == 300 and not exported.any()
    p[0] = -1.0
    assert pos[0, 0] != -1.0  # the part is a copy: the chunk is never written through it
