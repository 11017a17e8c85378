"""Tetrahedra of a column's blocks in one CUDA launch (the GPU path of ``column_block_tets``).

The NumPy/CuPy-array version in :mod:`.tessellation_kernels` builds a block's
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

import collections
import functools

import numpy as np

from .tessellation_kernels import KUHN_TETS

_SOURCE = r"""
__device__ __forceinline__ double minimage(double d, double box) {
    return d - box * floor(d / box + 0.5);
}

// meta (int64): R, then R rows of (column, k0, k1, sx, sy, sz), then first[R+1],
// then per column (a, b, Z, pos pointer, cell-mass pointer or 0).
struct Request {
    const long long* q;      // (column, k0, k1, sx, sy, sz)
    const double* pos;       // the column's corners (a+1, B+1, Z, 3)
    const double* cmass;     // cell masses (a, B, NCZ) or null
    int B;
    long long Z;
};

__device__ __forceinline__ Request request(const long long* meta, long long r) {
    const long long R = meta[0];
    const long long* req = meta + 1;
    const long long* colinfo = req + 6 * R + R + 1;
    Request out;
    out.q = req + 6 * r;
    const long long* ci = colinfo + 5 * out.q[0];
    out.B = (int)ci[1];
    out.Z = ci[2];
    out.pos = (const double*)ci[3];
    out.cmass = (const double*)ci[4];
    return out;
}

