// Multipole expansion terms and evaluation (cosmo_dask.expansion.mex_kernels_gpu).
// Defines: REAL (the storage type real_t, "double" or "float"), LMAX.
typedef REAL real_t;
#define K ((LMAX + 1) * (LMAX + 1))

__device__ __forceinline__ void solid(double x, double y, double z, double* T) {
    const double r2 = x * x + y * y + z * z;
    T[0] = 1.0;
    double re = 1.0, im = 0.0;
#pragma unroll
    for (int m = 1; m <= LMAX; ++m) {
        const double f = (m == 1) ? 1.0 : sqrt((2.0 * m - 1.0) / (2.0 * m));
        const double nre = (re * x - im * y) * f;
        im = (re * y + im * x) * f;
        re = nre;
        const int k = m * m + 2 * m - 1;
        T[k] = re;
        T[k + 1] = im;
    }
#pragma unroll
    for (int m = 0; m < LMAX; ++m) {
#pragma unroll
        for (int l = m; l < LMAX; ++l) {
            const double d = 1.0 / sqrt((l + 1.0 - m) * (l + 1.0 + m));
            const double a = (2.0 * l + 1.0) * z * d;
            const double b = sqrt((l + m) * (l - m + 0.0)) * r2 * d;
            if (m == 0) {
                const double t0 = (l > 0) ? T[(l - 1) * (l - 1)] : 0.0;
                T[(l + 1) * (l + 1)] = a * T[l * l] - b * t0;
            } else {
                const int k1 = l * l + 2 * m - 1;
                const int k2 = (l + 1) * (l + 1) + 2 * m - 1;
                if (l > m) {
                    const int k0 = (l - 1) * (l - 1) + 2 * m - 1;
                    T[k2] = a * T[k1] - b * T[k0];
                    T[k2 + 1] = a * T[k1 + 1] - b * T[k0 + 1];
                } else {
                    T[k2] = a * T[k1];
                    T[k2 + 1] = a * T[k1 + 1];
                }
            }
        }
    }
}

extern "C" __global__ void mex_terms(const real_t* __restrict__ pos,
                                     const real_t* __restrict__ mass, long long n,
                                     double eps2, double* __restrict__ reg,
                                     double* __restrict__ irr) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const double x = (double)pos[3 * i], y = (double)pos[3 * i + 1],
                     z = (double)pos[3 * i + 2];
        const double mi = (double)mass[i];
        double T[K];
        solid(x, y, z, T);
        const double s = x * x + y * y + z * z + eps2;
        const bool ok = s > 0.0;
        double f = ok ? mi / sqrt(s) : 0.0;
        const double inv_s = ok ? 1.0 / s : 0.0;
#pragma unroll
        for (int l = 0; l <= LMAX; ++l) {
#pragma unroll
            for (int k = l * l; k < (l + 1) * (l + 1); ++k) {
                reg[k * n + i] = mi * T[k];
                irr[k * n + i] = f * T[k];
            }
            f *= inv_s;
        }
    }
}

extern "C" __global__ void mex_eval(const real_t* __restrict__ pos,
                                    const real_t* __restrict__ Q,
                                    const real_t* __restrict__ P,
                                    const long long* __restrict__ iq,
                                    const long long* __restrict__ ip, long long n,
                                    double eps2, real_t* __restrict__ acc_out,
                                    real_t* __restrict__ phi_out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const double x = (double)pos[3 * i], y = (double)pos[3 * i + 1],
                     z = (double)pos[3 * i + 2];
        double T[K];
        solid(x, y, z, T);
        const double s = x * x + y * y + z * z + eps2;
        const bool inner = s > 0.0;
        double f = inner ? 1.0 / sqrt(s) : 0.0;
        const double inv_s = inner ? 1.0 / s : 0.0;
        const real_t* q = Q + iq[i] * (long long)K;
        const real_t* p = P + ip[i] * (long long)K;
        double phi = 0.0, gx = 0.0, gy = 0.0, gz = 0.0, radial = 0.0;
#pragma unroll
        for (int l = 0; l <= LMAX; ++l) {
#pragma unroll
            for (int m = 0; m <= l; ++m) {
                double qr, qi, pr, pi, tr, ti;
                if (m == 0) {
                    const int k = l * l;
                    qr = (double)q[k]; qi = 0.0; pr = (double)p[k]; pi = 0.0;
                    tr = T[k]; ti = 0.0;
                } else {
                    const int k = l * l + 2 * m - 1;
                    qr = (double)q[k]; qi = (double)q[k + 1];
                    pr = (double)p[k]; pi = (double)p[k + 1];
                    tr = T[k]; ti = T[k + 1];
                }
                const double qt = qr * tr + qi * ti;
                phi += qt * f + pr * tr + pi * ti;
                radial -= (2.0 * l + 1.0) * f * inv_s * qt;
                if (l == 0) continue;
                const double wr = qr * f + pr;
                const double wi = -(qi * f + pi);
                if (m < l) {
                    const double c = sqrt((l + m) * (l - m + 0.0));
                    double dr, di;
                    if (m == 0) {
                        dr = c * T[(l - 1) * (l - 1)]; di = 0.0;
                    } else {
                        const int kk = (l - 1) * (l - 1) + 2 * m - 1;
                        dr = c * T[kk]; di = c * T[kk + 1];
                    }
                    gz += wr * dr - wi * di;
                }
                double apr = 0.0, api = 0.0;
                if (m + 1 <= l - 1) {
                    const double c = -sqrt((m == 0 ? 1.0 : 2.0) * 0.5 * (l - m) * (l - m - 1.0));
                    const int kk = (l - 1) * (l - 1) + 2 * (m + 1) - 1;
                    apr = c * T[kk]; api = c * T[kk + 1];
                }
                double amr, ami;
                if (m == 0) {
                    amr = apr; ami = -api;
                } else {
                    const double c = sqrt(2.0 * (l + m) * (l + m - 1.0) / (m == 1 ? 1.0 : 2.0));
                    if (m == 1) {
                        amr = c * T[(l - 1) * (l - 1)]; ami = 0.0;
                    } else {
                        const int kk = (l - 1) * (l - 1) + 2 * (m - 1) - 1;
                        amr = c * T[kk]; ami = c * T[kk + 1];
                    }
                }
                gx += 0.5 * (wr * (apr + amr) - wi * (api + ami));
                gy += 0.5 * (wr * (api - ami) + wi * (apr - amr));
            }
            f *= inv_s;
        }
        acc_out[3 * i] = (real_t)(gx + radial * x);
        acc_out[3 * i + 1] = (real_t)(gy + radial * y);
        acc_out[3 * i + 2] = (real_t)(gz + radial * z);
        phi_out[i] = (real_t)(-phi);
    }
}
