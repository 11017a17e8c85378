// cosmo_dask shared CUDA device math: periodic boundaries (see cosmo_dask/cuda/__init__.py)
#ifndef COSMO_DASK_PERIODIC_CUH
#define COSMO_DASK_PERIODIC_CUH

__device__ __forceinline__ float cd_rint(float x) { return rintf(x); }
__device__ __forceinline__ double cd_rint(double x) { return rint(x); }

// Minimum image of a separation d along an axis of period box (inv_box = 1 / box, a
// multiply instead of a division): d - box * rint(d / box), in [-box/2, box/2].
template <typename R>
__device__ __forceinline__ R cd_min_image(const R d, const R box, const R inv_box)
{
    return d - box * cd_rint(d * inv_box);
}

// The same where box <= 0 means an open axis (d unchanged).
template <typename R>
__device__ __forceinline__ R cd_min_image_if(const R d, const R box, const R inv_box)
{
    return box > (R)0 ? cd_min_image(d, box, inv_box) : d;
}

// A coordinate taken into [0, L) when it lies outside: x - L * floor(x / L). Rounding can
// give exactly L for x just below 0; callers that need [0, L) strictly test for it.
__device__ __forceinline__ double cd_wrap_box(double x, const double L)
{
    if (x < 0.0 || x >= L) x -= L * floor(x / L);
    return x;
}

#endif
