// The simulation integrator's per-chunk updates on the GPU
// (cosmo_dask.simulation.integrator_kernels_gpu): one thread per coordinate, one pass,
// the NumPy kernels' arithmetic in their order (compiled with --fmad=false), so the
// values are theirs bit for bit. Defines: POS_T, MOM_T (drift: positions, momenta),
// KICK_T (kick: momenta and accelerations of one dtype), "float" or "double".

// out = wrap(double(pos) + double(mom) * factor) into [0, box), cast to POS_T; a value
// that rounds up past hi (the largest POS_T below box, as a double) becomes 0. The wrap is
// NumPy's floored remainder for box > 0: fmod, plus box when negative, +0 for 0.
extern "C" __global__ void drift(const POS_T* __restrict__ pos, const MOM_T* __restrict__ mom,
                                 const long long n, const double factor, const double box,
                                 const double hi, POS_T* __restrict__ out)
{
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        const double step = (double)mom[t] * factor;
        const double x = (double)pos[t] + step;
        double r = fmod(x, box);
        if (r != 0.0) {
            if (r < 0.0) r += box;
        } else {
            r = 0.0;
        }
        POS_T o = (POS_T)r;
        if ((double)o > hi) o = (POS_T)0;
        out[t] = o;
    }
}

// out = mom + acc * (KICK_T)factor, in KICK_T.
extern "C" __global__ void kick(const KICK_T* __restrict__ mom, const KICK_T* __restrict__ acc,
                                const long long n, const double factor,
                                KICK_T* __restrict__ out)
{
    const KICK_T f = (KICK_T)factor;
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        const KICK_T g = acc[t] * f;
        out[t] = mom[t] + g;
    }
}
