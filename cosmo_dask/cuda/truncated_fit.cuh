// ---- cosmo_dask.gravity.truncated: T(x) and erfc(x) from exp(-x^2) and a fit ----
// cd_trunc_fit(x, T, ec, e): T(x), erfc(x) and exp(-x^2). float: E(x) = exp(x^2) erfc(x)
// from the degree-12 polynomial ERFCX_FIT in u = x - 3/2 on [0, 3] (exact functions
// beyond); double: exact functions.
// The includer defines the float coefficients CD_ERFCX_FIT_0 .. CD_ERFCX_FIT_12 (c_k of
// u^k): cosmo_dask.gravity.truncated.fit_defines(), generated from ERFCX_FIT.
#ifndef CD_TRUNC_FIT_DEFINED
#define CD_TRUNC_FIT_DEFINED
#ifndef CD_ERFCX_FIT_12
#error "truncated_fit.cuh needs CD_ERFCX_FIT_0 .. CD_ERFCX_FIT_12 (truncated.fit_defines())"
#endif
__device__ __forceinline__ void cd_trunc_fit(const float x, float& T, float& ec, float& e) {
    if (x > 3.0f) {
        ec = erfcf(x);
        e = expf(-x * x);
        T = ec + 1.1283791670955126f * x * e;
        return;
    }
    const float u = x - 1.5f;
    float E = CD_ERFCX_FIT_12;
    E = fmaf(E, u, CD_ERFCX_FIT_11);
    E = fmaf(E, u, CD_ERFCX_FIT_10);
    E = fmaf(E, u, CD_ERFCX_FIT_9);
    E = fmaf(E, u, CD_ERFCX_FIT_8);
    E = fmaf(E, u, CD_ERFCX_FIT_7);
    E = fmaf(E, u, CD_ERFCX_FIT_6);
    E = fmaf(E, u, CD_ERFCX_FIT_5);
    E = fmaf(E, u, CD_ERFCX_FIT_4);
    E = fmaf(E, u, CD_ERFCX_FIT_3);
    E = fmaf(E, u, CD_ERFCX_FIT_2);
    E = fmaf(E, u, CD_ERFCX_FIT_1);
    E = fmaf(E, u, CD_ERFCX_FIT_0);
    e = exp2f(-(x * x) * 1.4426950408889634f);
    ec = e * E;
    T = e * fmaf(1.1283791670955126f, x, E);
}
__device__ __forceinline__ void cd_trunc_fit(const double x, double& T, double& ec,
                                             double& e) {
    ec = erfc(x);
    e = exp(-x * x);
    T = ec + 1.1283791670955126 * x * e;
}
#endif
