// ---- p2p all-pairs tile kernel (cosmo_dask.gravity.p2p_kernels_gpu) ----
// Defines (p2p_kernels_gpu.kernel_defines): P2P_REAL / P2P_REAL4 (float, float4 or double,
// double4), P2P_SQRT, P2P_FMA, P2P_NT (threads), P2P_NR (targets per thread), P2P_UNROLL,
// P2P_KERNEL, P2P_TRUNC, P2P_LEVEL, P2P_PERIODIC, P2P_POT, P2P_CHECK, P2P_EXCL.
typedef P2P_REAL Real;
typedef P2P_REAL4 Real4;
// "#pragma unroll P2P_UNROLL" for the tile loop, through _Pragma: the argument of a
// #pragma directive is not macro-expanded, that of P2P_PRAGMA_UNROLL is
#define P2P_STR(x) #x
#define P2P_PRAGMA_UNROLL(n) _Pragma(P2P_STR(unroll n))
#include "truncated.cuh"
#include "periodic.cuh"
#include "softening.cuh"
template <int CHECKZERO, int SKIPZERO>
__device__ __forceinline__ void cd_pair(const Real xi, const Real yi, const Real zi,
                                        const Real4 s, const bool skip,
                                        const Real eps2, const Real h2, const Real hinv,
                                        const Real box, const Real inv_box,
                                        const Real inv_2rs, const Real rcut2,
                                        const Real* __restrict__ tab,
                                        Real& ax, Real& ay, Real& az, Real& ph)
{
    Real dx = s.x - xi;            // x_j - x_i: a_i = +G m_j K (x_j - x_i)
    Real dy = s.y - yi;
    Real dz = s.z - zi;
    if (P2P_PERIODIC) {
        dx = cd_min_image(dx, box, inv_box);
        dy = cd_min_image(dy, box, inv_box);
        dz = cd_min_image(dz, box, inv_box);
    }
    // r2 (unsoftened) is only evaluated where used; the Plummer s2 folds eps2 into the fma chain
    const Real r2 = P2P_FMA(dx, dx, P2P_FMA(dy, dy, dz * dz));
    const bool drop = skip || (SKIPZERO && r2 == (Real)0);
    Real k, p;
    if (P2P_KERNEL == 0) {                         // Plummer
        const Real s2 = P2P_FMA(dx, dx, P2P_FMA(dy, dy, P2P_FMA(dz, dz, eps2)));
        Real inv = cd_rsqrt(s2);
        if (CHECKZERO) inv = (s2 > (Real)0) ? inv : (Real)0;
        inv = drop ? (Real)0 : inv;
        cd_inv_kp(inv, s.w, k, p);
    } else {                                   // Gadget-2 cubic spline, support h
        if (r2 >= h2) {
            Real inv = cd_rsqrt(r2);
            inv = (r2 > (Real)0 && !drop) ? inv : (Real)0;
            cd_inv_kp(inv, s.w, k, p);
        } else {
            const Real u = P2P_SQRT(r2) * hinv;
            const Real mh = drop ? (Real)0 : s.w * hinv;
            cd_spline_kp(u, mh, mh * hinv * hinv, k, p);
        }
    }
    if (P2P_TRUNC) {
        const Real x = P2P_SQRT(r2) * inv_2rs;
        k *= cd_trunc_T<Real, P2P_LEVEL>(x, tab);
        if (P2P_POT) p *= cd_erfc(x);
        if (r2 >= rcut2) { k = (Real)0; p = (Real)0; }
    }
    ax = P2P_FMA(k, dx, ax);
    ay = P2P_FMA(k, dy, ay);
    az = P2P_FMA(k, dz, az);
    if (P2P_POT) ph += p;
}

extern "C" __global__ void __launch_bounds__(P2P_NT)
p2p_tile(const Real4* __restrict__ tgt, const Real4* __restrict__ src,
         const long long ns_pad, const long long split_len, const long long nt_pad,
         const Real eps2, const Real h2, const Real hinv, const Real box, const Real inv_box,
         const Real inv_2rs, const Real rcut2, const Real* __restrict__ tab,
         Real4* __restrict__ out)
{
    __shared__ Real4 sh[P2P_NT];
    const int tid = threadIdx.x;
    const long long i0 = (long long)blockIdx.x * (P2P_NT * P2P_NR);
    Real xi[P2P_NR], yi[P2P_NR], zi[P2P_NR], ax[P2P_NR], ay[P2P_NR], az[P2P_NR], ph[P2P_NR];
#pragma unroll
    for (int r = 0; r < P2P_NR; ++r) {
        const Real4 t = tgt[i0 + r * P2P_NT + tid];
        xi[r] = t.x; yi[r] = t.y; zi[r] = t.z;
        ax[r] = (Real)0; ay[r] = (Real)0; az[r] = (Real)0; ph[r] = (Real)0;
    }
    const long long js = (long long)blockIdx.y * split_len;
    long long je = js + split_len;
    je = je < ns_pad ? je : ns_pad;
    for (long long jt = js; jt < je; jt += P2P_NT) {
        sh[tid] = src[jt + tid];
        __syncthreads();
        const bool diag = P2P_EXCL == 1 && jt < i0 + P2P_NT * P2P_NR && jt + P2P_NT > i0;
        if (P2P_EXCL == 2 || diag) {
            for (int kk = 0; kk < P2P_NT; ++kk) {
                const Real4 s = sh[kk];
#pragma unroll
                for (int r = 0; r < P2P_NR; ++r) {
                    const bool skip = P2P_EXCL == 1 && (jt + kk == i0 + r * P2P_NT + tid);
                    cd_pair<1, (P2P_EXCL == 2)>(xi[r], yi[r], zi[r], s, skip, eps2, h2, hinv,
                                            box, inv_box, inv_2rs, rcut2, tab,
                                            ax[r], ay[r], az[r], ph[r]);
                }
            }
        } else {
            // two-level summation: each tile is summed on its own, then added to the total
            // (float32 rounding grows with tile size + tile count, not with N)
            Real tx[P2P_NR], ty[P2P_NR], tz[P2P_NR], tp[P2P_NR];
#pragma unroll
            for (int r = 0; r < P2P_NR; ++r) {
                tx[r] = (Real)0; ty[r] = (Real)0; tz[r] = (Real)0; tp[r] = (Real)0;
            }
P2P_PRAGMA_UNROLL(P2P_UNROLL)
            for (int kk = 0; kk < P2P_NT; ++kk) {
                const Real4 s = sh[kk];
#pragma unroll
                for (int r = 0; r < P2P_NR; ++r)
                    cd_pair<P2P_CHECK, 0>(xi[r], yi[r], zi[r], s, false, eps2, h2, hinv,
                                          box, inv_box, inv_2rs, rcut2, tab,
                                          tx[r], ty[r], tz[r], tp[r]);
            }
#pragma unroll
            for (int r = 0; r < P2P_NR; ++r) {
                ax[r] += tx[r]; ay[r] += ty[r]; az[r] += tz[r]; ph[r] += tp[r];
            }
        }
        __syncthreads();
    }
    Real4* o = out + (long long)blockIdx.y * nt_pad + i0 + tid;
#pragma unroll
    for (int r = 0; r < P2P_NR; ++r) {
        Real4 v;
        v.x = ax[r]; v.y = ay[r]; v.z = az[r]; v.w = ph[r];
        o[r * P2P_NT] = v;
    }
}
