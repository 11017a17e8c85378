"""Tetrahedra of a column's blocks in one CUDA launch (the GPU path of ``column_block_tets``).

The NumPy/CuPy-array version in :mod:`.tessellation` builds a block's
tetrahedra with about 30 array operations. Called for every (leaf, column)
pair of a PSE deposit, that is tens of thousands of small kernel launches.
This kernel does the same arithmetic, in the same order, for all requested
blocks of a column at once: one thread per Lagrangian cell. For each cell it
takes the unwrapped corners ``anchor = ref + minimage(c000 - ref)``,
``corner = anchor + minimage(corner - c000)``, where ``ref`` is the block's
first particle. It then writes the 6 Kuhn tetrahedra (``KUHN_TETS`` order)
plus the block's shift, and the masses ``cell_mass / 6 * particle_mass``.
Compiled with ``--fmad=false``, so the result equals the CPU path bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

from .tessellation import KUHN_TETS

_SOURCE = r"""
__device__ __forceinline__ double minimage(double d, double box) {
    return d - box * floor(d / box + 0.5);
}

extern "C" __global__ void column_tets(
    const double* __restrict__ pos,    // (A+1, B+1, Z, 3) corners of the column
    const double* __restrict__ cmass,  // (A, B, NCZ) cell masses or null
    const long long* __restrict__ req, // (R, 2): k0, k1 cell range of each requested block
    const long long* __restrict__ first, // (R+1,) first output cell of each request
    const double* __restrict__ shift,  // (R, 3)
    const int* __restrict__ kuhn,      // (6, 4)
    int R, int A, int B, int Z, int NCZ, double box, int periodic, double pmass,
    double* __restrict__ tets, double* __restrict__ mass)
{
    long long n_cells = first[R];
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < n_cells;
         c += (long long)gridDim.x * blockDim.x) {
        int r = 0;
        while (first[r + 1] <= c) ++r;
        long long k0 = req[2 * r], k1 = req[2 * r + 1];
        long long local = c - first[r];
        long long depth = k1 - k0;
        int i = (int)(local / (B * depth));
        int j = (int)((local / depth) % B);
        long long k = k0 + local % depth;
        double corner[8][3];
        const double* ref = pos + (k0) * 3;  // corner (0, 0, k0)
        for (int n = 0; n < 8; ++n) {
            int di = (n >> 2) & 1, dj = (n >> 1) & 1, dk = n & 1;
            const double* p = pos + (((long long)(i + di) * (B + 1) + (j + dj)) * Z
                                     + (k + dk)) * 3;
            for (int a = 0; a < 3; ++a) corner[n][a] = p[a];
        }
        if (periodic) {
            double anchor[3];
            for (int a = 0; a < 3; ++a) {
                double r0 = ref[a];
                anchor[a] = r0 + minimage(corner[0][a] - r0, box);
            }
            for (int n = 7; n >= 0; --n)
                for (int a = 0; a < 3; ++a)
                    corner[n][a] = anchor[a] + minimage(corner[n][a] - corner[0][a], box);
        }
        double m = cmass ? cmass[((long long)i * B + j) * NCZ + k] : 1.0;
        m = m / 6.0 * pmass;
        for (int t = 0; t < 6; ++t) {
            long long out = c * 6 + t;
            mass[out] = m;
            for (int v = 0; v < 4; ++v)
                for (int a = 0; a < 3; ++a)
                    tets[(out * 4 + v) * 3 + a] = corner[kuhn[4 * t + v]][a] + shift[3 * r + a];
        }
    }
}
"""


@functools.cache
def _kernel(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=_SOURCE, options=("--fmad=false",)).get_function(
            "column_tets")


@functools.cache
def _kuhn(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.asarray(KUHN_TETS.astype(np.int32))


def column_block_tets_gpu(column, bks, block, ncz, box_size, particle_mass, shifts=None):
    """GPU twin of :func:`.tessellation.column_block_tets` (CuPy column in, CuPy out)."""
    import cupy

    pos, cm = column
    pos = cupy.ascontiguousarray(pos, dtype=cupy.float64)
    a, b, z = pos.shape[0] - 1, pos.shape[1] - 1, pos.shape[2]
    bks = np.asarray(bks, np.int64).reshape(-1)
    k0 = bks * block
    k1 = np.minimum(k0 + block, ncz)
    first = np.zeros(len(bks) + 1, np.int64)
    np.cumsum(a * b * (k1 - k0), out=first[1:])
    n_cells = int(first[-1])
    shift = np.zeros((len(bks), 3)) if shifts is None else np.asarray(shifts, np.float64)
    meta = cupy.asarray(np.concatenate([np.stack([k0, k1], 1).reshape(-1), first]))
    req, first_d = meta[:2 * len(bks)], meta[2 * len(bks):]
    tets = cupy.empty((n_cells * 6, 4, 3))
    mass = cupy.empty(n_cells * 6)
    if n_cells == 0:
        return tets, mass
    cmass = None if cm is None else cupy.ascontiguousarray(cm, dtype=cupy.float64)
    dev = cupy.cuda.Device().id
    threads = 128
    blocks = int(min(-(-n_cells // threads), 65535))
    _kernel(dev)((blocks,), (threads,), (
        pos, cmass if cmass is not None else np.uintp(0), req, first_d,
        cupy.asarray(shift.reshape(-1)), _kuhn(dev), np.int32(len(bks)), np.int32(a),
        np.int32(b), np.int32(z), np.int32(ncz), np.float64(box_size or 0.0),
        np.int32(box_size is not None),
        np.float64(1.0 if particle_mass is None else particle_mass), tets, mass))
    return tets, mass
