// Periodic pair counts of one domain: the GPU twin of
// cosmo_dask.analysis.pair_count_kernels (module cosmo_dask.analysis.pair_count_kernels_gpu).
//
// The particles come sorted by cell (the cell list of pair_count_kernels.cell_geometry,
// `geo`: rows base, cut, origin, side, n, wrapped per axis), float64 coordinates in
// structure-of-arrays form. One thread per particle i of the first set (grid-stride)
// walks the neighbour cells of its cell in the CPU kernel's order: every offset in
// [-k, k]^3 for a cross count, the lexicographically positive half for an auto count
// (its own cell with j > i only), a raw cell index outside [0, n) of a wrapped axis
// meaning the image shifted by one period. Pair (i, j) is in bin b when
// e2[b] <= r^2 < e2[b + 1], r^2 = dx*dx + dy*dy + dz*dz in float64 with
// dx = x2[j] - (x[i] - shift) (compiled with --fmad=false: the CPU's rounding), and in mu
// bin m when mu2e[m] <= mu^2 < mu2e[m + 1] (the last bin closed), mu^2 = (d . los)^2 / r^2.
// Weights: own_i + own_j for an auto count (ordered pairs with an owned first member),
// 1 for a cross count.
//
// Histograms: with PC_SHARED each block accumulates its counts in shared memory
// (64-bit shared atomics; the bin edges staged there too) and adds them to the global
// histogram with one atomic per bin at the end; without it (the host check of the tests)
// every pair adds to the global histogram.

#if defined(__CUDACC__)
#define PC_DEVICE __device__ __forceinline__
PC_DEVICE void pc_add(unsigned long long* p, unsigned long long v) { atomicAdd(p, v); }
#else
#define PC_DEVICE inline
inline void pc_add(unsigned long long* p, unsigned long long v) { __sync_fetch_and_add(p, v); }
#endif

#ifndef PC_SHARED
#define PC_SHARED 0
#endif

PC_DEVICE long long pc_floor_div(long long a, long long n)
{
    return a >= 0 ? a / n : -((-a + n - 1) / n);
}

PC_DEVICE int pc_bin(const double* e, int n_edges, double v)
{
    // the largest b with e[b] <= v, for e[0] <= v < e[n_edges - 1]
    int lo = 0, hi = n_edges - 1;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (e[mid] <= v) lo = mid; else hi = mid;
    }
    return lo;
}

extern "C" __global__ void pair_count(
    const double* xs, const double* ys, const double* zs, const unsigned char* own,
    const long long* cell, long long n1,
    const double* xs2, const double* ys2, const double* zs2, const unsigned char* own2,
    const long long* start2, const double* geo, int k, double box, int autocorr,
    const double* e2_in, int n_edges, const double* mu2e_in, int nmu,
    double lx, double ly, double lz, unsigned long long* hist)
{
    const int nbins = n_edges - 1;
    const int width = nbins * nmu;
#if PC_SHARED
    extern __shared__ unsigned long long pc_shared[];
    unsigned long long* h = pc_shared;
    double* e2 = reinterpret_cast<double*>(pc_shared + width);
    double* mu2e = e2 + n_edges;
    for (int t = threadIdx.x; t < width; t += blockDim.x) h[t] = 0ull;
    for (int t = threadIdx.x; t < n_edges; t += blockDim.x) e2[t] = e2_in[t];
    for (int t = threadIdx.x; t <= nmu; t += blockDim.x) mu2e[t] = mu2e_in[t];
    __syncthreads();
#else
    unsigned long long* h = hist;
    const double* e2 = e2_in;
    const double* mu2e = mu2e_in;
#endif
    const long long nx = (long long)geo[12], ny = (long long)geo[13], nz = (long long)geo[14];
    const bool wrap[3] = {geo[15] != 0.0, geo[16] != 0.0, geo[17] != 0.0};
    const double rmin2 = e2[0], rmax2 = e2[n_edges - 1];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n1;
         i += (long long)gridDim.x * blockDim.x) {
        const long long a = cell[i];
        const long long ax = a / (ny * nz), ay = (a / nz) % ny, az = a % nz;
        const unsigned long long wi = own[i];
        for (int ox = -k; ox <= k; ++ox) {
            if (autocorr && ox < 0) continue;
            long long tx = ax + ox;
            double sx = 0.0;
            if (wrap[0]) {
                const long long p = pc_floor_div(tx, nx);
                sx = box * (double)p;
                tx -= p * nx;
            } else if (tx < 0 || tx >= nx) {
                continue;
            }
            for (int oy = -k; oy <= k; ++oy) {
                if (autocorr && ox == 0 && oy < 0) continue;
                long long ty = ay + oy;
                double sy = 0.0;
                if (wrap[1]) {
                    const long long p = pc_floor_div(ty, ny);
                    sy = box * (double)p;
                    ty -= p * ny;
                } else if (ty < 0 || ty >= ny) {
                    continue;
                }
                const int oz0 = (autocorr && ox == 0 && oy == 0) ? 0 : -k;
                for (int oz = oz0; oz <= k; ++oz) {
                    long long tz = az + oz;
                    double sz = 0.0;
                    if (wrap[2]) {
                        const long long p = pc_floor_div(tz, nz);
                        sz = box * (double)p;
                        tz -= p * nz;
                    } else if (tz < 0 || tz >= nz) {
                        continue;
                    }
                    const long long c = (tx * ny + ty) * nz + tz;
                    long long j0 = start2[c];
                    const long long j1 = start2[c + 1];
                    if (autocorr && ox == 0 && oy == 0 && oz == 0) j0 = i + 1;
                    const double xi = xs[i] - sx, yi = ys[i] - sy, zi = zs[i] - sz;
                    for (long long j = j0; j < j1; ++j) {
                        const double dx = xs2[j] - xi;
                        const double dy = ys2[j] - yi;
                        const double dz = zs2[j] - zi;
                        const double r2 = dx * dx + dy * dy + dz * dz;
                        if (!(r2 >= rmin2 && r2 < rmax2)) continue;
                        const unsigned long long w = autocorr ? wi + own2[j] : 1ull;
                        if (w == 0ull) continue;
                        const int b = pc_bin(e2, n_edges, r2);
                        int m = 0;
                        if (nmu > 1) {
                            double q = 0.0;
                            if (r2 > 0.0) {
                                const double d = dx * lx + dy * ly + dz * lz;
                                q = d * d / r2;
                                if (q > 1.0) q = 1.0;
                            }
                            if (q < mu2e[0] || q > mu2e[nmu]) continue;
                            m = pc_bin(mu2e, nmu + 1, q);
                            if (q >= mu2e[nmu]) m = nmu - 1;  // the last bin is closed
                        }
                        pc_add(h + (long long)b * nmu + m, w);
                    }
                }
            }
        }
    }
#if PC_SHARED
    __syncthreads();
    for (int t = threadIdx.x; t < width; t += blockDim.x)
        if (h[t]) pc_add(hist + t, h[t]);
#endif
}
