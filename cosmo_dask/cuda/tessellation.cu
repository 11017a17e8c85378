// Tetrahedra of a column's blocks in one launch (cosmo_dask.density.tessellation_kernels_gpu);
// compiled with --fmad=false (bit for bit the CPU path). No defines.
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
