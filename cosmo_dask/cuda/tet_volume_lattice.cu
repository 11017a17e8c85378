// Lattice deposit of tetrahedra (cosmo_dask.density.tet_volume_gpu.deposit_tets_gpu).
// Defines (tet_volume_gpu.lattice_defines): REAL (geometry arithmetic, "double" or
// "float"), LATTICE_MASK, WARPS, CAP, PQ_SMEM, WARP_SHUFFLE, FMAD, LINEINFO. The core
// (everything but the kernel wrapper) is plain C++ given the three macros below, so it
// can also be compiled and checked on a CPU.
typedef REAL real;
#define HD_INLINE __device__ __forceinline__
#define SYNCWARP() __syncwarp()
#define ATOMIC_ADD(p, v) atomicAdd(p, v)

// real: geometry arithmetic; acc_t: accumulation (always double)
typedef double acc_t;

struct LatTet {
    double X[4], Y[4], Z[4];   // vertices sorted by x, cell units, relative to the bbox cell
    double nrm[4][3], offp[4]; // face planes: cell lo is outside when nrm . lo + offp <= 0
};

HD_INLINE void cswap(real& k0, real& k1, real& a0, real& a1) {
    if (k1 < k0) { real t = k0; k0 = k1; k1 = t; t = a0; a0 = a1; a1 = t; }
}
HD_INLINE void cswap1(real& k0, real& k1) {
    real a = k0 < k1 ? k0 : k1, b = k0 < k1 ? k1 : k0; k0 = a; k1 = b;
}
HD_INLINE void sort4z(real* z) {
    cswap1(z[0], z[1]); cswap1(z[2], z[3]); cswap1(z[0], z[2]); cswap1(z[1], z[3]);
    cswap1(z[1], z[2]);
}
HD_INLINE void sort4yz(real* y, real* z) {
    cswap(y[0], y[1], z[0], z[1]); cswap(y[2], y[3], z[2], z[3]);
    cswap(y[0], y[2], z[0], z[2]); cswap(y[1], y[3], z[1], z[3]);
    cswap(y[1], y[2], z[1], z[2]);
}

// Clip a tetrahedron (keys K sorted ascending, NC carried coordinates C) by {key < A}.
// Returns the number of pieces (0, 1 or 3); piece p is points p..p+3 of the 6 in O, with
// volume f[p] times the parent's. Inside vertices come first since K is sorted.
template <int NC>
HD_INLINE int clip_below(real A, const real* K, const real (*C)[4], real (*O)[6], real* f) {
    real d0 = A - K[0], d1 = A - K[1], d2 = A - K[2], d3 = A - K[3];
    int nin = (d0 > (real)0) + (d1 > (real)0) + (d2 > (real)0) + (d3 > (real)0);
    if (nin == 0) return 0;
    if (nin == 4) {
        #pragma unroll
        for (int c = 0; c < NC; ++c)
            #pragma unroll
            for (int v = 0; v < 4; ++v) O[c][v] = C[c][v];
        f[0] = (real)1;
        return 1;
    }
    if (nin == 1) {
        real s1 = d0 / (d0 - d1), s2 = d0 / (d0 - d2), s3 = d0 / (d0 - d3);
        #pragma unroll
        for (int c = 0; c < NC; ++c) {
            real a = C[c][0];
            O[c][0] = a;
            O[c][1] = a + s1 * (C[c][1] - a);
            O[c][2] = a + s2 * (C[c][2] - a);
            O[c][3] = a + s3 * (C[c][3] - a);
        }
        f[0] = s1 * s2 * s3;
        return 1;
    }
    if (nin == 2) {
        real r02 = (real)1 / (d0 - d2), r03 = (real)1 / (d0 - d3);
        real r12 = (real)1 / (d1 - d2), r13 = (real)1 / (d1 - d3);
        real s02 = d0 * r02, t02 = -d2 * r02, s03 = d0 * r03, t03 = -d3 * r03;
        real s12 = d1 * r12, s13 = d1 * r13;
        #pragma unroll
        for (int c = 0; c < NC; ++c) {
            real a = C[c][0], b = C[c][1];
            O[c][0] = a;
            O[c][1] = a + s02 * (C[c][2] - a);
            O[c][2] = a + s03 * (C[c][3] - a);
            O[c][3] = b;
            O[c][4] = b + s12 * (C[c][2] - b);
            O[c][5] = b + s13 * (C[c][3] - b);
        }
        f[0] = s02 * s03;
        f[1] = t02 * s03 * s12;
        f[2] = t03 * s12 * s13;
        return 3;
    }
    // nin == 3: vertex 3 outside
    real r0 = (real)1 / (d0 - d3), r1 = (real)1 / (d1 - d3), r2 = (real)1 / (d2 - d3);
    real u0 = d0 * r0, u1 = d1 * r1, u2 = d2 * r2, t0 = -d3 * r0, t1 = -d3 * r1;
    #pragma unroll
    for (int c = 0; c < NC; ++c) {
        real e = C[c][3];
        O[c][0] = C[c][0];
        O[c][1] = C[c][1];
        O[c][2] = C[c][2];
        O[c][3] = C[c][0] + u0 * (e - C[c][0]);
        O[c][4] = C[c][1] + u1 * (e - C[c][1]);
        O[c][5] = C[c][2] + u2 * (e - C[c][2]);
    }
    f[0] = u0;
    f[1] = t0 * u1;
    f[2] = t0 * t1 * u2;
    return 3;
}

