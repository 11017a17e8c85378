"""The one octree layout of cosmo_dask: what a built tree holds, on CPU or GPU.

Both builders (``spatial.octree`` with numba, ``spatial.octree_gpu`` with
CuPy) return an :class:`Octree` with exactly these fields and meanings, so the
tree walks, the multipole kernels and the Dask graph code never care which
device built the tree. Arrays are NumPy on CPU and CuPy on GPU (never mixed).

Geometry
--------
The root is a cube ``[root_lo, root_lo + root_size)^3``. A node at ``level``
with integer cell coordinates ``(i, j, k)`` covers
``root_lo + (i, j, k) * root_size / 2**level`` with side ``root_size / 2**level``.
Particles are sorted by their Morton key (``spatial.morton``, 21 bits per
axis, key = interleave(i, j, k) at level 21, x the most significant bit of
each triple); ties keep the input order (stable), so the sorted order, and
with it every result, does not depend on chunking.

Nodes
-----
Node 0 is the root. Nodes are stored level by level (breadth first); the
children of a node are contiguous, in Morton order, and only non-empty
children exist. A node is a leaf when it holds ``<= max_leaf`` particles or
reached level 21. Every node covers a contiguous range of sorted particles
``[start, start + count)``.

Multipoles (float64 always, computed bottom-up)
-----------------------------------------------
``mass``: total mass; ``com``: centre of mass; ``quad``: traceless quadrupole
about the centre of mass, ``Q_ab = sum m (3 d_a d_b - |d|^2 delta_ab)`` with
``d = x - com``, stored as ``(xx, xy, xz, yy, yz, zz)``; ``bmax``: the largest
distance from ``com`` to any particle of the node (for opening tests);
``lo``/``hi``: tight bounding box of the node's particles.

Groups
------
A group is a node with ``count <= max_group`` whose parent has
``count > max_group`` (or the root if it is small). Groups tile the sorted
particles; one tree walk per group builds its interaction lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.task_graph import task_payload

MORTON_BITS = 21  # bits per axis; keys fit in 63 bits of an int64/uint64


@task_payload
@dataclass
class Octree:
    """A built octree (NumPy or CuPy arrays, see the module docstring).

    Attributes
    ----------
    root_lo : (3,) float64 array
    root_size : float
        Side of the root cube.
    max_leaf, max_group : int
    order : (N,) int64
        ``sorted_index -> input index``.
    pos : (N, 3) float
        Positions in sorted order (input dtype).
    pmass : (N,) float
        Particle masses in sorted order.
    keys : (N,) uint64
        Morton keys in sorted order.
    level : (M,) int8
    start, count : (M,) int64
        Particle range of each node in sorted order.
    first_child : (M,) int64
        Index of the first child, ``-1`` for a leaf.
    n_child : (M,) int8
        Number of (non-empty) children, 0 for a leaf.
    parent : (M,) int64
        ``-1`` for the root.
    lo, hi : (M, 3) float64
        Tight bounding box of the node's particles.
    mass : (M,) float64
    com : (M, 3) float64
    quad : (M, 6) float64
    bmax : (M,) float64
    groups : (G,) int64
        Node index of each group, in sorted-particle order.
    """

    root_lo: Any
    root_size: float
    max_leaf: int
    max_group: int
    order: Any
    pos: Any
    pmass: Any
    keys: Any
    level: Any
    start: Any
    count: Any
    first_child: Any
    n_child: Any
    parent: Any
    lo: Any
    hi: Any
    mass: Any
    com: Any
    quad: Any
    bmax: Any
    groups: Any

    @property
    def n_nodes(self) -> int:
        return int(self.level.shape[0])

    @property
    def n_particles(self) -> int:
        return int(self.order.shape[0])

    def is_leaf(self):
        """Boolean array: which nodes are leaves."""
        return self.first_child < 0
