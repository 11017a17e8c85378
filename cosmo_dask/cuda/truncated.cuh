// ---- cosmo_dask.gravity.truncated: T(x) = erfc(x) + 2x/sqrt(pi) exp(-x^2) ----
// Table: 512 nodes x_n = n*h, h = 3/511, row n = T^(k)(x_n)/k!, k = 0..4 (stride 5).
// cd_trunc_T<real, level>(x, tab): level 0..4 -> table (x > 3 -> exact); level < 0 -> exact.
// cd_erfc(x): erfc in the precision of x. Pass tab in global memory (read via __ldg).
#ifndef CD_TRUNCATED_DEFINED
#define CD_TRUNCATED_DEFINED
__device__ __forceinline__ float cd_erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double cd_erfc(double x) { return erfc(x); }
__device__ __forceinline__ float cd_exp(float x) { return expf(x); }
__device__ __forceinline__ double cd_exp(double x) { return exp(x); }

template <typename cd_real>
__device__ __forceinline__ cd_real cd_trunc_T_exact(cd_real x) {
    return cd_erfc(x) + (cd_real)1.1283791670955126 * x * cd_exp(-x * x);
}

template <typename cd_real, int cd_level>
__device__ __forceinline__ cd_real cd_trunc_T(cd_real x, const cd_real* __restrict__ tab) {
    if (cd_level < 0 || x > (cd_real)3) return cd_trunc_T_exact<cd_real>(x);
    int n = (int)(x * (cd_real)170.33333333333334 + (cd_real)0.5);
    n = n > 511 ? 511 : n;
    const cd_real d = x - (cd_real)n * (cd_real)(3.0 / 511.0);
    const cd_real* row = tab + 5 * n;
    cd_real out = __ldg(row + (cd_level < 0 ? 0 : cd_level));
#pragma unroll
    for (int k = (cd_level < 0 ? 0 : cd_level) - 1; k >= 0; --k) out = __ldg(row + k) + d * out;
    return out;
}
#endif