// fraction of a tetrahedron (z sorted ascending) below the plane z = c, z[0] < c < z[3]:
// the clip fractions of clip_below summed over a common denominator (positive terms only)
HD_INLINE real below_fraction(const real* z, real c) {
    real d0 = c - z[0], d1 = c - z[1], d2 = c - z[2], d3 = c - z[3];
    if (!(d1 > (real)0)) {  // one vertex below
        return d0 * d0 * d0 / ((d0 - d1) * (d0 - d2) * (d0 - d3));
    }
    if (!(d2 > (real)0)) {  // two below: s02 s03 + t02 s03 s12 + t03 s12 s13
        real e02 = d0 - d2, e03 = d0 - d3, e12 = d1 - d2, e13 = d1 - d3;
        real num = d0 * (d0 * e12 * e13 - d2 * d1 * e13) - d3 * d1 * d1 * e02;
        return num / (e02 * e03 * e12 * e13);
    }
    // three below: u0 + t0 u1 + t0 t1 u2
    real e0 = d0 - d3, e1 = d1 - d3, e2 = d2 - d3;
    return (d0 * e1 * e2 - d3 * (d1 * e2 - d3 * d2)) / (e0 * e1 * e2);
}

// add F * (volume fraction of the leaf in z-cell k) to row[k - klo] for k in [klo, khi]
HD_INLINE void leaf_add(real* z, real F, int klo, int khi, acc_t* row) {
    if (!(F > (real)0)) return;
    sort4z(z);
    int kk0 = (int)floor(z[0]);
    int kk1 = (int)ceil(z[3]) - 1;
    if (kk1 < kk0) kk1 = kk0;
    int k = kk0 > klo ? kk0 : klo, ke = kk1 < khi ? kk1 : khi;
    if (k > ke) return;
    acc_t g0 = (k == kk0) ? (acc_t)0 : (acc_t)below_fraction(z, (real)k);
    for (; k <= ke; ++k) {
        acc_t g1 = (k == kk1) ? (acc_t)1 : (acc_t)below_fraction(z, (real)(k + 1));
        row[k - klo] += (acc_t)F * (g1 - g0);
        g0 = g1;
    }
}

