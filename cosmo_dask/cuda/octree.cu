// Octree construction (cosmo_dask.spatial.octree_gpu): child ranges, multipoles,
// bmax. No defines.
extern "C" __global__ void child_bounds(
    const unsigned long long* __restrict__ keys, const long long* __restrict__ pstart,
    const long long* __restrict__ pcount, const int n_parent, const int shift,
    long long* __restrict__ bounds)
{
    // bounds[p*9 + c], c = 0..8: first sorted index of octant c of parent p (c = 8: end)
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_parent * 9) return;
    int p = t / 9, c = t - 9 * (t / 9);
    long long s = pstart[p], e = s + pcount[p];
    if (c == 8) { bounds[t] = e; return; }
    if (c == 0) { bounds[t] = s; return; }
    unsigned long long pre = (keys[s] >> (shift + 3)) << 3;
    unsigned long long target = (pre | (unsigned long long)c) << shift;
    long long lo = s, hi = e;          // lower bound of target in keys[s:e]
    while (lo < hi) {
        long long mid = (lo + hi) >> 1;
        if (keys[mid] < target) lo = mid + 1; else hi = mid;
    }
    bounds[t] = lo;
}

__device__ __forceinline__ double wsum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double wmin(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmin(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double wmax(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

extern "C" __global__ void leaf_moments(
    const double* __restrict__ pos, const double* __restrict__ pm,
    const long long* __restrict__ leaves, const int n_leaf,
    const long long* __restrict__ start, const long long* __restrict__ count,
    double* __restrict__ mass, double* __restrict__ com, double* __restrict__ quad,
    double* __restrict__ s2, double* __restrict__ bmax, double* __restrict__ lo,
    double* __restrict__ hi)
{
    int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= n_leaf) return;              // uniform per warp
    long long nd = leaves[w], s = start[nd], c = count[nd];
    double m = 0, mx = 0, my = 0, mz = 0, sx = 0, sy = 0, sz = 0;
    double lx = 1e300, ly = 1e300, lz = 1e300, hx = -1e300, hy = -1e300, hz = -1e300;
    for (long long k = lane; k < c; k += 32) {
        long long i = s + k;
        double x = pos[3 * i], y = pos[3 * i + 1], z = pos[3 * i + 2], w_ = pm[i];
        m += w_; mx += w_ * x; my += w_ * y; mz += w_ * z; sx += x; sy += y; sz += z;
        lx = fmin(lx, x); ly = fmin(ly, y); lz = fmin(lz, z);
        hx = fmax(hx, x); hy = fmax(hy, y); hz = fmax(hz, z);
    }
    m = wsum(m); mx = wsum(mx); my = wsum(my); mz = wsum(mz);
    sx = wsum(sx); sy = wsum(sy); sz = wsum(sz);
    lx = wmin(lx); ly = wmin(ly); lz = wmin(lz); hx = wmax(hx); hy = wmax(hy); hz = wmax(hz);
    double cx, cy, cz;
    if (m > 0) { cx = mx / m; cy = my / m; cz = mz / m; }
    else { cx = sx / c; cy = sy / c; cz = sz / c; }
    double qxx = 0, qxy = 0, qxz = 0, qyy = 0, qyz = 0, qzz = 0, ss = 0, bb = 0;
    for (long long k = lane; k < c; k += 32) {
        long long i = s + k;
        double dx = pos[3 * i] - cx, dy = pos[3 * i + 1] - cy, dz = pos[3 * i + 2] - cz;
        double w_ = pm[i], d2 = dx * dx + dy * dy + dz * dz;
        qxx += w_ * (3 * dx * dx - d2); qxy += w_ * 3 * dx * dy; qxz += w_ * 3 * dx * dz;
        qyy += w_ * (3 * dy * dy - d2); qyz += w_ * 3 * dy * dz; qzz += w_ * (3 * dz * dz - d2);
        ss += w_ * d2; bb = fmax(bb, d2);
    }
    qxx = wsum(qxx); qxy = wsum(qxy); qxz = wsum(qxz); qyy = wsum(qyy); qyz = wsum(qyz);
    qzz = wsum(qzz); ss = wsum(ss); bb = wmax(bb);
    if (lane == 0) {
        mass[nd] = m; com[3 * nd] = cx; com[3 * nd + 1] = cy; com[3 * nd + 2] = cz;
        quad[6 * nd] = qxx; quad[6 * nd + 1] = qxy; quad[6 * nd + 2] = qxz;
        quad[6 * nd + 3] = qyy; quad[6 * nd + 4] = qyz; quad[6 * nd + 5] = qzz;
        s2[nd] = ss; bmax[nd] = sqrt(bb);
        lo[3 * nd] = lx; lo[3 * nd + 1] = ly; lo[3 * nd + 2] = lz;
        hi[3 * nd] = hx; hi[3 * nd + 1] = hy; hi[3 * nd + 2] = hz;
    }
}

extern "C" __global__ void parent_moments(
    const long long* __restrict__ nodes, const int n, const long long* __restrict__ fchild,
    const signed char* __restrict__ nchild, const long long* __restrict__ count,
    double* __restrict__ mass, double* __restrict__ com, double* __restrict__ quad,
    double* __restrict__ s2, double* __restrict__ lo, double* __restrict__ hi)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    long long nd = nodes[t], f = fchild[nd];
    int k = nchild[nd];
    double m = 0, mx = 0, my = 0, mz = 0, sx = 0, sy = 0, sz = 0;
    double l[3] = {1e300, 1e300, 1e300}, h[3] = {-1e300, -1e300, -1e300};
    for (int q = 0; q < k; ++q) {
        long long ch = f + q;
        double w_ = mass[ch], cn = (double)count[ch];
        m += w_; mx += w_ * com[3 * ch]; my += w_ * com[3 * ch + 1]; mz += w_ * com[3 * ch + 2];
        // unweighted mean of the particles (used only for massless nodes)
        sx += cn * com[3 * ch]; sy += cn * com[3 * ch + 1]; sz += cn * com[3 * ch + 2];
        for (int a = 0; a < 3; ++a) {
            l[a] = fmin(l[a], lo[3 * ch + a]); h[a] = fmax(h[a], hi[3 * ch + a]);
        }
    }
    double cx, cy, cz;
    if (m > 0) { cx = mx / m; cy = my / m; cz = mz / m; }
    else { double cn = (double)count[nd]; cx = sx / cn; cy = sy / cn; cz = sz / cn; }
    double q6[6] = {0, 0, 0, 0, 0, 0}, ss = 0;
    for (int q = 0; q < k; ++q) {
        long long ch = f + q;
        double w_ = mass[ch];
        double dx = com[3 * ch] - cx, dy = com[3 * ch + 1] - cy, dz = com[3 * ch + 2] - cz;
        double d2 = dx * dx + dy * dy + dz * dz;
        q6[0] += quad[6 * ch] + w_ * (3 * dx * dx - d2);
        q6[1] += quad[6 * ch + 1] + w_ * 3 * dx * dy;
        q6[2] += quad[6 * ch + 2] + w_ * 3 * dx * dz;
        q6[3] += quad[6 * ch + 3] + w_ * (3 * dy * dy - d2);
        q6[4] += quad[6 * ch + 4] + w_ * 3 * dy * dz;
        q6[5] += quad[6 * ch + 5] + w_ * (3 * dz * dz - d2);
        ss += s2[ch] + w_ * d2;
    }
    mass[nd] = m; com[3 * nd] = cx; com[3 * nd + 1] = cy; com[3 * nd + 2] = cz;
    for (int a = 0; a < 6; ++a) quad[6 * nd + a] = q6[a];
    s2[nd] = ss;
    for (int a = 0; a < 3; ++a) { lo[3 * nd + a] = l[a]; hi[3 * nd + a] = h[a]; }
}

extern "C" __global__ void node_bmax(
    const double* __restrict__ pos, const long long* __restrict__ nodes,
    const long long* __restrict__ start, const long long* __restrict__ count,
    const double* __restrict__ com, double* __restrict__ bmax)
{
    // one block (256 threads) per node: exact max distance of its particles from com
    __shared__ double red[8];
    long long nd = nodes[blockIdx.x], s = start[nd], c = count[nd];
    double cx = com[3 * nd], cy = com[3 * nd + 1], cz = com[3 * nd + 2], bb = 0;
    for (long long k = threadIdx.x; k < c; k += blockDim.x) {
        long long i = s + k;
        double dx = pos[3 * i] - cx, dy = pos[3 * i + 1] - cy, dz = pos[3 * i + 2] - cz;
        bb = fmax(bb, dx * dx + dy * dy + dz * dz);
    }
    bb = wmax(bb);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = bb;
    __syncthreads();
    if (threadIdx.x < 32) {
        bb = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0;
        bb = wmax(bb);
        if (threadIdx.x == 0) bmax[nd] = sqrt(bb);
    }
}
