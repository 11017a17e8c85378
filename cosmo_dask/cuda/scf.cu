// Hernquist-Ostriker SCF expansion (cosmo_dask.expansion.scf_kernels_gpu). Defines: NMAX,
// LMAX, REAL ("double" or "float"); SCF_COEFF=1 with USE_SHARED (coefficient sums,
// kernel scf_coeff) or SCF_EVAL=1 with WHAT, COEF_SHARED (evaluation, kernel scf_eval).
typedef REAL real;
#define NL2 ((LMAX + 1) * (LMAX + 2) / 2)
#define NTERM ((NMAX + 1) * NL2)
#define IDX(l, m) ((l) * ((l) + 1) / 2 + (m))
#define SQRT4PI ((real)3.5449077018110318)

__device__ __forceinline__ void angles(real x, real y, real z, real &r, real &ct, real &st,
                                       real &cp, real &sp) {
    real rho2 = x * x + y * y;
    real rho = sqrt(rho2);
    r = sqrt(rho2 + z * z);
    if (r > (real)0) { ct = z / r; st = rho / r; } else { ct = (real)1; st = (real)0; }
    if (rho > (real)0) { cp = x / rho; sp = y / rho; } else { cp = (real)1; sp = (real)0; }
}

__device__ __forceinline__ void qbar(real ct, real *q) {
    q[0] = (real)0.28209479177387814;
#pragma unroll
    for (int m = 0; m <= LMAX; ++m) {
        if (m > 0) q[IDX(m, m)] = -sqrt((real)(2 * m + 1) / (real)(2 * m)) * q[IDX(m - 1, m - 1)];
        if (m + 1 <= LMAX) q[IDX(m + 1, m)] = ct * sqrt((real)(2 * m + 3)) * q[IDX(m, m)];
#pragma unroll
        for (int l = m + 2; l <= LMAX; ++l) {
            real a = sqrt((real)(4 * l * l - 1) / (real)(l * l - m * m));
            real b = sqrt((real)((l - 1) * (l - 1) - m * m) / (real)(4 * (l - 1) * (l - 1) - 1));
            q[IDX(l, m)] = a * (ct * q[IDX(l - 1, m)] - b * q[IDX(l - 2, m)]);
        }
    }
}