// row[k - klo] += fraction of the tet inside {x < A, y < B, k < z < k + 1}
HD_INLINE void line_add(real A, real B, const LatTet* S, int klo, int khi, acc_t* row,
                          real* scr) {
    real K[4], C[2][4];
    #pragma unroll
    for (int v = 0; v < 4; ++v) {
        K[v] = (real)S->X[v]; C[0][v] = (real)S->Y[v]; C[1][v] = (real)S->Z[v];
    }
#if PQ_SMEM
    real (*P)[6] = (real (*)[6])scr, *pf = scr + 12;
#else
    real P[2][6], pf[3];
#endif
    int n1 = clip_below<2>(A, K, C, P, pf);
    #pragma unroll 1
    for (int i1 = 0; i1 < n1; ++i1) {
        {
            real y[4], zc[1][4];
            #pragma unroll
            for (int v = 0; v < 4; ++v) {
                y[v] = i1 == 0 ? P[0][v] : (i1 == 1 ? P[0][v + 1] : P[0][v + 2]);
                zc[0][v] = i1 == 0 ? P[1][v] : (i1 == 1 ? P[1][v + 1] : P[1][v + 2]);
            }
            real F1 = i1 == 0 ? pf[0] : (i1 == 1 ? pf[1] : pf[2]);
            sort4yz(y, zc[0]);
#if PQ_SMEM
            real (*Q)[6] = (real (*)[6])(scr + 15), *qf = scr + 21;
#else
            real Q[1][6], qf[3];
#endif
            int n2 = clip_below<1>(B, y, zc, Q, qf);
            #pragma unroll 1
            for (int i2 = 0; i2 < n2; ++i2) {
                real z[4];
                #pragma unroll
                for (int v = 0; v < 4; ++v)
                    z[v] = i2 == 0 ? Q[0][v] : (i2 == 1 ? Q[0][v + 1] : Q[0][v + 2]);
                leaf_add(z, F1 * (i2 == 0 ? qf[0] : (i2 == 1 ? qf[1] : qf[2])), klo, khi, row);
            }
        }
    }
}

HD_INLINE double det3(double ax, double ay, double az, double bx, double by, double bz,
                      double cx, double cy, double cz) {
    return ax * (by * cz - bz * cy) - ay * (bx * cz - bz * cx) + az * (bx * cy - by * cx);
}

HD_INLINE int wrap_add(int base, int off, int n) {
    int r = base + off;
    while (r >= n) r -= n;
    return r;
}

