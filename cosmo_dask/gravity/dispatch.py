"""The kernel contracts of gravity: one :class:`~cosmo_dask.core.dispatch.KernelDispatch` per
computation, chosen by the type of the chunk it is given.

Each contract has one signature (chunk first) and one test suite
(``tests/gravity/test_kernel_contracts.py``). Its CPU kernel (NumPy/numba) is imported
here; its GPU kernel (CuPy/CUDA) is named by module and imported on the first CuPy
chunk. Graph code calls these objects, never a ``*_gpu`` module; only this module names
the GPU kernels.

``p2p_block(tpos, spos, smass, *, G, softening, softening_kernel, precision, potential,
box_size, rs, r_cut, table_level, exclude, centre)``
    The pull of a block of sources on a block of targets: ``(acc (nt, 3), pot (nt,) or
    None)`` of dtype ``precision`` (:func:`~cosmo_dask.gravity.p2p_kernels.p2p_block`,
    :func:`~cosmo_dask.gravity.p2p_kernels_gpu.p2p_block_gpu`; the GPU kernel also takes
    launch keywords).
``green_kslab(fk, kx, ky, kz, *, cell, rs, scale, axis=None, kind="fd4")``
    The PM Green's function on a k-space slab, a new slab of ``fk``'s dtype; with
    ``axis``, one acceleration component's slab (the gradient in the same pass)
    (:func:`~cosmo_dask.gravity.pm_kernels.green_kslab`,
    :func:`~cosmo_dask.gravity.pm_kernels_gpu.green_kslab_gpu`).
``fd4_gradient(phi, lo, hi, *, axis, cell)``
    One acceleration component of a real potential slab by the 4-point difference, a new
    slab of ``phi``'s dtype (``lo``, ``hi``: the two planes before and after the slab)
    (:func:`~cosmo_dask.gravity.pm_kernels.fd4_gradient`,
    :func:`~cosmo_dask.gravity.pm_kernels_gpu.fd4_gradient_gpu`).
``cic_interpolate(pos, meshes, box_size, shift=0.0, x_lo=0, add_to=None)``
    CIC interpolation of up to four mesh slabs at particles, ``(m, c)`` float64, or
    added in place to ``add_to`` (the interlaced meshes' sum without a second array)
    (:func:`~cosmo_dask.gravity.pm_kernels.cic_interpolate_numpy`,
    :func:`~cosmo_dask.gravity.pm_kernels_gpu.cic_interpolate_gpu`).
``tree_forces(pos, mass, *, G, theta, softening, softening_kernel, precision, potential,
max_leaf, max_group, quadrupole, box_size, rs, r_cut)``
    Tree accelerations (and potentials) of all the particles of one array, in input
    order (:func:`~cosmo_dask.gravity.tree.forces.tree_forces`,
    :func:`~cosmo_dask.gravity.tree.forces_gpu.tree_forces_gpu`).
``domain_tree(pos, mass, index, opts)``, ``domain_let(tree, box_lo, box_hi, opts)``,
``domain_forces(tree, lets, batch, opts)``
    The three kernels of the multi-domain tree graph
    (:mod:`~cosmo_dask.gravity.tree.graph`): a domain's octree, the locally essential
    tree a source tree sends to a target box, a batch of a domain's group walks against
    its own tree and the LETs (:mod:`~cosmo_dask.gravity.tree.forces`,
    :mod:`~cosmo_dask.gravity.tree.let_gpu`). ``opts`` is the tree options mapping of
    :func:`~cosmo_dask.gravity.tree.graph.tree_accelerations`. The first argument of the
    last two is a domain tree, dispatched on its ``index`` array.

Adding a GPU kernel: write it in a ``*_gpu`` module with the CPU kernel's signature (it
may import shared pieces of the CPU kernel module, never the reverse), name it here as
``gpu="cosmo_dask.gravity.<module>:<function>"`` and add its ``"gpu"`` case to the
contract's test.
"""

from __future__ import annotations

from ..core.dispatch import KernelDispatch
from . import p2p_kernels, pm_kernels
from .tree import forces as tree_cpu

__all__ = ["cic_interpolate", "domain_forces", "domain_let", "domain_tree", "fd4_gradient",
           "green_kslab", "p2p_block", "tree_forces"]

_GPU = "cosmo_dask.gravity."


def tree_index(tree):
    """The array a domain tree's kernels dispatch on: its particles' ``index``."""
    return tree.index


p2p_block = KernelDispatch("gravity.p2p_block", p2p_kernels.p2p_block,
                           gpu=_GPU + "p2p_kernels_gpu:p2p_block_gpu")
green_kslab = KernelDispatch("gravity.green_kslab", pm_kernels.green_kslab,
                             gpu=_GPU + "pm_kernels_gpu:green_kslab_gpu")
fd4_gradient = KernelDispatch("gravity.fd4_gradient", pm_kernels.fd4_gradient,
                              gpu=_GPU + "pm_kernels_gpu:fd4_gradient_gpu")
cic_interpolate = KernelDispatch("gravity.cic_interpolate", pm_kernels.cic_interpolate_numpy,
                                 gpu=_GPU + "pm_kernels_gpu:cic_interpolate_gpu")
tree_forces = KernelDispatch("gravity.tree_forces", tree_cpu.tree_forces,
                             gpu=_GPU + "tree.forces_gpu:tree_forces_gpu")
domain_tree = KernelDispatch("gravity.domain_tree", tree_cpu.domain_tree,
                             gpu=_GPU + "tree.let_gpu:domain_tree_gpu")
domain_let = KernelDispatch("gravity.domain_let", tree_cpu.domain_let,
                            gpu=_GPU + "tree.let_gpu:domain_let_gpu", chunk_of=tree_index)
domain_forces = KernelDispatch("gravity.domain_forces", tree_cpu.domain_forces,
                               gpu=_GPU + "tree.let_gpu:domain_forces_gpu",
                               chunk_of=tree_index)