__device__ __forceinline__ void cos_sin_m(real cp, real sp, real *cm, real *sm) {
    cm[0] = (real)1; sm[0] = (real)0;
#pragma unroll
    for (int m = 1; m <= LMAX; ++m) {
        cm[m] = cm[m - 1] * cp - sm[m - 1] * sp;
        sm[m] = sm[m - 1] * cp + cm[m - 1] * sp;
    }
}
#if SCF_COEFF
__device__ __forceinline__ real warp_sum(real v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void scf_coeff(const real *__restrict__ pos, const real *__restrict__ mass,
                                     long long n, real inv_rs, const real *__restrict__ anl_g,
                                     double *__restrict__ out) {
    extern __shared__ double sh[];
#if USE_SHARED
    double *acc = sh;
    real *anl = (real *)(sh + 4 * NTERM);
#else
    double *acc = out;
    real *anl = (real *)sh;
#endif
    for (int i = threadIdx.x; i < (NMAX + 1) * (LMAX + 1); i += blockDim.x) anl[i] = anl_g[i];
#if USE_SHARED
    for (int i = threadIdx.x; i < 4 * NTERM; i += blockDim.x) acc[i] = 0.0;
#endif
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long nloop = ((n + stride - 1) / stride) * stride;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < nloop; k += stride) {
        real x = (real)1, y = (real)0, z = (real)0, w = (real)0;
        if (k < n) { x = pos[3 * k]; y = pos[3 * k + 1]; z = pos[3 * k + 2]; w = mass[k]; }
        real r, ct, st, cp, sp;
        angles(x, y, z, r, ct, st, cp, sp);
        real q[NL2];
        qbar(ct, q);
        real cm[LMAX + 1], sm[LMAX + 1];
        cos_sin_m(cp, sp, cm, sm);
        const real s = r * inv_rs;
        const real u = (real)1 / ((real)1 + s);
        const real xi = (s - (real)1) * u;
        const real su2 = s * u * u;
        real base = u;
#pragma unroll 1
        for (int l = 0; l <= LMAX; ++l) {
            if (l > 0) base *= su2;
            const real alpha = (real)(2 * l) + (real)1.5;
            real ph[NMAX + 1];
            real c1 = 0, c2 = 0;
#pragma unroll
            for (int nn = 0; nn <= NMAX; ++nn) {
                real c;
                if (nn == 0) c = (real)1;
                else if (nn == 1) c = (real)2 * alpha * xi;
                else c = ((real)2 * ((real)nn + alpha - (real)1) * xi * c1
                          - ((real)nn + (real)2 * alpha - (real)2) * c2) / (real)nn;
                c2 = c1; c1 = c;
                ph[nn] = -SQRT4PI * base * c * anl[nn * (LMAX + 1) + l];
            }
            real stm = (real)1;
#pragma unroll 1
            for (int m = 0; m <= l; ++m) {
                if (m > 0) stm *= st;
                const real yv = q[IDX(l, m)] * stm * w * (m == 0 ? (real)1 : (real)2);
                const real yc = yv * cm[m], ys = yv * sm[m];
#pragma unroll
                for (int nn = 0; nn <= NMAX; ++nn) {
                    const real a = ph[nn] * yc, b = ph[nn] * ys;
                    const real ra = warp_sum(a), rb = warp_sum(b);
                    const real raa = warp_sum(a * a), rbb = warp_sum(b * b);
                    if (lane == 0) {
                        const int t = nn * NL2 + IDX(l, m);
                        atomicAdd(acc + t, (double)ra);
                        atomicAdd(acc + NTERM + t, (double)rb);
                        atomicAdd(acc + 2 * NTERM + t, (double)raa);
                        atomicAdd(acc + 3 * NTERM + t, (double)rbb);
                    }
                }
            }
        }
    }
#if USE_SHARED
    __syncthreads();
    for (int i = threadIdx.x; i < 4 * NTERM; i += blockDim.x)
        out[(long long)blockIdx.x * 4 * NTERM + i] = acc[i];
#endif
}
#endif
#if SCF_EVAL
extern "C" __global__ void scf_eval(const real *__restrict__ pos, long long n, real inv_rs,
                                    const real *__restrict__ coef_g, real scale,
                                    real *__restrict__ out) {
    // S (NTERM), T (NTERM), K_nl ((NMAX+1)(LMAX+1))
#if COEF_SHARED
    extern __shared__ double sh_d[];
    real *cs = (real *)sh_d;
    const int total = 2 * NTERM + (NMAX + 1) * (LMAX + 1);
    for (int i = threadIdx.x; i < total; i += blockDim.x) cs[i] = coef_g[i];
    __syncthreads();
#else
    const real *__restrict__ cs = coef_g;
#endif
    const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    const real *Sc = cs, *Tc = cs + NTERM, *kn = cs + 2 * NTERM;
    real r, ct, st, cp, sp;
    angles(pos[3 * k], pos[3 * k + 1], pos[3 * k + 2], r, ct, st, cp, sp);
    real q[NL2];
    qbar(ct, q);
    real cm[LMAX + 1], sm[LMAX + 1];
    cos_sin_m(cp, sp, cm, sm);
    const real s = r * inv_rs;
    const real u = (real)1 / ((real)1 + s);
    const real xi = (s - (real)1) * u;
    const real su2 = s * u * u;
    real base = u, sl1 = u * u * u;
    real v = 0, v0 = 0, gr = 0, gt = 0, gp = 0;
#pragma unroll 1
    for (int l = 0; l <= LMAX; ++l) {
        if (l > 0) base *= su2;
        if (l > 1) sl1 *= su2;
        const real alpha = (real)(2 * l) + (real)1.5;
        const real dbase = (l == 0) ? -u * u : sl1 * ((real)l - (real)(2 * l + 1) * s * u);
        real yv[LMAX + 1], dy[LMAX + 1], yos[LMAX + 1];
        real stm1 = (real)1;
#pragma unroll
        for (int m = 0; m <= l; ++m) {
            if (m > 1) stm1 *= st;
            if (m == 0) {
                yv[0] = q[IDX(l, 0)];
                dy[0] = (l > 0) ? sqrt((real)(l * (l + 1))) * q[IDX(l, (l > 0 ? 1 : 0))] * st
                                : (real)0;
                yos[0] = (real)0;
            } else {
                yos[m] = q[IDX(l, m)] * stm1;
                yv[m] = yos[m] * st;
                const real qlm1 = (l > m) ? q[IDX(l - 1, m)] : (real)0;
                const real c = sqrt((real)((2 * l + 1) * (l - m) * (l + m)) / (real)(2 * l - 1));
                dy[m] = stm1 * ((real)l * ct * q[IDX(l, m)] - c * qlm1);
            }
        }
        real c1 = 0, c2 = 0, g1 = 0, g2 = 0;
#pragma unroll
        for (int nn = 0; nn <= NMAX; ++nn) {
            real c;
            if (nn == 0) c = (real)1;
            else if (nn == 1) c = (real)2 * alpha * xi;
            else c = ((real)2 * ((real)nn + alpha - (real)1) * xi * c1
                      - ((real)nn + (real)2 * alpha - (real)2) * c2) / (real)nn;
            c2 = c1; c1 = c;
            const real ph = -SQRT4PI * base * c;
#if WHAT == 1
            real dc = 0;
            if (nn > 0) {
                const int j = nn - 1;
                real g;
                if (j == 0) g = (real)1;
                else if (j == 1) g = (real)2 * (alpha + (real)1) * xi;
                else g = ((real)2 * ((real)j + alpha) * xi * g1 - ((real)j + (real)2 * alpha) * g2)
                         / (real)j;
                g2 = g1; g1 = g;
                dc = (real)2 * alpha * g;
            }
            const real dph = -SQRT4PI * (dbase * c + base * (real)2 * u * u * dc);
#endif
            const real phs = (l > 0) ? -SQRT4PI * sl1 * c : (real)0;
#pragma unroll
            for (int m = 0; m <= l; ++m) {
                const int t = nn * NL2 + IDX(l, m);
                const real Sv = Sc[t], Tv = Tc[t];
                const real sc = Sv * cm[m] + Tv * sm[m];
#if WHAT == 0
                v += ph * yv[m] * sc;
#elif WHAT == 1
                if (l > 0 || s > (real)0) gr += dph * yv[m] * sc;  // r = 0: see CPU module
                if (l > 0) {
                    gt += phs * dy[m] * sc;
                    if (m > 0) gp += phs * yos[m] * (real)m * (Tv * cm[m] - Sv * sm[m]);
                }
#else
                const real kk = kn[nn * (LMAX + 1) + l] * (real)(-0.15915494309189535);
                if (l == 0) v0 += kk * ph * u * u * yv[m] * sc;
                else v += kk * phs * u * u * yv[m] * sc;
#endif
            }
        }
    }
#if WHAT == 1
    out[3 * k] = scale * (st * cp * gr + ct * cp * gt - sp * gp);
    out[3 * k + 1] = scale * (st * sp * gr + ct * sp * gt + cp * gp);
    out[3 * k + 2] = scale * (ct * gr - st * gt);
#elif WHAT == 0
    out[k] = scale * v;
#else
    real d;
    if (s > (real)0) d = v + v0 / s;
    else if (v0 != (real)0) d = v0 / s;  // s == 0: +-inf (the l = 0 cusp)
    else d = v;
    out[k] = scale * d;
#endif
}
#endif