// Unwrapped corners of cell `local` (C order over (i, j, k - k0)) of request q;
// returns the cell's (i, j, k).
__device__ __forceinline__ void cell_corners(const Request& rq, long long local,
                                             int periodic, double box, double corner[8][3],
                                             int* ci, int* cj, long long* ck) {
    const int B = rq.B;
    const long long Z = rq.Z;
    long long k0 = rq.q[1], k1 = rq.q[2];
    long long depth = k1 - k0;
    int i = (int)(local / (B * depth));
    int j = (int)((local / depth) % B);
    long long k = k0 + local % depth;
    const double* ref = rq.pos + k0 * 3;  // corner (0, 0, k0)
    for (int n = 0; n < 8; ++n) {
        int di = (n >> 2) & 1, dj = (n >> 1) & 1, dk = n & 1;
        const double* p = rq.pos + (((long long)(i + di) * (B + 1) + (j + dj)) * Z
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
    *ci = i; *cj = j; *ck = k;
}

extern "C" __global__ void column_tets(
    const long long* __restrict__ meta, const int* __restrict__ kuhn,
    int NCZ, double box, int periodic, double pmass,
    double* __restrict__ tets, double* __restrict__ mass)
{
    const long long R = meta[0];
    const long long* first = meta + 1 + 6 * R;
    long long n_cells = first[R];
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < n_cells;
         c += (long long)gridDim.x * blockDim.x) {
        long long lo = 0, hi = R - 1;       // request r: first[r] <= c < first[r + 1]
        while (lo < hi) {
            long long mid = (lo + hi + 1) >> 1;
            if (first[mid] <= c) lo = mid; else hi = mid - 1;
        }
        const Request rq = request(meta, lo);
        double corner[8][3];
        int i, j;
        long long k;
        cell_corners(rq, c - first[lo], periodic, box, corner, &i, &j, &k);
        double shift[3];
        for (int a = 0; a < 3; ++a) shift[a] = (double)rq.q[3 + a] * box;
        double m = rq.cmass ? rq.cmass[((long long)i * rq.B + j) * NCZ + k] : 1.0;
        m = m / 6.0 * pmass;
        for (int t = 0; t < 6; ++t) {
            long long out = c * 6 + t;
            mass[out] = m;
            for (int v = 0; v < 4; ++v)
                for (int a = 0; a < 3; ++a) {
                    double x = corner[kuhn[4 * t + v]][a];
                    tets[(out * 4 + v) * 3 + a] = rq.q[3 + a] ? x + shift[a] : x;
                }
        }
    }
}

// Bounding box of each request's unwrapped cell corners (plus its shift): one
// thread block per request, threads over its cells, a shared-memory reduction.
// The same coordinates column_tets writes, without writing the tetrahedra.
extern "C" __global__ void column_bboxes(
    const long long* __restrict__ meta, double box, int periodic,
    double* __restrict__ lo_out, double* __restrict__ hi_out)
{
    __shared__ double s_lo[3][256];
    __shared__ double s_hi[3][256];
    const long long R = meta[0];
    const long long* first = meta + 1 + 6 * R;
    for (long long r = blockIdx.x; r < R; r += gridDim.x) {
        const Request rq = request(meta, r);
        const double inf = __longlong_as_double(0x7ff0000000000000LL);
        double lo[3] = {inf, inf, inf};
        double hi[3] = {-inf, -inf, -inf};
        long long n = first[r + 1] - first[r];
        for (long long c = threadIdx.x; c < n; c += blockDim.x) {
            double corner[8][3];
            int i, j;
            long long k;
            cell_corners(rq, c, periodic, box, corner, &i, &j, &k);
            for (int v = 0; v < 8; ++v)
                for (int a = 0; a < 3; ++a) {
                    lo[a] = fmin(lo[a], corner[v][a]);
                    hi[a] = fmax(hi[a], corner[v][a]);
                }
        }
        for (int a = 0; a < 3; ++a) { s_lo[a][threadIdx.x] = lo[a]; s_hi[a][threadIdx.x] = hi[a]; }
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s)
                for (int a = 0; a < 3; ++a) {
                    s_lo[a][threadIdx.x] = fmin(s_lo[a][threadIdx.x], s_lo[a][threadIdx.x + s]);
                    s_hi[a][threadIdx.x] = fmax(s_hi[a][threadIdx.x], s_hi[a][threadIdx.x + s]);
                }
            __syncthreads();
        }
        if (threadIdx.x < 3) {
            int a = threadIdx.x;
            double sh = (double)rq.q[3 + a] * box;
            lo_out[r * 3 + a] = s_lo[a][0] + (rq.q[3 + a] ? sh : 0.0);
            hi_out[r * 3 + a] = s_hi[a][0] + (rq.q[3 + a] ? sh : 0.0);
        }
        __syncthreads();
    }
}
"""


@functools.cache
def _module(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=_SOURCE, options=("--fmad=false",))


def _kernel(device_id: int, name: str = "column_tets"):
    return _module(device_id).get_function(name)


@functools.cache
def _kuhn(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.asarray(KUHN_TETS.astype(np.int32))


def _requests(columns, rows, block, ncz):
    """The int64 request table of the kernels (see the CUDA source), on the GPU.

    ``rows`` (R, 5) int64: ``(slot, bk, sx, sy, sz)``, block ``bk`` of column
    ``columns[slot]`` shifted by ``(sx, sy, sz)`` boxes. Returns ``(meta,
    n_requests, n_cells, held)``; ``held`` keeps the contiguous float64 columns
    the table points into alive until the launch.
    """
    import cupy

    rows = np.asarray(rows, np.int64).reshape(-1, 5)
    slots, where = np.unique(rows[:, 0], return_inverse=True)
    cols = [(cupy.ascontiguousarray(columns[s][0], dtype=cupy.float64),
             None if columns[s][1] is None
             else cupy.ascontiguousarray(columns[s][1], dtype=cupy.float64)) for s in slots]
    info = np.array([(p.shape[0] - 1, p.shape[1] - 1, p.shape[2], p.data.ptr,
                      0 if m is None else m.data.ptr) for p, m in cols],
                    np.uint64).reshape(-1, 5).view(np.int64)
    k0 = rows[:, 1] * block
    k1 = np.minimum(k0 + block, ncz)
    req = np.column_stack([where, k0, k1, rows[:, 2:]])
    first = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(info[where, 0] * info[where, 1] * (k1 - k0), out=first[1:])
    meta = np.concatenate([[len(rows)], req.reshape(-1), first, info.reshape(-1)])
    return upload(meta.astype(np.int64)), len(rows), int(first[-1]), cols


def block_rows(bks, shifts=None, slot: int = 0) -> np.ndarray:
    """Request rows ``(slot, bk, sx, sy, sz)`` for blocks ``bks`` of one column."""
    bks = np.asarray(bks, np.int64).reshape(-1)
    sh = (np.zeros((len(bks), 3), np.int64) if shifts is None
          else np.rint(np.asarray(shifts, np.float64)).astype(np.int64).reshape(-1, 3))
    return np.column_stack([np.full(len(bks), slot, np.int64), bks, sh])


#: pinned host buffers of uploads still in flight, with the event that ends each
_IN_FLIGHT: collections.deque = collections.deque()


def upload(table: np.ndarray):
    """Copy a host array to the GPU without making the host wait for queued kernels.

    ``cupy.asarray`` of pageable memory returns only once the copy is done,
    which is after every kernel queued before it: each PSE task would wait
    for the previous task's deposit. Staging through pinned memory makes the
    copy asynchronous; the buffer is kept until its event has passed.
    """
    import cupy

    while _IN_FLIGHT and _IN_FLIGHT[0][0].done:
        _IN_FLIGHT.popleft()
    mem = cupy.cuda.alloc_pinned_memory(max(table.nbytes, 1))
    staged = np.frombuffer(mem, table.dtype, table.size).reshape(table.shape)
    staged[...] = table
    out = cupy.empty(table.shape, table.dtype)
    stream = cupy.cuda.get_current_stream()
    out.set(staged, stream=stream)
    _IN_FLIGHT.append((stream.record(), mem))
    return out


def rows_tets_gpu(columns, rows, block, ncz, box_size, particle_mass):
    """Tetrahedra and masses of many columns' blocks in one launch (CuPy).

    ``rows`` (R, 5) int64 ``(slot, bk, sx, sy, sz)``: block ``bk`` of the CuPy
    column ``columns[slot]`` (``(corners, cell_mass or None)``), translated by
    ``(sx, sy, sz) * box_size``. Output in row order, cells in C order: the
    same as concatenating :func:`.tessellation_kernels.column_block_tets` per row.
    No host synchronisation.
    """
    import cupy

    meta, _, n_cells, held = _requests(columns, rows, block, ncz)
    tets = cupy.empty((n_cells * 6, 4, 3))
    mass = cupy.empty(n_cells * 6)
    if n_cells == 0:
        return tets, mass
    dev = cupy.cuda.Device().id
    threads = 128
    blocks = int(min(-(-n_cells // threads), 65535))
    _kernel(dev)((blocks,), (threads,), (
        meta, _kuhn(dev), np.int32(ncz), np.float64(box_size or 0.0),
        np.int32(box_size is not None),
        np.float64(1.0 if particle_mass is None else particle_mass), tets, mass))
    del held
    return tets, mass


def column_bboxes_gpu(column, block, ncz, box_size):
    """``(lo (nbk, 3), hi (nbk, 3))`` CuPy: bounding boxes of every block of one column.

    The boxes of the unwrapped cell corners that :func:`rows_tets_gpu` would
    write (one launch, one thread block per block; no tetrahedra are made).
    """
    import cupy

    nbk = -(-ncz // block)
    meta, n_req, _, held = _requests([column], block_rows(np.arange(nbk)), block, ncz)
    lo = cupy.empty((n_req, 3))
    hi = cupy.empty((n_req, 3))
    dev = cupy.cuda.Device().id
    _kernel(dev, "column_bboxes")((int(min(n_req, 65535)),), (256,), (
        meta, np.float64(box_size or 0.0), np.int32(box_size is not None), lo, hi))
    del held
    return lo, hi


def column_block_tets_gpu(column, bks, block, ncz, box_size, particle_mass, shifts=None):
    """GPU twin of :func:`.tessellation_kernels.column_block_tets` for one column.

    ``shifts`` here are translations (whole boxes), as there.
    """
    img = None
    if shifts is not None:
        img = np.asarray(shifts, np.float64) / (box_size if box_size else 1.0)
    return rows_tets_gpu([column], block_rows(bks, img), block, ncz, box_size, particle_mass)
