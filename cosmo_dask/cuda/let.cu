// cosmo_dask: the cut of a locally essential tree (LET) in one launch (see
// cosmo_dask/gravity/tree/let_gpu.py). Float64 throughout; compiled without fused
// multiply-adds, so that the host build of the tests rounds as the GPU does.
//
// Each node of a source octree is tested against a target box (centre c, half widths hw):
// dropped (0: no group inside the box is within the truncated kernel's r_cut of it),
// accepted (1: every group inside the box takes its multipole) or opened (2). A node is in
// the LET when every one of its ancestors is opened; the kernel writes, per node, its
// state when it is in the LET and -1 when it is not. One thread per node (grid-stride),
// climbing its ancestors through `parent`: no level-by-level passes, no host round trip.

#include "periodic.cuh"

// The state of node n (0 dropped, 1 accepted, 2 opened) for the box (c, hw); `m` is the
// relative margin that makes every test stricter than the walk kernel's.
__device__ int let_state(const long long n, const double* lo, const double* hi,
                         const double* com, const double* bmax, const double* c,
                         const double* hw, const double box, const double theta,
                         const double bcap, const double h_guard, const double rc,
                         const int trunc, const double m)
{
    const double inv_box = box > 0.0 ? 1.0 / box : 0.0;
    double dmin2 = 0.0, dmax2 = 0.0, gap2 = 0.0, far2 = 0.0;
    for (int a = 0; a < 3; ++a) {
        const double dc = fabs(cd_min_image_if(com[3 * n + a] - c[a], box, inv_box));
        const double e = fmax(dc - hw[a], 0.0);
        dmin2 += e * e;
        dmax2 += (dc + hw[a]) * (dc + hw[a]);
        const double half = 0.5 * (hi[3 * n + a] - lo[3 * n + a]);
        const double mid = 0.5 * (lo[3 * n + a] + hi[3 * n + a]);
        const double bc = fabs(cd_min_image_if(mid - c[a], box, inv_box));
        const double g = fmax(bc - hw[a] - half, 0.0);
        gap2 += g * g;
        far2 += (bc + hw[a] + half) * (bc + hw[a] + half);
    }
    const double dmin = sqrt(dmin2), dmax = sqrt(dmax2), b = bmax[n];
    if (trunc && (gap2 >= rc * rc * (1.0 + m) || dmin - b >= rc * (1.0 + m))) return 0;
    bool accept = dmin * theta > b * (1.0 + m) && b < bcap && dmin - b > h_guard + m * dmin;
    if (trunc) accept = accept && (far2 < rc * rc * (1.0 - m) || dmax + b < rc * (1.0 - m));
    return accept ? 1 : 2;
}

extern "C" __global__ void let_mark(const long long n_nodes, const double* lo,
                                    const double* hi, const double* com, const double* bmax,
                                    const long long* parent, const double* c, const double* hw,
                                    const double box, const double theta, const double bcap,
                                    const double h_guard, const double rc, const int trunc,
                                    const double m, int* state)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x; n < n_nodes;
         n += stride) {
        int s = let_state(n, lo, hi, com, bmax, c, hw, box, theta, bcap, h_guard, rc, trunc, m);
        for (long long p = parent[n]; p >= 0; p = parent[p]) {
            if (let_state(p, lo, hi, com, bmax, c, hw, box, theta, bcap, h_guard, rc, trunc,
                          m) != 2) {
                s = -1;
                break;
            }
        }
        state[n] = s;
    }
}
