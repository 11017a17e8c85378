// Periodic PM gravity on mesh slabs (cosmo_dask.gravity.pm_kernels_gpu): the Green's
// function on a k-space slab, the CIC interpolation of real slabs, the 4-point
// difference of a real potential slab. Defines: REAL_T
// (k-space slab), POS_T (positions), MESH_T (meshes): "double" or "float".
#include "periodic.cuh"

// (i, j, k) of flat index t of a C-ordered (n0, n1, n2) array of `total` elements: 32-bit
// divisions when the total fits them (several times cheaper than 64-bit ones)
__device__ __forceinline__ void pm_index3(const long long t, const long long total,
                                          const long long n1, const long long n2,
                                          long long* i, long long* j, long long* k)
{
    if (total <= 0xffffffffLL) {
        const unsigned int u = (unsigned int)t, u2 = (unsigned int)n2;
        const unsigned int row = u / u2;
        *k = u - row * u2;
        *j = row % (unsigned int)n1;
        *i = row / (unsigned int)n1;
    } else {
        *k = t % n2;
        *j = (t / n2) % n1;
        *i = t / (n2 * n1);
    }
}

// fk, out: a complex k-space slab (n0, n1, nk) as interleaved (re, im) pairs of REAL_T
// axis 0, 1, 2: times -i d[index along axis] (one acceleration component), -1: the potential
extern "C" __global__ void green(const REAL_T* __restrict__ fk, REAL_T* __restrict__ out,
                                 const long long n0, const long long n1, const long long nk,
                                 const double* __restrict__ k2x, const double* __restrict__ k2y,
                                 const double* __restrict__ k2z, const double* __restrict__ gx,
                                 const double* __restrict__ gy, const double* __restrict__ gz,
                                 const double* __restrict__ d, const int axis,
                                 const double scale)
{
    const long long total = n0 * n1 * nk;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    long long i, j, lz;
    pm_index3(t, total, n1, nk, &i, &j, &lz);
    const double k2 = (k2x[i] + k2y[j]) + k2z[lz];
    double f = 0.0;
    if (k2 != 0.0) f = scale * (gx[i] * gy[j]) * gz[lz] / k2;
    const double re = (double)fk[2 * t], im = (double)fk[2 * t + 1];
    if (axis < 0) {
        out[2 * t] = (REAL_T)(re * f);
        out[2 * t + 1] = (REAL_T)(im * f);
    } else {                                   // (re + i im) (-i f d) = f d (im - i re)
        f *= d[axis == 0 ? i : (axis == 1 ? j : lz)];
        out[2 * t] = (REAL_T)(im * f);
        out[2 * t + 1] = (REAL_T)(-re * f);
    }
}

// c (<= 4) mesh slabs of planes x_lo .. x_lo + nx - 1, each (nx, n, n) C order
extern "C" __global__ void interp(const POS_T* __restrict__ pos,
                                  const MESH_T* __restrict__ m0, const MESH_T* __restrict__ m1,
                                  const MESH_T* __restrict__ m2, const MESH_T* __restrict__ m3,
                                  const long long m, const long long n, const int c,
                                  const double inv_h, const double off,
                                  const long long x_lo, const long long nx, const int add,
                                  double* __restrict__ out)
{
    const MESH_T* meshes[4] = {m0, m1, m2, m3};
    const double fn = (double)n;
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < m; p += stride) {
        long long i0[3];
        double w[3][2];
        for (int a = 0; a < 3; ++a) {
            double u = (double)pos[3 * p + a] * inv_h + off;
            u = cd_wrap_box(u, fn);
            long long i = (long long)floor(u);
            double f = u - (double)i;
            w[a][0] = 1.0 - f; w[a][1] = f;
            i0[a] = i;
        }
        double acc[4] = {0.0, 0.0, 0.0, 0.0};
        for (int a = 0; a < 2; ++a) {
            long long lx = (i0[0] + a + n) % n - x_lo;
            if (lx < 0 || lx >= nx) continue;
            long long jx = lx * n;
            for (int b = 0; b < 2; ++b) {
                long long jxy = (jx + (i0[1] + b + n) % n) * n;
                double wab = w[0][a] * w[1][b];
                for (int cc = 0; cc < 2; ++cc) {
                    long long g = jxy + (i0[2] + cc + n) % n;
                    double wt = wab * w[2][cc];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {  // constant indices: acc stays in registers
                        if (q < c) acc[q] += wt * (double)meshes[q][g];
                    }
                }
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // add: the earlier values plus the sums (from zero)
            if (q < c) out[p * c + q] = add ? out[p * c + q] + acc[q] : acc[q];
        }
    }  // grid-stride (one pass with the launch of cic_interpolate_gpu)
}

// One acceleration component of a real potential slab (nx, n, n), planes x_lo .. x_lo + nx - 1
// of an n^3 mesh, by the 4-point difference along `axis`:
// out = coef (8 (phi[+1] - phi[-1]) - (phi[+2] - phi[-2])), coef = -1 / (12 H), in double;
// lo, hi: the two planes before the slab (x_lo - 2, x_lo - 1) and after it, each (2, ny, nz)
// (periodic); axes 1 and 2 wrap inside the slab.
extern "C" __global__ void fd4(const MESH_T* __restrict__ phi, const MESH_T* __restrict__ lo,
                               const MESH_T* __restrict__ hi, const long long nx,
                               const long long ny, const long long nz, const int axis,
                               const double coef, MESH_T* __restrict__ out)
{
    // a 3-D launch: planes by blockIdx.z, rows by blockIdx.y, points of a row by x (each
    // grid-stride): no index decomposition (a little faster than the flat index; still
    // about 3x a copy of the mesh: benchmarks/RESULTS.md, one GPU). The four neighbours'
    // addresses by selects and their loads together was slower (the same place)
    const long long plane = ny * nz;
    for (long long i = blockIdx.z; i < nx; i += gridDim.z) {
        for (long long j = blockIdx.y; j < ny; j += gridDim.y) {
            const long long row = i * plane + j * nz;
            for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < nz;
                 k += (long long)blockDim.x * gridDim.x) {
                double v[4];  // phi at offsets +1, -1, +2, -2 along the axis
                const int offs[4] = {1, -1, 2, -2};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const long long o = offs[q];
                    if (axis == 0) {
                        const long long ii = i + o;
                        const long long rest = j * nz + k;
                        if (ii < 0) v[q] = (double)lo[(ii + 2) * plane + rest];
                        else if (ii >= nx) v[q] = (double)hi[(ii - nx) * plane + rest];
                        else v[q] = (double)phi[ii * plane + rest];
                    } else if (axis == 1) {  // periodic by adds, no 64-bit modulo
                        long long jj = j + o;  // (loops: an axis of 1 or 2 points)
                        while (jj < 0) jj += ny;
                        while (jj >= ny) jj -= ny;
                        v[q] = (double)phi[i * plane + jj * nz + k];
                    } else {
                        long long kk = k + o;
                        while (kk < 0) kk += nz;
                        while (kk >= nz) kk -= nz;
                        v[q] = (double)phi[row + kk];
                    }
                }
                out[row + k] = (MESH_T)((8.0 * (v[0] - v[1]) - (v[2] - v[3])) * coef);
            }
        }
    }
}
