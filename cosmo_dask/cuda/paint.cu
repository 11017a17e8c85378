// Mass assignment onto a periodic mesh (cosmo_dask.density.paint_kernels_gpu). Defines:
// ORDER (1 NGP, 2 CIC, 3 TSC, 4 PCS), POS_T, MASS_T, MESH_T ("double" or "float").
#include "periodic.cuh"
extern "C" __global__ void paint(const POS_T* __restrict__ pos, const MASS_T* __restrict__ mass,
                                 const int use_array, const double mass_scalar,
                                 const long long m, const long long n, const double inv_h,
                                 const double off, MESH_T* __restrict__ mesh,
                                 unsigned long long* __restrict__ bad,
                                 const long long x_lo, const long long nx)
{
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= m) return;
    double u[3];
    long long i0[3];
    double w[3][4];
    const double fn = (double)n;
    for (int a = 0; a < 3; ++a) {
        double x = (double)pos[3 * p + a] * inv_h + off;
        if (!isfinite(x)) { atomicAdd(bad, 1ULL); return; }
        u[a] = cd_wrap_box(x, fn);
    }
    for (int a = 0; a < 3; ++a) {
#if ORDER == 1
        i0[a] = (long long)floor(u[a] + 0.5);
        w[a][0] = 1.0;
#elif ORDER == 2
        long long i = (long long)floor(u[a]);
        double f = u[a] - (double)i;
        w[a][0] = 1.0 - f; w[a][1] = f;
        i0[a] = i;
#elif ORDER == 3
        long long i = (long long)floor(u[a] + 0.5);
        double d = u[a] - (double)i;
        w[a][0] = 0.5 * (0.5 - d) * (0.5 - d);
        w[a][1] = 0.75 - d * d;
        w[a][2] = 0.5 * (0.5 + d) * (0.5 + d);
        i0[a] = i - 1;
#else
        long long i = (long long)floor(u[a]);
        double f = u[a] - (double)i, g = 1.0 - f;
        w[a][0] = g * g * g / 6.0;
        w[a][1] = (4.0 - 6.0 * f * f + 3.0 * f * f * f) / 6.0;
        w[a][2] = (4.0 - 6.0 * g * g + 3.0 * g * g * g) / 6.0;
        w[a][3] = f * f * f / 6.0;
        i0[a] = i - 1;
#endif
    }
    const double mp = use_array ? (double)mass[p] : mass_scalar;
    for (int a = 0; a < ORDER; ++a) {
        long long lx = (i0[0] + a + n) % n - x_lo;  // i0 >= -1: keep % non-negative
        if (lx < 0 || lx >= nx) continue;
        long long jx = lx * n;
        double ma = mp * w[0][a];
        for (int b = 0; b < ORDER; ++b) {
            long long jxy = (jx + (i0[1] + b + n) % n) * n;
            double mab = ma * w[1][b];
            for (int c = 0; c < ORDER; ++c) {
                atomicAdd(&mesh[jxy + (i0[2] + c + n) % n], (MESH_T)(mab * w[2][c]));
            }
        }
    }
}
