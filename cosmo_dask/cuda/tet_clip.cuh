// cosmo_dask shared CUDA device math: the clip of a tetrahedron against a cube (see
// cosmo_dask/cuda/__init__.py); the including source typedefs real (float or double).
// Used by tet_cube_pairs (cosmo_dask.density.tet_volume_gpu) and the per-cell clip
// deposit kernels kept for comparison in benchmarks/tet_deposit_clip_gpu.py.
#ifndef COSMO_DASK_TET_CLIP_CUH
#define COSMO_DASK_TET_CLIP_CUH

#define STACK 16

__device__ __forceinline__ real det6(const real* s) {
    real ax = s[3] - s[0], ay = s[4] - s[1], az = s[5] - s[2];
    real bx = s[6] - s[0], by = s[7] - s[1], bz = s[8] - s[2];
    real cx = s[9] - s[0], cy = s[10] - s[1], cz = s[11] - s[2];
    return ax * (by * cz - bz * cy) - ay * (bx * cz - bz * cx) + az * (bx * cy - by * cx);
}

__device__ __forceinline__ void prism(const real* tmp, real* out) {
    // (a0 a1 a2 b0) (a1 a2 b0 b1) (a2 b0 b1 b2): consecutive windows of tmp[0..5]
    #pragma unroll
    for (int k = 0; k < 3; ++k)
        #pragma unroll
        for (int q = 0; q < 12; ++q) out[12 * k + q] = tmp[3 * k + q];
}

// volume of tetrahedron st[0..11] (cube-local) inside [0,h]^3
__device__ real clip_volume(real* st, int* lev, real h) {
    real vol = 0;
    int top = 1;
    lev[0] = 0;
    real cur[12], d[4], tmp[18];
    int in_[4], out_[4];
    while (top > 0) {
        --top;
        for (int q = 0; q < 12; ++q) cur[q] = st[12 * top + q];
        int level = lev[top];
        bool done = false;
        while (level < 6) {
            int ax = level >> 1, upper = level & 1;
            real plane = upper ? h : (real)0;
            int nin = 0, nout = 0;
            for (int v = 0; v < 4; ++v) {
                real dv = upper ? (h - cur[3 * v + ax]) : cur[3 * v + ax];
                d[v] = dv;
                if (dv > (real)0) in_[nin++] = v; else out_[nout++] = v;
            }
            if (nin == 0) { done = true; break; }
            if (nout == 0) { ++level; continue; }
            real* o = st + 12 * top;
            if (nin == 1) {
                int a = in_[0];
                for (int c = 0; c < 3; ++c) o[c] = cur[3 * a + c];
                for (int k = 0; k < 3; ++k) {
                    int b = out_[k];
                    real w = d[a] / (d[a] - d[b]);
                    for (int c = 0; c < 3; ++c)
                        o[3 * (k + 1) + c] = cur[3 * a + c] + w * (cur[3 * b + c] - cur[3 * a + c]);
                    o[3 * (k + 1) + ax] = plane;
                }
                lev[top] = level + 1;
                top += 1;
            } else if (nin == 2) {
                int a = in_[0], b = in_[1], c0 = out_[0], c1 = out_[1];
                real wa0 = d[a] / (d[a] - d[c0]);
                real wa1 = d[a] / (d[a] - d[c1]);
                real wb0 = d[b] / (d[b] - d[c0]);
                real wb1 = d[b] / (d[b] - d[c1]);
                for (int c = 0; c < 3; ++c) {
                    tmp[c] = cur[3 * a + c];
                    tmp[9 + c] = cur[3 * b + c];
                    tmp[3 + c] = cur[3 * a + c] + wa0 * (cur[3 * c0 + c] - cur[3 * a + c]);
                    tmp[6 + c] = cur[3 * a + c] + wa1 * (cur[3 * c1 + c] - cur[3 * a + c]);
                    tmp[12 + c] = cur[3 * b + c] + wb0 * (cur[3 * c0 + c] - cur[3 * b + c]);
                    tmp[15 + c] = cur[3 * b + c] + wb1 * (cur[3 * c1 + c] - cur[3 * b + c]);
                }
                tmp[3 + ax] = plane; tmp[6 + ax] = plane;
                tmp[12 + ax] = plane; tmp[15 + ax] = plane;
                prism(tmp, o);
                lev[top] = lev[top + 1] = lev[top + 2] = level + 1;
                top += 3;
            } else {
                int e = out_[0];
                for (int k = 0; k < 3; ++k) {
                    int a = in_[k];
                    real w = d[a] / (d[a] - d[e]);
                    for (int c = 0; c < 3; ++c) {
                        tmp[3 * k + c] = cur[3 * a + c];
                        tmp[3 * (k + 3) + c] =
                            cur[3 * a + c] + w * (cur[3 * e + c] - cur[3 * a + c]);
                    }
                    tmp[3 * (k + 3) + ax] = plane;
                }
                prism(tmp, o);
                lev[top] = lev[top + 1] = lev[top + 2] = level + 1;
                top += 3;
            }
            done = true;
            break;
        }
        if (done) continue;
        real v6 = det6(cur);
        vol += (v6 < 0 ? -v6 : v6) / (real)6;
    }
    return vol;
}

