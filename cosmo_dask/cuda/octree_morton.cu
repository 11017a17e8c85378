// Device functions of the Morton-key elementwise kernel of cosmo_dask.spatial.octree_gpu
// (its preamble: cosmo_dask.cuda.source("octree_morton")). No defines.
__device__ __forceinline__ unsigned long long spread21(unsigned long long v) {
    v &= 0x1fffffULL;
    v = (v | (v << 32)) & 0x1f00000000ffffULL;
    v = (v | (v << 16)) & 0x1f0000ff0000ffULL;
    v = (v | (v << 8)) & 0x100f00f00f00f00fULL;
    v = (v | (v << 4)) & 0x10c30c30c30c30c3ULL;
    v = (v | (v << 2)) & 0x1249249249249249ULL;
    return v;
}
__device__ __forceinline__ unsigned long long cell21(double x, double lo, double scale) {
    double f = floor((x - lo) * scale);
    if (!(f > 0.0)) f = 0.0;                 // also maps NaN to 0 (inputs are checked)
    if (f > 2097151.0) f = 2097151.0;
    return (unsigned long long)f;
}
