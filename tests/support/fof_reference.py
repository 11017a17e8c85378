"""Independent friends-of-friends references for the FOF kernel tests: friend pairs from
scipy's cKDTree (periodic ``boxsize``, shifted copies for mixed periodicity) or by brute
force with minimum-image differences, in float64."""

from __future__ import annotations

import itertools

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from cosmo_dask.core.errors import ParameterError


def wrap(pos, periods):
    """Periodic coordinates into [0, L) (the kernel's convention), float64."""
    out = np.array(pos, dtype=np.float64, copy=True)
    for a, L in enumerate(periods):
        if L > 0:
            x = np.mod(out[:, a], L)
            x[(x >= L) | (x < 0)] = 0.0
            out[:, a] = x
    return out


def kdtree_pairs(pos, periods, ll):
    """Friend pairs (i < j) from cKDTree; periodic axes by replicating the points.

    Fully periodic uses ``boxsize``, fully open a plain tree; mixed periodicity
    queries the points against copies shifted by -L, 0, +L along each periodic axis
    (valid for ``L >= 2 * ll``).
    """
    periods = np.asarray(periods, dtype=np.float64)
    m = len(pos)
    if np.all(periods > 0):
        w = wrap(pos, periods)
        return cKDTree(w, boxsize=periods).query_pairs(ll, output_type="ndarray")
    if np.all(periods == 0):
        return cKDTree(np.asarray(pos, dtype=np.float64)).query_pairs(ll, output_type="ndarray")
    w = wrap(pos, periods)
    axes = [(-1, 0, 1) if L > 0 else (0,) for L in periods]
    rep = np.concatenate([w + np.array([sx, sy, sz]) * periods
                          for sx in axes[0] for sy in axes[1] for sz in axes[2]])
    dm = cKDTree(w).sparse_distance_matrix(cKDTree(rep), ll, output_type="ndarray")
    i = dm["i"].astype(np.int64)
    j = dm["j"].astype(np.int64) % m
    keep = i < j
    return np.unique(np.stack([i[keep], j[keep]], axis=1), axis=0).reshape(-1, 2)


def brute_pairs(pos, periods, ll):
    """Friend pairs (i < j) by brute force with minimum-image differences."""
    w = wrap(pos, periods)
    m = len(w)
    out = []
    with np.errstate(over="ignore", invalid="ignore"):
        for i0 in range(0, m, 512):
            d = w[i0:i0 + 512, None, :] - w[None, :, :]
            for a, L in enumerate(periods):
                if L > 0:
                    da = d[..., a]
                    d[..., a] = np.where(da > 0.5 * L, da - L,
                                         np.where(da < -0.5 * L, da + L, da))
            d2 = d[..., 0] ** 2 + d[..., 1] ** 2 + d[..., 2] ** 2
            ii, jj = np.nonzero(d2 <= ll * ll)
            ii = ii + i0
            keep = ii < jj
            out.append(np.stack([ii[keep], jj[keep]], axis=1))
    return np.concatenate(out) if out else np.empty((0, 2), dtype=np.int64)


def friend_pairs(pos, periods, ll):
    """cKDTree pairs where its periodic handling is valid (every period > 2 ll or open),
    else brute force (small sets only)."""
    per = np.asarray(periods, dtype=np.float64)
    if np.all((per == 0) | (per > 2 * ll)):
        return kdtree_pairs(pos, per, ll)
    assert len(pos) <= 6000, "brute-force reference: keep the set small"
    return brute_pairs(pos, per, ll)


def canonical(comp):
    """Labels -> the smallest index of each group."""
    _, first, inv = np.unique(comp, return_index=True, return_inverse=True)
    return first[inv].astype(np.int64)


def reference(pos, periods, ll, min_friends=1):
    """(canonical labels, friend counts) of the FOF partition from :func:`friend_pairs`
    and scipy's connected components; with ``min_friends = k > 1`` only pairs of two
    particles with at least ``k`` friends link."""
    m = len(pos)
    pairs = friend_pairs(pos, periods, ll)
    friends = np.bincount(pairs.ravel(), minlength=m)
    if min_friends > 1:
        core = friends >= min_friends
        pairs = pairs[core[pairs[:, 0]] & core[pairs[:, 1]]]
    graph = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])),
                       shape=(m, m))
    _, comp = connected_components(graph, directed=False)
    return canonical(comp), friends


def reference_labels(pos, ll, box, min_members, ids=None, min_friends=1):
    """cKDTree pairs + connected components; halos ordered by size, ties by smallest id."""
    n = len(pos)
    tree = cKDTree(pos, boxsize=box) if box else cKDTree(pos)
    pairs = tree.query_pairs(ll, output_type="ndarray")
    if min_friends > 1:
        friends = np.bincount(pairs.ravel(), minlength=n)
        core = friends >= min_friends
        pairs = pairs[core[pairs[:, 0]] & core[pairs[:, 1]]]
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    ids = np.arange(n) if ids is None else ids
    sizes = np.bincount(comp)
    first = np.full(sizes.size, np.iinfo(np.int64).max)
    np.minimum.at(first, comp, ids)
    keep = np.flatnonzero(sizes >= min_members)
    order = keep[np.lexsort((first[keep], -sizes[keep]))]
    halo = np.full(sizes.size, -1)
    halo[order] = np.arange(order.size)
    return halo[comp], sizes[order], first[order]


def clustered(rng, n_uniform, box, sigma, per_blob=60):
    """Uniform background plus blobs centred on every face, edge and corner of the box
    and of the 2x2x2 and 3x3x3 domain grids."""
    fractions = (0.0, 1 / 3, 0.5, 2 / 3)
    centres = [np.array(c) * box for c in itertools.product(fractions, repeat=3)]
    centres += list(rng.random((20, 3)) * box)
    blobs = [c + rng.normal(scale=sigma, size=(per_blob, 3)) for c in centres]
    pos = np.concatenate([rng.random((n_uniform, 3)) * box] + blobs)
    return np.mod(pos, box)


def canonical_labels(labels) -> np.ndarray:
    """Relabel a partition so each element's label is the smallest index of its group.

    Parameters
    ----------
    labels : array_like
        Any labelling, shape ``(m,)``; equal labels mean the same group.

    Returns
    -------
    numpy.ndarray
        int64, shape ``(m,)``: for each element the smallest index carrying the
        same label. Two labellings describe the same partition exactly when
        their canonical forms are equal.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ParameterError(f"labels must be one-dimensional, got shape {labels.shape}")
    if labels.size == 0:
        return np.empty(0, dtype=np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    return first[inverse].astype(np.int64)
