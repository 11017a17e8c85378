// cosmo_dask shared CUDA device math: softened pair factors (see cosmo_dask/cuda/__init__.py)
// Convention: a_i = -G sum_j m_j K (x_i - x_j), phi_i = -G sum_j m_j P.
// numba twins: cosmo_dask.gravity.softening_kernels.
#ifndef COSMO_DASK_SOFTENING_CUH
#define COSMO_DASK_SOFTENING_CUH

__device__ __forceinline__ float cd_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double cd_rsqrt(double x) { return rsqrt(x); }

// K = m inv^3 and P = m inv from inv = 1 / sqrt(s2): Plummer with s2 = r^2 + eps^2, the
// Newtonian pair (and the spline beyond its support) with s2 = r^2. m = 1 gives the
// factors per unit mass.
template <typename R>
__device__ __forceinline__ void cd_inv_kp(const R inv, const R m, R& K, R& P)
{
    const R minv = m * inv;
    K = minv * inv * inv;
    P = minv;
}

// Gadget-2 cubic spline of support h inside it: u = r / h in [0, 1), a = m / h and
// a3 = m / h^3 (m = 1: per unit mass). Beyond the support use cd_inv_kp with s2 = r^2.
template <typename R>
__device__ __forceinline__ void cd_spline_kp(const R u, const R a, const R a3, R& K, R& P)
{
    if (u < (R)0.5) {
        K = a3 * ((R)10.666666666667 + u * u * ((R)32.0 * u - (R)38.4));
        P = a * ((R)2.8 - u * u * ((R)5.333333333333 + u * u * ((R)6.4 * u - (R)9.6)));
    } else {
        const R u3 = u * u * u;
        K = a3 * ((R)21.333333333333 - (R)48.0 * u + (R)38.4 * u * u
                  - (R)10.666666666667 * u3 - (R)0.066666666667 / u3);
        P = -a * ((R)-3.2 + (R)0.066666666667 / u
                  + u * u * ((R)10.666666666667
                             + u * ((R)-16.0 + u * ((R)9.6 - (R)2.133333333333 * u))));
    }
}

#endif
