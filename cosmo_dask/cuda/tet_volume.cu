// Tetrahedron-cube volumes (cosmo_dask.density.tet_volume_gpu): one thread per
// (tetrahedron, cube) pair. Defines: REAL (the arithmetic type, "double" or "float").
typedef REAL real;
#include "tet_clip.cuh"

extern "C" __global__ void tet_cube_pairs(const real* tets, const double* los, const double* hs,
                                          long long nt, long long nc, real* out) {
    long long n = nt * nc;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < n;
         p += (long long)gridDim.x * blockDim.x) {
        long long t = p / nc, j = p - t * nc;
        Tet T;
        for (int q = 0; q < 12; ++q) T.v[q] = tets[12 * t + q];
        tet_setup(T);
        real lo[3] = {(real)los[3 * j], (real)los[3 * j + 1], (real)los[3 * j + 2]};
        real h = (real)hs[j];
        real w = fast_volume(T, lo, h);
        if (w < (real)0) w = slow_volume(T, lo, h);
        out[p] = w;
    }
}