// One warp (lanes lane = 0..nl-1) per tetrahedron, tetrahedra t = gw, gw + nw, ...
HD_INLINE void lattice_body(const double* tets, const double* mass, double mconst, long long nt,
                     double g0, double g1, double g2, double cs, int nx, int ny, int nz,
                     int periodic, double* grid, int lane, int nl, long long gw, long long nw,
                     acc_t* phi, LatTet* S, real* scr) {
    const int n3[3] = {nx, ny, nz};
    for (long long t = gw; t < nt; t += nw) {
        double u[12];
#if WARP_SHUFFLE
        {   // lanes 0..11 convert one coordinate each to cell units, then share
            int c3 = lane % 3;
            double gc = c3 == 0 ? g0 : (c3 == 1 ? g1 : g2);
            double mine = lane < 12 ? (tets[12 * t + lane] - gc) / cs : 0.0;
            #pragma unroll
            for (int q = 0; q < 12; ++q) u[q] = __shfl_sync(0xffffffffu, mine, q);
        }
#else
        const double glo[3] = {g0, g1, g2};
        #pragma unroll
        for (int q = 0; q < 12; ++q) u[q] = (tets[12 * t + q] - glo[q % 3]) / cs;
#endif
        double fl[3];
        int r0[3], r1[3], base[3];
        bool skip = false;
        #pragma unroll
        for (int c = 0; c < 3; ++c) {
            double lo = fmin(fmin(u[c], u[3 + c]), fmin(u[6 + c], u[9 + c]));
            double hi = fmax(fmax(u[c], u[3 + c]), fmax(u[6 + c], u[9 + c]));
            double f0 = floor(lo), f1 = floor(hi);
            if (!(hi - lo < 1e9)) { skip = true; f0 = f1 = 0; }  // non-finite or absurd
            if (f1 > f0 && f1 == hi) f1 -= 1;
            fl[c] = f0;
            if (periodic) {
                r0[c] = 0;
                r1[c] = (int)(f1 - f0);
                base[c] = (int)(f0 - floor(f0 / n3[c]) * n3[c]);
                if (base[c] >= n3[c]) base[c] -= n3[c];
            } else {
                if (f1 < 0 || f0 > n3[c] - 1) skip = true;
                double a = fmax(f0, 0.0), b = fmin(f1, (double)(n3[c] - 1));
                r0[c] = skip ? 0 : (int)(a - f0);
                r1[c] = skip ? -1 : (int)(b - f0);
                base[c] = skip ? 0 : (int)f0;
            }
        }
        if (skip) continue;
        double m = mass ? mass[t] : mconst;
        // relative coordinates (exact: u - floor)
        double v[12];
        #pragma unroll
        for (int q = 0; q < 12; ++q) v[q] = u[q] - fl[q % 3];
        double d6 = det3(v[3] - v[0], v[4] - v[1], v[5] - v[2], v[6] - v[0], v[7] - v[1],
                         v[8] - v[2], v[9] - v[0], v[10] - v[1], v[11] - v[2]);
        if (d6 == 0.0) {
            if (lane == 0) {  // degenerate: whole mass to the cell of the vertex centroid
                long long idx = 0;
                bool ok = true;
                for (int c = 0; c < 3; ++c) {
                    double gc = floor(0.25 * (u[c] + u[3 + c] + u[6 + c] + u[9 + c]));
                    long long g;
                    if (periodic) {
                        g = (long long)(gc - floor(gc / n3[c]) * n3[c]);
                        if (g >= n3[c]) g -= n3[c];
                    } else {
                        if (gc < 0 || gc > n3[c] - 1) ok = false;
                        g = ok ? (long long)gc : 0;
                    }
                    idx = idx * n3[c] + g;
                }
                if (ok) ATOMIC_ADD(grid + idx, m);
            }
            continue;
        }
        if (lane == 0) {
            // vertices sorted by x
            double X[4], Y[4], Z[4];
            for (int k = 0; k < 4; ++k) {
                X[k] = v[3 * k]; Y[k] = v[3 * k + 1]; Z[k] = v[3 * k + 2];
            }
            const int net[5][2] = {{0, 1}, {2, 3}, {0, 2}, {1, 3}, {1, 2}};
            for (int e = 0; e < 5; ++e) {
                int i = net[e][0], j = net[e][1];
                if (X[j] < X[i]) {
                    double tt = X[i]; X[i] = X[j]; X[j] = tt;
                    tt = Y[i]; Y[i] = Y[j]; Y[j] = tt;
                    tt = Z[i]; Z[i] = Z[j]; Z[j] = tt;
                }
            }
            for (int k = 0; k < 4; ++k) { S->X[k] = X[k]; S->Y[k] = Y[k]; S->Z[k] = Z[k]; }
        }
        // inward face planes (as the CPU's _face_planes), shifted by the cube's extreme corner
        for (int f0 = 0; f0 < 4; f0 += nl) {
            int f = f0 + lane;
            if (f >= 4) continue;
            int a = f == 0 ? 1 : 0, b = f <= 1 ? 2 : 1, c = f <= 2 ? 3 : 2;
            double pa[3], pb[3], pc[3], pf[3];
            #pragma unroll
            for (int q = 0; q < 3; ++q) {
                pa[q] = a == 0 ? v[q] : v[3 + q];
                pb[q] = b == 1 ? v[3 + q] : v[6 + q];
                pc[q] = c == 2 ? v[6 + q] : v[9 + q];
                pf[q] = f == 0 ? v[q] : (f == 1 ? v[3 + q] : (f == 2 ? v[6 + q] : v[9 + q]));
            }
            double ux = pb[0] - pa[0], uy = pb[1] - pa[1], uz = pb[2] - pa[2];
            double wx = pc[0] - pa[0], wy = pc[1] - pa[1], wz = pc[2] - pa[2];
            double nx_ = uy * wz - uz * wy, ny_ = uz * wx - ux * wz, nz_ = ux * wy - uy * wx;
            double o = -(nx_ * pa[0] + ny_ * pa[1] + nz_ * pa[2]);
            double s = nx_ * pf[0] + ny_ * pf[1] + nz_ * pf[2] + o;
            if (s < 0.0) { nx_ = -nx_; ny_ = -ny_; nz_ = -nz_; o = -o; }
            S->nrm[f][0] = nx_; S->nrm[f][1] = ny_; S->nrm[f][2] = nz_;
            S->offp[f] = o + fmax(nx_, 0.0) + fmax(ny_, 0.0) + fmax(nz_, 0.0);
        }
        SYNCWARP();
        int NA = r1[0] - r0[0] + 1, NB = r1[1] - r0[1] + 1, NK = r1[2] - r0[2] + 1;
        int CK = NK < CAP / 4 ? NK : CAP / 4;
        int CB = CAP / (2 * CK) - 1; if (CB > NB) CB = NB;
        int CA = CAP / ((CB + 1) * CK) - 1; if (CA > NA) CA = NA;
        for (int k0 = r0[2]; k0 <= r1[2]; k0 += CK) {
            int kn = r1[2] - k0 + 1 < CK ? r1[2] - k0 + 1 : CK;
            for (int b0 = r0[1]; b0 <= r1[1]; b0 += CB) {
                int bn = r1[1] - b0 + 1 < CB ? r1[1] - b0 + 1 : CB;
                for (int a0 = r0[0]; a0 <= r1[0]; a0 += CA) {
                    int an = r1[0] - a0 + 1 < CA ? r1[0] - a0 + 1 : CA;
                    int nphi = (an + 1) * (bn + 1) * kn;
                    for (int q0 = 0; q0 < nphi; q0 += nl)
                        if (q0 + lane < nphi) phi[q0 + lane] = 0;
                    SYNCWARP();
                    // lines x = a, y = b with a, b >= 1 (planes 0 lie below the tet)
                    int af = a0 > 1 ? a0 : 1, bf = b0 > 1 ? b0 : 1;
                    int la = a0 + an - af + 1, lb = b0 + bn - bf + 1;
                    // warp-uniform rounds of one line per lane, synchronised after each round
                    const int nlines = la * lb;
                    for (int q0 = 0; q0 < nlines; q0 += nl) {
                        const int q = q0 + lane;
                        if (q < nlines) {
                        int qa = q / lb, a = af + qa, b = bf + (q - qa * lb);
                        line_add((real)a, (real)b, S, k0, k0 + kn - 1,
                                 phi + ((a - a0) * (bn + 1) + (b - b0)) * kn, scr);
                        }
                        SYNCWARP();
                    }
                    const int ncell = an * bn * kn;
                    for (int q0 = 0; q0 < ncell; q0 += nl) {
                        const int q = q0 + lane;
                        if (q >= ncell) continue;
                        int r = q / kn, k = q - r * kn;
                        int i = r / bn, j = r - i * bn;
                        const acc_t* p = phi + (i * (bn + 1) + j) * kn + k;
                        acc_t w = p[(bn + 2) * kn] - p[(bn + 1) * kn] - p[kn] + p[0];
#if LATTICE_MASK
                        if (!(w > 0)) continue;
                        double lx = a0 + i, ly = b0 + j, lz = k0 + k;
                        bool out = false;
                        #pragma unroll
                        for (int f = 0; f < 4; ++f)
                            out |= S->nrm[f][0] * lx + S->nrm[f][1] * ly + S->nrm[f][2] * lz
                                   + S->offp[f] <= 0.0;
                        if (out) continue;
#else
                        if (w == 0) continue;
#endif
                        int gi, gj, gk;
                        if (periodic) {
                            gi = wrap_add(base[0], a0 + i, nx);
                            gj = wrap_add(base[1], b0 + j, ny);
                            gk = wrap_add(base[2], k0 + k, nz);
                        } else {
                            gi = base[0] + a0 + i; gj = base[1] + b0 + j; gk = base[2] + k0 + k;
                        }
                        ATOMIC_ADD(grid + ((long long)gi * ny + gj) * nz + gk, m * (double)w);
                    }
                    SYNCWARP();
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * WARPS)
deposit_lattice(const double* __restrict__ tets, const double* __restrict__ mass, double mconst,
                long long nt, double g0, double g1, double g2, double cs, int nx, int ny, int nz,
                int periodic, double* grid) {
    __shared__ acc_t phi[WARPS][CAP];
    __shared__ LatTet S[WARPS];
#if PQ_SMEM
    __shared__ real scr[WARPS * 32][24];
    real* my = scr[threadIdx.x];
#else
    real* my = 0;
#endif
    int w = threadIdx.x >> 5;
    lattice_body(tets, mass, mconst, nt, g0, g1, g2, cs, nx, ny, nz, periodic, grid,
                 threadIdx.x & 31, 32, (long long)blockIdx.x * WARPS + w,
                 (long long)gridDim.x * WARPS, phi[w], &S[w], my);
}
