"""Tree gravity entirely on one GPU (CuPy): build, group walks, M2P + P2P.

Pipeline (all device work; the host only launches and reads a few scalars):

1. :func:`cosmo_dask.spatial.octree_gpu.build_octree_gpu` (Morton sort, nodes level by
   level, float64 multipoles bottom up, groups).
2. Tree walk, one thread per group (stack-based, Octgrav style), run twice: the first pass
   counts, a prefix sum gives every group its slice, the second pass writes the group's
   cell list (nodes accepted for M2P) and its P2P list as particle ranges (a leaf that
   follows the previous one in sorted order extends the last range, so sibling leaves
   become one range). A node is accepted when the distance ``d`` from its centre of mass
   to the group's bounding box satisfies ``d * theta > bmax`` (``bmax``: the node's largest
   particle distance from its centre of mass), and, with spline softening, ``d - bmax >
   2.8 eps`` (all pairs Newtonian). With the truncated kernel also ``bmax < theta *
   TRUNC_OPEN_SPLITS * rs`` (the kernel varies on the scale ``rs``); a node whose box (or
   bounding sphere) lies at least ``r_cut`` from the group box is dropped, and one is accepted
   only when its box (or bounding sphere) lies within ``r_cut`` of every point of the
   group box; nodes across the cut sphere are opened, so the cut is applied per particle
   pair (the rule of the CPU walk, :mod:`cosmo_dask.gravity.tree_walk`).
3. One thread block per group (``BLOCK`` threads; a group of ``c < BLOCK`` particles gives
   each i-particle ``BLOCK / c'`` threads, ``c'`` the next power of two, which split its
   sources and add up in shared memory; bigger groups loop): the cells are staged in
   shared memory ``BLOCK`` at a time for the M2P (monopole + traceless quadrupole), then
   the particles of the P2P ranges, packed ``BLOCK`` at a time across ranges (a range is
   typically a few leaves, ~50 particles). Positions are made
   relative to the group's box centre in float64, with the periodic minimum image, then
   cast to the arithmetic precision. Results are written straight to the input order.

M2P expansions: for a radial pair potential ``-G m g(r)`` the node's field to second order
is ``-G [M g + (A q + s2 C) / 6]`` with ``q = r.Q.r``, ``s2 = sum m |d|^2``,
``A = (g'' - g'/r) / r^2`` and ``C = A r^2 + 3 g'/r`` (the Laplacian of g). Newtonian:
``C = 0``; Plummer: ``g = u^1/2``, ``u = 1/(r^2+eps^2)``, ``A = 3 u^5/2``,
``C = -3 eps^2 u^5/2``; truncated (``g = erfc(r/2rs)/r``): ``C = exp(-x^2) / (2 sqrt(pi)
rs^3)``, and ``A``, ``A'`` from the force factor ``T`` and its radial derivatives. With
Plummer softening and the truncated kernel the M2P applies the softening as a factor
``(r^2/(r^2+eps^2))^{3/2}`` (force) / ``r/sqrt(r^2+eps^2)`` (potential) to the truncated
expansion, accurate to second order in ``bmax/d`` times ``(eps/d)^2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cuda import include_options
from ..errors import ParameterError
from .parameters import THETA_DEFAULT, TRUNC_OPEN_SPLITS, check_theta, default_r_cut
from .truncated import CUDA_FIT_SOURCE

BLOCK = 128  # threads per group block (measured on an H200: 128 >= 64 > 32)
_SRC = r"""
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
// @CD_TRUNC_FIT@


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
"""

_SRC = _SRC.replace("// @CD_TRUNC_FIT@", CUDA_FIT_SOURCE)
_modules: dict = {}


def _module(dtype, spline: bool, trunc: bool, block: int):
    import cupy as cp

    key = (np.dtype(dtype).name, bool(spline), bool(trunc), block)
    if key not in _modules:
        opts = ("--std=c++14", f"-DREAL_IS_DOUBLE={int(np.dtype(dtype) == np.float64)}",
                f"-DSPLINE={int(bool(spline))}", f"-DTRUNC={int(bool(trunc))}",
                f"-DBLOCK={block}")
        _modules[key] = cp.RawModule(code=_SRC, options=opts + include_options())
    return _modules[key]


def _check_params(theta, softening, softening_kernel, precision, G, box_size, rs, r_cut):  # noqa: N803
    theta = check_theta(theta)
    softening = float(softening)
    if not (softening >= 0.0 and math.isfinite(softening)):
        raise ParameterError(f"softening must be a finite number >= 0, got {softening!r}")
    if softening_kernel not in ("plummer", "spline"):
        raise ParameterError(f"softening_kernel must be 'plummer' or 'spline', "
                             f"got {softening_kernel!r}")
    if precision not in ("float32", "float64"):
        raise ParameterError(f"precision must be 'float32' or 'float64', got {precision!r}")
    G = float(G)  # noqa: N806
    if not (G > 0 and math.isfinite(G)):
        raise ParameterError(f"G must be a positive number, got {G!r}")
    if rs is None and r_cut is not None:
        raise ParameterError("r_cut needs rs (the truncated short-range kernel)")
    if rs is not None:
        rs = float(rs)
        if not (rs > 0 and math.isfinite(rs)):
            raise ParameterError(f"rs must be a positive number, got {rs!r}")
        r_cut = default_r_cut(rs) if r_cut is None else float(r_cut)
        if not (r_cut > 0 and math.isfinite(r_cut)):
            raise ParameterError(f"r_cut must be a positive number, got {r_cut!r}")
    if box_size is not None:
        box_size = float(box_size)
        if not (box_size > 0 and math.isfinite(box_size)):
            raise ParameterError(f"box_size must be a positive number, got {box_size!r}")
        # without rs: Newtonian forces of the nearest image of every particle and node
        # (as the CPU tree and the direct sum; no Ewald sum)
        if r_cut is not None and r_cut >= 0.5 * box_size:
            raise ParameterError(f"r_cut ({r_cut}) must be smaller than half the box "
                                 f"({0.5 * box_size})")
    return theta, softening, G, box_size, rs, r_cut


class _Timer:
    """CUDA-event phase timer (seconds per named phase)."""

    def __init__(self):
        import cupy as cp

        self.cp = cp
        self.marks = []

    def mark(self, name: str):
        ev = self.cp.cuda.Event()
        ev.record()
        self.marks.append((name, ev))

    def phases(self) -> dict:
        self.marks[-1][1].synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks[:-1], self.marks[1:], strict=True):
            out[name] = out.get(name, 0.0) + self.cp.cuda.get_elapsed_time(a, b) / 1e3
        return out


@dataclass
class KernelSettings:
    """The checked parameters of a GPU tree evaluation and its compiled module."""

    mod: Any
    dtype: np.dtype
    theta: float
    h_guard: float
    bcap: float
    trunc: bool
    r_cut: float
    box: float
    G: float
    softening: float
    rs: float
    quadrupole: bool
    block: int


def kernel_settings(*, G, theta, softening, softening_kernel, precision, box_size, rs,  # noqa: N803
                    r_cut, quadrupole: bool = True, block: int = BLOCK) -> KernelSettings:
    """Check the parameters once and compile (or fetch) the module they need."""
    theta, softening, G, box_size, rs, r_cut = _check_params(  # noqa: N806
        theta, softening, softening_kernel, precision, G, box_size, rs, r_cut)
    trunc = rs is not None
    spline = softening_kernel == "spline" and softening > 0
    dtype = np.dtype(precision)
    return KernelSettings(
        mod=_module(dtype, spline, trunc, block), dtype=dtype, theta=theta,
        h_guard=2.8 * softening if (spline or trunc) else 0.0,
        bcap=theta * TRUNC_OPEN_SPLITS * rs if trunc else math.inf, trunc=trunc,
        r_cut=0.0 if r_cut is None else r_cut, box=0.0 if box_size is None else box_size,
        G=G, softening=softening, rs=rs or 0.0, quadrupole=bool(quadrupole), block=block)


def walk_forces(nodes, s2, groups, pos64, pmass, order, n_out: int, st: KernelSettings, *,
                potential: bool, timer=None, stats=None, max_entries: int = 1 << 30):
    """Walk ``nodes`` (an :class:`~cosmo_dask.spatial.octree_layout.Octree` or a node set
    with the same attributes) for every group node ``groups`` and evaluate the M2P and P2P.

    ``pos64`` and ``pmass`` are the particles the node ranges index (float64, sorted
    order), ``order`` maps a sorted row to its output row (``< n_out``); a group's
    particles are the i-particles. Returns ``(acc (n_out, 3), pot (n_out,) or None)`` of
    dtype ``st.dtype``: rows of particles in no group are left uninitialised.
    """
    import cupy as cp

    n_groups = int(groups.shape[0])
    walk = st.mod.get_function("tree_walk")
    force = st.mod.get_function("group_forces")
    i32 = np.int32
    acc = cp.empty((n_out, 3), dtype=st.dtype)
    pot = cp.empty(n_out if potential else 1, dtype=st.dtype)
    if n_groups == 0:
        return acc, (pot if potential else None)
    ncell = cp.empty(n_groups, dtype=cp.int32)
    nrange = cp.empty(n_groups, dtype=cp.int32)
    dummy64 = cp.zeros(1, dtype=cp.int64)
    dummy32 = cp.zeros(1, dtype=cp.int32)
    wt = 128
    node_args = (nodes.lo, nodes.hi, nodes.com, nodes.bmax, nodes.first_child,
                 nodes.n_child, nodes.start, nodes.count, np.float64(st.theta),
                 np.float64(st.h_guard), np.float64(st.bcap), i32(st.trunc),
                 np.float64(st.r_cut), np.float64(st.box))
    walk(((n_groups + wt - 1) // wt,), (wt,),
         (i32(n_groups), i32(0), groups) + node_args
         + (i32(0), ncell, nrange, dummy64, dummy64, dummy32, dummy32, dummy32))
    cum_c = cp.cumsum(ncell, dtype=cp.int64)
    cum_r = cp.cumsum(nrange, dtype=cp.int64)
    tot_c, tot_r = (int(v) for v in cp.asnumpy(cp.stack([cum_c[-1], cum_r[-1]])))
    if timer:
        timer.mark("walk_count")
    # batches of groups whose lists fit in max_entries entries
    if tot_c + tot_r <= max_entries:
        cuts = [0, n_groups]
    else:
        both = cp.asnumpy(cum_c + cum_r)
        cuts = [0]
        while cuts[-1] < n_groups:
            base = both[cuts[-1] - 1] if cuts[-1] > 0 else 0
            nxt = int(np.searchsorted(both, base + max_entries, side="right"))
            cuts.append(min(n_groups, max(nxt, cuts[-1] + 1)))
    for g0, g1 in zip(cuts[:-1], cuts[1:], strict=True):
        nb = g1 - g0
        c0 = int(cum_c[g0 - 1]) if g0 > 0 else 0
        r0 = int(cum_r[g0 - 1]) if g0 > 0 else 0
        c_off = cum_c[g0:g1] - ncell[g0:g1] - c0
        r_off = cum_r[g0:g1] - nrange[g0:g1] - r0
        c_tot = int(cum_c[g1 - 1]) - c0 if len(cuts) > 2 else tot_c
        r_tot = int(cum_r[g1 - 1]) - r0 if len(cuts) > 2 else tot_r
        cells = cp.empty(max(c_tot, 1), dtype=cp.int32)
        rstart = cp.empty(max(r_tot, 1), dtype=cp.int32)
        rcount = cp.empty(max(r_tot, 1), dtype=cp.int32)
        nc_b, nr_b = ncell[g0:g1], nrange[g0:g1]
        walk(((nb + wt - 1) // wt,), (wt,),
             (i32(g1), i32(g0), groups) + node_args
             + (i32(1), nc_b, nr_b, c_off, r_off, cells, rstart, rcount))
        if timer:
            timer.mark("walk_write")
        force((nb,), (st.block,),
              (i32(g1), i32(g0), groups, nodes.lo, nodes.hi, nodes.start, nodes.count, pos64,
               pmass, order, c_off, nc_b, cells, nodes.com, nodes.mass, nodes.quad, s2,
               i32(st.quadrupole), r_off, nr_b, rstart, rcount, np.float64(st.G),
               np.float64(st.softening), np.float64(st.rs), np.float64(st.r_cut),
               np.float64(st.box), i32(bool(potential)), acc, pot))
        if timer:
            timer.mark("forces")
        if stats is not None:
            gcnt = nodes.count[groups[g0:g1]]
            jcum = cp.concatenate([cp.zeros(1, cp.int64), cp.cumsum(rcount, dtype=cp.int64)])
            jper = jcum[r_off + nr_b] - jcum[r_off]
            stats["m2p"] = stats.get("m2p", 0) + int((gcnt * nc_b).sum())
            stats["p2p"] = stats.get("p2p", 0) + int((gcnt * jper).sum())
    if stats is not None:
        stats.update(n_groups=n_groups, n_nodes=int(nodes.lo.shape[0]), cells=tot_c,
                     ranges=tot_r, batches=len(cuts) - 1)
    return acc, (pot if potential else None)


def _forces(pos, mass, *, G, theta, softening, softening_kernel, precision, potential,  # noqa: N803
            max_leaf, max_group, quadrupole, box_size, rs, r_cut, timer=None, stats=None,
            max_entries: int = 1 << 30, block: int = BLOCK):
    from ..spatial.octree_gpu import build_with_moments

    st = kernel_settings(G=G, theta=theta, softening=softening,
                         softening_kernel=softening_kernel, precision=precision,
                         box_size=box_size, rs=rs, r_cut=r_cut, quadrupole=quadrupole,
                         block=block)
    if timer:
        timer.mark("start")
    tree, s2, pos64 = build_with_moments(pos, mass, max_leaf=max_leaf, max_group=max_group,
                                         box_size=box_size, timer=timer)
    if timer:
        timer.mark("build_groups")
    return walk_forces(tree, s2, tree.groups, pos64, tree.pmass, tree.order, tree.n_particles,
                       st, potential=potential, timer=timer, stats=stats,
                       max_entries=max_entries)


def tree_forces_gpu(pos, mass, *, G: float = 1.0, theta: float = THETA_DEFAULT,  # noqa: N803
                    softening: float = 0.0, softening_kernel: str = "plummer",
                    precision: str = "float64", potential: bool = True, max_leaf: int = 64,
                    max_group: int = 64, quadrupole: bool = True,
                    box_size: float | None = None, rs: float | None = None,
                    r_cut: float | None = None):
    """Tree accelerations and potentials of particles on one GPU (CuPy in, CuPy out).

    Parameters
    ----------
    pos : (N, 3) cupy.ndarray
        Positions (length units), float32 or float64.
    mass : (N,) cupy.ndarray or float
        Particle masses (mass units) or one mass for every particle.
    G : float
        Gravitational constant (length^3 / (mass time^2)).
    theta : float
        Opening angle, ``0 < theta < 1.5``: a node is used as a multipole when
        ``bmax < theta * d`` (``d``: distance from its centre of mass to the group's box).
    softening : float
        Plummer-equivalent softening length ``eps`` (length units), >= 0.
    softening_kernel : {"plummer", "spline"}
        Plummer, or the Gadget-2 cubic spline with support ``2.8 eps``.
    precision : {"float32", "float64"}
        Arithmetic precision of the kernels (positions are made relative to the group's
        centre in float64 first) and dtype of the outputs.
    potential : bool
        Also return the specific potential.
    max_leaf, max_group : int
        Leaf and group sizes of the octree (particles).
    quadrupole : bool
        Include the quadrupole in the M2P (monopole only when False).
    box_size : float, optional
        Periodic box side (length units): minimum-image separations, particles must lie in
        ``[0, box_size)^3``. Needs ``rs`` (periodic forces are the TreePM short range only).
    rs : float, optional
        Split scale of the truncated short-range kernel (length units): pair forces are
        multiplied by ``T(x) = erfc(x) + 2x/sqrt(pi) exp(-x^2)``, potentials by ``erfc(x)``,
        ``x = r/(2 rs)``: exactly in float64, in float32 from one ``exp2f`` and a
        polynomial (``cd_trunc_fit`` of :mod:`cosmo_dask.gravity.truncated`, relative
        error <= 1.1e-6 on ``x <= 3``, the float32 floor there).
    r_cut : float, optional
        Cutoff radius of the truncated kernel (default ``4.5 rs``); pairs with
        ``r >= r_cut`` contribute nothing.

    Returns
    -------
    acc : (N, 3) cupy.ndarray
        Accelerations in the input order, dtype ``precision``.
    pot : (N,) cupy.ndarray or None
        Specific potentials (self-pairs excluded), or None when ``potential`` is False.

    Raises
    ------
    ParameterError
        Bad parameters or inputs (see :mod:`cosmo_dask.gravity` conventions).
    NotImplementedError
        ``box_size`` without ``rs`` (periodic Newtonian forces need Ewald sums).
    """
    return _forces(pos, mass, G=G, theta=theta, softening=softening,
                   softening_kernel=softening_kernel, precision=precision, potential=potential,
                   max_leaf=max_leaf, max_group=max_group, quadrupole=quadrupole,
                   box_size=box_size, rs=rs, r_cut=r_cut)


__all__ = ["KernelSettings", "kernel_settings", "tree_forces_gpu", "walk_forces"]
