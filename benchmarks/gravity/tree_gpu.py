"""Part (c) of the gravity benchmark: tree forces for N = 2^23 on one GPU.

Workload: a Hernquist sphere (a = 1, M = 1, G = 1) generated on the host with NumPy by
inverting ``M(<r) = r^2 / (r + a)^2`` (isotropic directions), truncated at ``r <= 100 a``
(98 % of the mass; the untruncated tail reaches ~2 a N and would leave ~80 % of the
particles in one level-21 Morton cell of the root). Same radial law as
``cosmo_dask.models.hernquist`` (positions only; velocities are not needed here).

Timing: end to end from CuPy positions on the device (build + walk + forces), CUDA events,
after a warm-up call, median of ``--repeat`` runs, and the median per phase. Accuracy:
relative force error against float64 direct summation on the GPU (a simple tiled float64
kernel) on a random subsample of ``--n-check`` particles. One JSON object per line.

    python -m benchmarks gravity-tree-gpu [--n 8388608] [--theta 0.5] [--repeat 5]
"""

from __future__ import annotations

import datetime
import statistics
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

_DIRECT = r"""
extern "C" __global__ void direct64(const double* __restrict__ pos,
    const double* __restrict__ m, const long long n, const long long* __restrict__ tgt,
    const int nt, const long long chunk, double* __restrict__ acc, double* __restrict__ pot)
{
    __shared__ double sx[128], sy[128], sz[128], sm[128];
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    long long i = t < nt ? tgt[t] : -1;
    double xi = 0, yi = 0, zi = 0;
    if (i >= 0) { xi = pos[3 * i]; yi = pos[3 * i + 1]; zi = pos[3 * i + 2]; }
    double ax = 0, ay = 0, az = 0, ph = 0;
    long long j0 = (long long)blockIdx.y * chunk, j1 = min(n, j0 + chunk);
    for (long long b = j0; b < j1; b += 128) {
        long long j = b + threadIdx.x;
        if (j < j1) { sx[threadIdx.x] = pos[3 * j]; sy[threadIdx.x] = pos[3 * j + 1];
                      sz[threadIdx.x] = pos[3 * j + 2]; sm[threadIdx.x] = m[j]; }
        __syncthreads();
        int nn = (int)min((long long)128, j1 - b);
        for (int k = 0; k < nn; ++k) {
            double dx = xi - sx[k], dy = yi - sy[k], dz = zi - sz[k];
            double r2 = dx * dx + dy * dy + dz * dz;
            if (b + k == i || r2 == 0.0) continue;
            double inv = 1.0 / sqrt(r2), mi3 = sm[k] * inv * inv * inv;
            ax -= mi3 * dx; ay -= mi3 * dy; az -= mi3 * dz; ph -= sm[k] * inv;
        }
        __syncthreads();
    }
    if (i >= 0) {
        atomicAdd(&acc[3 * t], ax); atomicAdd(&acc[3 * t + 1], ay);
        atomicAdd(&acc[3 * t + 2], az); atomicAdd(&pot[t], ph);
    }
}
"""


