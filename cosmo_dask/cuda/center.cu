// Potential of every particle due to its own segment (cosmo_dask.halos.center_kernels_gpu):
// one block of BLOCK threads per tile of a segment. Defines: REAL ("double" or "float"),
// SEG_POT (the kernel's name: seg_pot_f64 or seg_pot_f32), BLOCK (threads per block).
#include "periodic.cuh"
#include "softening.cuh"
extern "C" __global__ void __launch_bounds__(BLOCK)
SEG_POT(const REAL* __restrict__ x, const REAL* __restrict__ y,
        const REAL* __restrict__ z, const double* __restrict__ mass,
        const long long* __restrict__ item_lo, const long long* __restrict__ item_hi,
        const long long* __restrict__ item_i0,
        const REAL box, const int periodic, const REAL eps2, const double G,
        double* __restrict__ pot)
{
    __shared__ REAL sx[BLOCK];
    __shared__ REAL sy[BLOCK];
    __shared__ REAL sz[BLOCK];
    __shared__ double sm[BLOCK];

    const long long item = blockIdx.x;
    const long long lo = item_lo[item];
    const long long hi = item_hi[item];
    const long long i = item_i0[item] + threadIdx.x;
    const bool active = i < hi;
    const REAL inv_box = periodic ? (REAL)1 / box : (REAL)0;

    REAL xi = 0, yi = 0, zi = 0;
    if (active) {
        xi = x[i];
        yi = y[i];
        zi = z[i];
    }
    double acc = 0.0;
    for (long long c0 = lo; c0 < hi; c0 += BLOCK) {
        const long long j = c0 + threadIdx.x;
        if (j < hi) {
            sx[threadIdx.x] = x[j];
            sy[threadIdx.x] = y[j];
            sz[threadIdx.x] = z[j];
            sm[threadIdx.x] = mass[j];
        }
        __syncthreads();
        const int nc = (int)(hi - c0 < BLOCK ? hi - c0 : BLOCK);
        if (active) {
            const int self = (int)(i - c0);  // k of particle i in this chunk, if there
            for (int k = 0; k < nc; ++k) {
                REAL dx = sx[k] - xi;
                REAL dy = sy[k] - yi;
                REAL dz = sz[k] - zi;
                if (periodic) {
                    dx = cd_min_image(dx, box, inv_box);
                    dy = cd_min_image(dy, box, inv_box);
                    dz = cd_min_image(dz, box, inv_box);
                }
                const REAL s = dx * dx + dy * dy + dz * dz + eps2;
                const REAL inv = cd_rsqrt(s);
                // zero separation (eps = 0) and the particle itself contribute 0
                acc += (s > (REAL)0 && k != self) ? sm[k] * (double)inv : 0.0;
            }
        }
        __syncthreads();
    }
    if (active) pot[i] = -G * acc;
}

// Largest value of each segment of non-negative doubles (the halo catalog's r_max;
// cosmo_dask.halos.center_kernels_gpu.segment_max_gpu): one thread per value, an atomic
// max of its bits into out[seg[t]] (zeroed by the caller). For x >= 0 the order of the
// bit patterns is the order of the values, so the maximum is exact and independent of
// the threads' order.
extern "C" __global__ void seg_max_nonneg(const double* __restrict__ v,
                                          const long long* __restrict__ seg,
                                          const long long n,
                                          unsigned long long* __restrict__ out)
{
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride)
        atomicMax(out + seg[t], (unsigned long long)__double_as_longlong(v[t]));
}