struct Tet {
    real v[12];
    real nrm[12];
    real off[4];
    real bmin[3], bmax[3];
    real vol;
};

__device__ void tet_setup(Tet& T) {
    const int F[4][3] = {{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1, 2}};
    for (int f = 0; f < 4; ++f) {
        int a = F[f][0], b = F[f][1], c = F[f][2];
        real ux = T.v[3*b] - T.v[3*a], uy = T.v[3*b+1] - T.v[3*a+1], uz = T.v[3*b+2] - T.v[3*a+2];
        real wx = T.v[3*c] - T.v[3*a], wy = T.v[3*c+1] - T.v[3*a+1], wz = T.v[3*c+2] - T.v[3*a+2];
        real nx = uy * wz - uz * wy, ny = uz * wx - ux * wz, nz = ux * wy - uy * wx;
        real o = -(nx * T.v[3*a] + ny * T.v[3*a+1] + nz * T.v[3*a+2]);
        real s = nx * T.v[3*f] + ny * T.v[3*f+1] + nz * T.v[3*f+2] + o;
        if (s < (real)0) { nx = -nx; ny = -ny; nz = -nz; o = -o; }
        T.nrm[3*f] = nx; T.nrm[3*f+1] = ny; T.nrm[3*f+2] = nz; T.off[f] = o;
    }
    real v6 = det6(T.v);
    T.vol = (v6 < 0 ? -v6 : v6) / (real)6;
    for (int c = 0; c < 3; ++c) {
        T.bmin[c] = fmin(fmin(T.v[c], T.v[3 + c]), fmin(T.v[6 + c], T.v[9 + c]));
        T.bmax[c] = fmax(fmax(T.v[c], T.v[3 + c]), fmax(T.v[6 + c], T.v[9 + c]));
    }
}

// fast paths: returns >= 0 when decided, -1 when a clip is needed
__device__ real fast_volume(const Tet& T, const real* lo, real h) {
    bool inside_box = true;
    for (int c = 0; c < 3; ++c) {
        if (T.bmax[c] <= lo[c] || T.bmin[c] >= lo[c] + h) return 0;
        if (T.bmin[c] < lo[c] || T.bmax[c] > lo[c] + h) inside_box = false;
    }
    if (inside_box) return T.vol;
    if (T.vol == (real)0) return 0;
    bool all_in = true;
    for (int f = 0; f < 4; ++f) {
        real base = T.nrm[3*f] * lo[0] + T.nrm[3*f+1] * lo[1] + T.nrm[3*f+2] * lo[2] + T.off[f];
        real pos = 0, neg = 0;
        for (int c = 0; c < 3; ++c) {
            real t = T.nrm[3*f + c] * h;
            if (t > (real)0) pos += t; else neg += t;
        }
        if (base + pos <= (real)0) return 0;
        if (base + neg < (real)0) all_in = false;
    }
    if (all_in) return h * h * h;
    return -1;
}

__device__ real slow_volume(const Tet& T, const real* lo, real h) {
    real st[12 * STACK];
    int lev[STACK];
    for (int k = 0; k < 4; ++k)
        for (int c = 0; c < 3; ++c) st[3 * k + c] = T.v[3 * k + c] - lo[c];
    return clip_volume(st, lev, h);
}

#endif