def hernquist_positions(n: int, seed: int, r_max: float = 100.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    umax = (r_max / (1.0 + r_max)) ** 2
    s = np.sqrt(rng.uniform(0.0, umax, n))
    r = s / (1.0 - s)
    v = rng.normal(size=(n, 3))
    v /= np.linalg.norm(v, axis=1)[:, None]
    return r[:, None] * v


def direct_gpu(cp, pos64, mass64, idx):
    mod = cp.RawModule(code=_DIRECT)
    f = mod.get_function("direct64")
    n, nt = pos64.shape[0], idx.shape[0]
    acc = cp.zeros((nt, 3), cp.float64)
    pot = cp.zeros(nt, cp.float64)
    splits = 128
    chunk = (n + splits - 1) // splits
    f(((nt + 127) // 128, splits), (128,),
      (pos64, mass64, np.int64(n), idx, np.int32(nt), np.int64(chunk), acc, pot))
    return acc, pot


def main(argv=None):
    import cupy as cp

    from cosmo_dask.gravity.tree.forces_gpu import _forces, _Timer

    ap = parser(__doc__, repeat=5, devices=("gpu",))
    ap.add_argument("--n", type=int, default=2**23)
    ap.add_argument("--theta", type=float, default=0.5)
    ap.add_argument("--n-check", type=int, default=10000)
    ap.add_argument("--precision", nargs="+", default=["float32", "float64"])
    ap.add_argument("--max-leaf", type=int, default=64)
    ap.add_argument("--max-group", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--block", type=int, default=None,
                    help="threads per group block (default: the module's BLOCK)")
    ap.add_argument("--sweep", default="",
                    help="extra float32 configurations max_leaf:max_group:block,...")
    a = ap.parse_args(argv)
    start(a, "gravity-tree-gpu")
    props = cp.cuda.runtime.getDeviceProperties(0)
    env = {"bench": "gravity_tree_gpu", "device": props["name"].decode(),
           "date": datetime.date.today().isoformat(), "cupy": cp.__version__}
    pos_h = hernquist_positions(a.n, a.seed)
    pos = cp.asarray(pos_h)
    mass = cp.full(a.n, 1.0 / a.n)
    idx = cp.asarray(np.sort(np.random.default_rng(a.seed + 1).choice(
        a.n, min(a.n_check, a.n), replace=False)))
    ref_acc, ref_pot = direct_gpu(cp, pos, mass, idx)
    cp.cuda.Device().synchronize()
    from cosmo_dask.gravity.tree.forces_gpu import BLOCK

    runs = [(p, a.max_leaf, a.max_group, a.block or BLOCK) for p in a.precision]
    for item in filter(None, a.sweep.split(",")):
        leaf, group, block = (int(v) for v in item.split(":"))
        runs.append(("float32", leaf, group, block))
    for prec, leaf, group, block in runs:
        kw = dict(G=1.0, theta=a.theta, softening=0.0, softening_kernel="plummer",
                  precision=prec, potential=True, max_leaf=leaf, max_group=group,
                  quadrupole=True, box_size=None, rs=None, r_cut=None, block=block)
        stats = {}
        acc, pot = _forces(pos, mass, stats=stats, **kw)  # warm-up (compiles) + counts
        totals, phases = [], []
        for _ in range(a.repeat):
            timer = _Timer()
            acc, pot = _forces(pos, mass, timer=timer, **kw)
            ph = timer.phases()
            phases.append(ph)
            totals.append(sum(ph.values()))
        err = cp.linalg.norm(acc[idx].astype(cp.float64) - ref_acc, axis=1) \
            / cp.linalg.norm(ref_acc, axis=1)
        perr = cp.abs(pot[idx].astype(cp.float64) - ref_pot) / cp.abs(ref_pot)
        err_h, perr_h = cp.asnumpy(err), cp.asnumpy(perr)
        rec = {**env, "workload": "hernquist_r100", "n": a.n, "theta": a.theta,
               "quadrupole": True, "precision": prec, "max_leaf": leaf,
               "max_group": group, "block": block, "repeat": a.repeat,
               "seconds": statistics.median(totals), "seconds_all": totals,
               "phases_median_s": {k: statistics.median(p[k] for p in phases)
                                   for k in phases[0]},
               "n_check": int(idx.shape[0]),
               "acc_err_median": float(np.median(err_h)),
               "acc_err_p99": float(np.percentile(err_h, 99)),
               "acc_err_max": float(err_h.max()),
               "pot_err_median": float(np.median(perr_h)),
               "pot_err_p99": float(np.percentile(perr_h, 99)),
               **{f"stat_{k}": v for k, v in stats.items()}}
        emit(rec)


if __name__ == "__main__":
    main()
