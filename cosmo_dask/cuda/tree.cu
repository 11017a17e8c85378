// Octree gravity walk and group forces (cosmo_dask.gravity.tree_gpu). Defines:
// REAL_IS_DOUBLE, SPLINE, TRUNC (0/1), BLOCK (threads per group block) and the fit
// coefficients CD_ERFCX_FIT_k of truncated_fit.cuh (truncated.fit_defines()).
#if REAL_IS_DOUBLE
typedef double real;
#define SQRT sqrt
#else
typedef float real;
#define SQRT sqrtf
#endif
#ifndef BLOCK
#define BLOCK 128
#endif
// depth-first walk: children are pushed for nodes of levels 0..20 only (21 Morton levels),
// so at most 7 * 21 + 1 = 148 entries are ever pending
#define STACK 160
#define INV_SQRT_PI 0.56418958354775628
#include "periodic.cuh"
#include "softening.cuh"
#include "truncated_fit.cuh"


extern "C" __global__ void tree_walk(
    const int n_groups, const int g0, const long long* __restrict__ gnode,
    const double* __restrict__ lo, const double* __restrict__ hi,
    const double* __restrict__ com, const double* __restrict__ bmax,
    const long long* __restrict__ fchild, const signed char* __restrict__ nchild,
    const long long* __restrict__ nstart, const long long* __restrict__ ncount,
    const double theta, const double h_guard, const double bcap, const int trunc,
    const double r_cut, const double box, const int write,
    int* __restrict__ ncell, int* __restrict__ nrange,
    const long long* __restrict__ cell_off, const long long* __restrict__ range_off,
    int* __restrict__ cells, int* __restrict__ rstart, int* __restrict__ rcount)
{
    int g = g0 + blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_groups) return;
    long long gn = gnode[g];
    double c[3], hw[3];
    for (int a = 0; a < 3; ++a) {
        c[a] = 0.5 * (lo[3 * gn + a] + hi[3 * gn + a]);
        hw[a] = 0.5 * (hi[3 * gn + a] - lo[3 * gn + a]);
    }
    const long long g_start = nstart[gn], g_end = g_start + ncount[gn];
    int stack[STACK];
    int sp = 0;
    stack[sp++] = 0;
    int nc = 0, nr = 0;
    long long last_end = -1;
    long long co = write ? cell_off[g - g0] : 0, ro = write ? range_off[g - g0] : 0;
    const double rc2 = r_cut * r_cut, iboxd = box > 0 ? 1.0 / box : 0.0;
    while (sp > 0) {
        int nd = stack[--sp];
        double dmin2 = 0.0, dmax2 = 0.0, gap2 = 0.0, far2 = 0.0;
        for (int a = 0; a < 3; ++a) {
            double dc = fabs(cd_min_image_if(com[3 * nd + a] - c[a], box, iboxd));
            double e = dc - hw[a];
            if (e > 0) dmin2 += e * e;
            double f = dc + hw[a];
            dmax2 += f * f;
            if (trunc) {
                double l = lo[3 * nd + a], h = hi[3 * nd + a];
                double bc = fabs(cd_min_image_if(0.5 * (l + h) - c[a], box, iboxd));
                double gp = bc - hw[a] - 0.5 * (h - l);
                if (gp > 0) gap2 += gp * gp;
                double fb = bc + hw[a] + 0.5 * (h - l);
                far2 += fb * fb;
            }
        }
        double b = bmax[nd];
        double dmin = sqrt(dmin2);
        // no pair closer than r_cut (box gap or bounding sphere): dropped
        if (trunc && (gap2 >= rc2 || dmin - b >= r_cut)) continue;
        // a node holding particles of the group is never a multipole: with bmax = 0 (one
        // particle) and its com on the group box face, rounding could give dmin > 0
        const bool mine = nstart[nd] < g_end && g_start < nstart[nd] + ncount[nd];
        // bcap: with the truncated kernel also bmax < theta TRUNC_OPEN_SPLITS rs
        bool accept = !mine && dmin * theta > b && b < bcap && dmin - b > h_guard;
        // with the cut, a multipole only wholly inside it (box or bounding sphere within
        // r_cut of every point of the group box): a node across it is opened, as on the CPU
        if (trunc && accept) accept = far2 < rc2 || sqrt(dmax2) + b < r_cut;
        if (accept) {
            if (write) cells[co + nc] = nd;
            ++nc;
            continue;
        }
        long long f = fchild[nd];
        if (f < 0) {
            long long s = nstart[nd], n = ncount[nd];
            if (s == last_end) {
                if (write) rcount[ro + nr - 1] += (int)n;
            } else {
                if (write) { rstart[ro + nr] = (int)s; rcount[ro + nr] = (int)n; }
                ++nr;
            }
            last_end = s + n;
            continue;
        }
        int k = nchild[nd];
        for (int q = k - 1; q >= 0; --q) stack[sp++] = (int)(f + q);
    }
    if (!write) { ncell[g - g0] = nc; nrange[g - g0] = nr; }
}

// softened pair kernels: K (force factor, a = -G m K r_vec) and P (phi = -G m P)
__device__ __forceinline__ void pair_kernel(real r2, real eps, real eps2, real hinv, real h,
                                            real& K, real& P)
{
#if SPLINE
    // Gadget-2 cubic spline, support h = 2.8 eps
    real r = SQRT(r2);
    if (r >= h) {
        cd_inv_kp(cd_rsqrt(r2), (real)1, K, P);
    } else {
        cd_spline_kp(r * hinv, hinv, hinv * hinv * hinv, K, P);
    }
#else
    cd_inv_kp(cd_rsqrt(r2 + eps2), (real)1, K, P);
#endif
}

extern "C" __global__ void __launch_bounds__(BLOCK) group_forces(
    const int n_groups, const int g0, const long long* __restrict__ gnode,
    const double* __restrict__ lo, const double* __restrict__ hi,
    const long long* __restrict__ nstart, const long long* __restrict__ ncount,
    const double* __restrict__ pos, const double* __restrict__ pm,
    const long long* __restrict__ order,
    const long long* __restrict__ cell_off, const int* __restrict__ ncell,
    const int* __restrict__ cells, const double* __restrict__ com,
    const double* __restrict__ nmass, const double* __restrict__ quad,
    const double* __restrict__ s2, const int use_quad,
    const long long* __restrict__ range_off, const int* __restrict__ nrange,
    const int* __restrict__ rstart, const int* __restrict__ rcount,
    const double G, const double eps_d, const double rs_d, const double r_cut_d,
    const double box, const int want_pot, real* __restrict__ acc, real* __restrict__ pot)
{
    __shared__ real sc[11][BLOCK];
    __shared__ real sj[4][BLOCK];
    __shared__ int sjid[BLOCK];
    const int g = g0 + blockIdx.x;
    if (g >= n_groups) return;
    const int tid = threadIdx.x;
    const long long gn = gnode[g];
    double c[3];
    for (int a = 0; a < 3; ++a) c[a] = 0.5 * (lo[3 * gn + a] + hi[3 * gn + a]);
    const long long gs = nstart[gn], gc = ncount[gn];
    const long long co = cell_off[g - g0], ro = range_off[g - g0];
    const int nc = ncell[g - g0], nr = nrange[g - g0];
    const real eps = (real)eps_d, eps2 = eps * eps;
    const real h = (real)(2.8 * eps_d), hinv = eps_d > 0 ? (real)(1.0 / (2.8 * eps_d)) : (real)0;
    const real boxr = (real)box, ibox = box > 0 ? (real)(1.0 / box) : (real)0;
    const double iboxd = box > 0 ? 1.0 / box : 0.0;
#if TRUNC
    const real rcut = (real)r_cut_d, rcut2 = rcut * rcut;
    const real i2rs = (real)(0.5 / rs_d);
    const real irs = (real)(1.0 / rs_d);
    const real two_isp = (real)(2.0 * INV_SQRT_PI);
    const real cc = (real)(INV_SQRT_PI / (2.0 * rs_d * rs_d * rs_d));
#endif
    // Sources and targets are taken relative to the group centre with the minimum image,
    // so with the cut no pair closer than r_cut needs another image when every target lies
    // within box/2 - r_cut of the centre along each axis (a pair that would is farther than
    // box/2 >= r_cut as it stands, and is cut): then no per-pair wrap
    bool wrap_pairs = box > 0;
#if TRUNC
    {
        double hwm = 0;
        for (int a = 0; a < 3; ++a) hwm = fmax(hwm, 0.5 * (hi[3 * gn + a] - lo[3 * gn + a]));
        wrap_pairs = box > 0 && hwm + r_cut_d >= 0.5 * box * (1.0 - 1e-5);
    }
#endif
    // small groups: nsub threads share one i-particle, each takes every nsub-th source.
    // Consecutive threads take consecutive sources of one target (a warp: 32 / nsub
    // neighbouring targets x nsub neighbouring sources), so that a warp more often finds
    // all its pairs beyond r_cut and skips the kernel: emulated on 64^3 boxes (64/64 tree),
    // 14% (z = 0) and 6% (z = 9) fewer warp kernel evaluations than with min(32, gi)
    // targets x 32 / min(32, gi) sources per warp
    int gi = BLOCK;
    if (gc < BLOCK) { gi = 1; while (gi < gc) gi <<= 1; }
    const int nsub = BLOCK / gi, il = tid / nsub, sub = tid % nsub;
    __shared__ real red[4][BLOCK];
    for (long long ib = 0; ib < gc; ib += gi) {
        const long long ii = gs + ib + il;
        const bool act = ib + il < gc;
        real xi = 0, yi = 0, zi = 0;
        if (act) {
            xi = (real)cd_min_image_if(pos[3 * ii] - c[0], box, iboxd);
            yi = (real)cd_min_image_if(pos[3 * ii + 1] - c[1], box, iboxd);
            zi = (real)cd_min_image_if(pos[3 * ii + 2] - c[2], box, iboxd);
        }
        real ax = 0, ay = 0, az = 0, ph = 0;
        // ---------------- M2P
        for (int base = 0; base < nc; base += BLOCK) {
            int k = base + tid;
            if (k < nc) {
                int nd = cells[co + k];
                sc[0][tid] = (real)cd_min_image_if(com[3 * nd] - c[0], box, iboxd);
                sc[1][tid] = (real)cd_min_image_if(com[3 * nd + 1] - c[1], box, iboxd);
                sc[2][tid] = (real)cd_min_image_if(com[3 * nd + 2] - c[2], box, iboxd);
                sc[3][tid] = (real)nmass[nd];
                for (int a = 0; a < 6; ++a) sc[4 + a][tid] = use_quad ? (real)quad[6 * nd + a] : 0;
                sc[10][tid] = use_quad ? (real)s2[nd] : 0;
            }
            __syncthreads();
            int nn = min(BLOCK, nc - base);
            if (act) {
                for (int t = sub; t < nn; t += nsub) {
                    real dx = xi - sc[0][t], dy = yi - sc[1][t], dz = zi - sc[2][t];
                    real M = sc[3][t];
                    real qx = sc[4][t] * dx + sc[5][t] * dy + sc[6][t] * dz;
                    real qy = sc[5][t] * dx + sc[7][t] * dy + sc[8][t] * dz;
                    real qz = sc[6][t] * dx + sc[8][t] * dy + sc[9][t] * dz;
                    real q = qx * dx + qy * dy + qz * dz;
                    real r2 = dx * dx + dy * dy + dz * dz;
#if TRUNC
                    real ir = cd_rsqrt(r2), r = r2 * ir;
                    real x = r * i2rs, T, ec, e;
                    cd_trunc_fit(x, T, ec, e);
                    real Tr = -two_isp * irs * x * x * e;
                    real Trr = -two_isp * irs * irs * (x - x * x * x) * e;
                    real ir2 = ir * ir, ir4 = ir2 * ir2, ir5 = ir4 * ir, ir6 = ir4 * ir2;
                    real A = (real)3 * T * ir5 - Tr * ir4;
                    real Ap = (real)7 * Tr * ir5 - (real)15 * T * ir6 - Trr * ir4;
                    real C = cc * e, Cp = -C * x * irs;
                    real s = sc[10][t];
                    real F1 = (-M * T * ir2 + (Ap * q + s * Cp) * ((real)1 / (real)6)) * ir;
                    real A3 = A * ((real)1 / (real)3);
                    real phi = M * ec * ir + (A * q + s * C) * ((real)1 / (real)6);
                    if (!SPLINE && eps_d > 0) {
                        real fs = r2 / (r2 + eps2);
                        real fp = SQRT(fs);
                        F1 *= fs * fp; A3 *= fs * fp; phi *= fp;
                    }
                    ax += F1 * dx + A3 * qx; ay += F1 * dy + A3 * qy; az += F1 * dz + A3 * qz;
                    ph -= phi;
#else
#if SPLINE
                    const real e2 = 0;
#else
                    const real e2 = eps2;
#endif
                    // factored so that no power beyond u^{3/2} = r^-3 is formed (float32
                    // range: single-particle nodes have bmax = 0 and may lie very close)
                    real u = (real)1 / (r2 + e2);
                    real u1 = SQRT(u), u3 = u1 * u;
                    real w = u * u * (q - e2 * sc[10][t]);
                    real F1 = -(M + (real)2.5 * w);
                    ax += u3 * (F1 * dx + u * qx); ay += u3 * (F1 * dy + u * qy);
                    az += u3 * (F1 * dz + u * qz);
                    ph -= u1 * (M + (real)0.5 * w);
#endif
                }
            }
            __syncthreads();
        }
        // ---------------- P2P: the ranges' particles packed BLOCK at a time (a range is
        // a few leaves, ~50 particles: one batch per range would leave most slots empty)
        for (int rr = 0, roff = 0; rr < nr;) {
            {   // this thread's slot: source number tid from (range rr, offset roff) on
                int q = rr, o = roff + tid;
                while (q < nr && o >= rcount[ro + q]) { o -= rcount[ro + q]; ++q; }
                if (q < nr) {
                    const long long j = (long long)rstart[ro + q] + o;
                    sj[0][tid] = (real)cd_min_image_if(pos[3 * j] - c[0], box, iboxd);
                    sj[1][tid] = (real)cd_min_image_if(pos[3 * j + 1] - c[1], box, iboxd);
                    sj[2][tid] = (real)cd_min_image_if(pos[3 * j + 2] - c[2], box, iboxd);
                    sj[3][tid] = (real)pm[j];
                    sjid[tid] = (int)j;
                }
            }
            // the next batch's start (the same for every thread) and this batch's size
            int nn = BLOCK;
            {
                int q = rr, o = roff + BLOCK;
                while (q < nr && o >= rcount[ro + q]) { o -= rcount[ro + q]; ++q; }
                if (q >= nr) nn = BLOCK - o;
                rr = q;
                roff = o;
            }
            __syncthreads();
            if (act) {
                for (int t = sub; t < nn; t += nsub) {
                    real dx = xi - sj[0][t], dy = yi - sj[1][t], dz = zi - sj[2][t];
                    if (wrap_pairs) {
                        dx = cd_min_image(dx, boxr, ibox); dy = cd_min_image(dy, boxr, ibox);
                        dz = cd_min_image(dz, boxr, ibox);
                    }
                    real r2 = dx * dx + dy * dy + dz * dz;
                    bool skip = sjid[t] == (int)ii || (r2 == (real)0 && eps_d == 0);
#if TRUNC
                    skip = skip || r2 >= rcut2;
#endif
                    if (skip) continue;
                    real K, P;
                    pair_kernel(r2, eps, eps2, hinv, h, K, P);
#if TRUNC
                    {
#if REAL_IS_DOUBLE
                        real r = SQRT(r2);
#else
                        real r = r2 > (real)0 ? r2 * cd_rsqrt(r2) : (real)0;
#endif
                        real T, ec, e;
                        cd_trunc_fit(r * i2rs, T, ec, e);
                        K *= T;
                        P *= ec;
                    }
#endif
                    real mK = sj[3][t] * K;
                    ax -= mK * dx; ay -= mK * dy; az -= mK * dz;
                    ph -= sj[3][t] * P;
                }
            }
            __syncthreads();
        }
        red[0][tid] = ax; red[1][tid] = ay; red[2][tid] = az; red[3][tid] = ph;
        __syncthreads();
        if (sub == 0) {
            for (int q = 1; q < nsub; ++q) {
                ax += red[0][tid + q]; ay += red[1][tid + q];
                az += red[2][tid + q]; ph += red[3][tid + q];
            }
        }
        __syncthreads();
        if (act && sub == 0) {
            long long o = order[ii];
            acc[3 * o] = (real)(G * ax); acc[3 * o + 1] = (real)(G * ay);
            acc[3 * o + 2] = (real)(G * az);
            if (want_pot) pot[o] = (real)(G * ph);
        }
    }
}
