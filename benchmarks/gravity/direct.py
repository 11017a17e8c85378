"""Direct-summation gravity throughput (issue 4, benchmark part (a)).

Prints one JSON object per measurement:

* ``p2p_gpu``: all-pairs P2P on one GPU (``p2p_block_gpu``, whole call: packing,
  kernel, split reduction), pair interactions per second = N * N / seconds,
  float32 and float64, N = 2**18 and 2**20, Plummer softening, with and without
  the potential; CUDA events, warm-up, median of ``--repeat``. The float32
  accuracy against the float64 kernel (validated against NumPy in the tests) is
  given on a subsample of targets.
* ``p2p_gpu_sweep`` (``--sweep``): launch shapes (threads, targets per thread).
* ``truncated_gpu`` / ``truncated_cpu``: the truncated TreePM kernel with exact
  erfc vs the 512-node table at Taylor levels 0..4 (speed gain = exact time /
  table time), with every pair inside the table (x <= 1.8), force only.
* ``truncated_table_error``: the table's max relative error per level on [0, 3].
* ``p2p_issue_bound`` (``--issue-bound``, no GPU needed): instructions per pair of the
  float32 tile loop (NVRTC's PTX, its largest basic block) and the pairs/s one
  instruction per scheduler and clock allows; the ``p2p_gpu`` float32 rows at 2^20 carry
  the SM clock sampled under load.

    python -m benchmarks gravity-direct [--sweep] [--repeat 5] [--no-cpu]
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import cuda_event_seconds, emit, parser, start  # noqa: E402


def plummer_sphere(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = 1.0 / np.sqrt(rng.uniform(1e-4, 1.0, n) ** (-2.0 / 3.0) - 1.0)
    v = rng.normal(size=(n, 3))
    x = v / np.linalg.norm(v, axis=1)[:, None] * r[:, None]
    return x, np.full(n, 1.0 / n)


def hot_loop_mix(ptx: str) -> dict:
    """The instruction mix of the largest basic block of a PTX listing, from its label to
    its first branch (the unrolled tile loop of ``p2p_tile``): counts per opcode
    (``fma``, ``sub``, ``mul``, ``add``, ``rsqrt``, ``ld`` ...)."""
    import collections
    import re

    blocks, cur = [], None
    for line in ptx.splitlines():
        if re.match(r"^\$L__BB", line):
            cur = []
            blocks.append(cur)
        elif cur is not None:
            op = line.strip().split(" ")[0].split("\t")[0].rstrip(";")
            if op.startswith("@") or op == "bra" or op.startswith("bra."):
                cur = None  # the loop's branch ends it (what follows runs once per tile)
            elif op and not op.startswith(("//", ".")) and not op.endswith(":"):
                cur.append(op.split(".")[0])
    return dict(collections.Counter(max(blocks, key=len)))


def nvrtc_ptx(source: str, options) -> str:
    """PTX of a CUDA source by NVRTC through ctypes: no GPU needed, only the
    ``nvidia-cuda-nvrtc-cu12`` wheel (the ``bench`` extra)."""
    import ctypes
    import os

    import nvidia.cuda_nvrtc

    lib = ctypes.CDLL(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib",
                                   "libnvrtc.so.12"))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"p2p.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [o.encode() for o in options]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    if rc:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC: {log.value.decode()[:500]}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def issue_bound(env, potential: bool, *, arch: int = 90, sms: int = 132,
                clock_hz: float = 1.98e9) -> dict:
    """Instructions per pair of the float32 Plummer tile loop (NVRTC's PTX of ``p2p.cu`` for
    ``compute_<arch>``, ``-ftz=true``, the default launch shape) and the pairs/s they
    allow: each of an SM's four schedulers issues one warp instruction (32 lanes) per
    clock, so pairs/s <= SMs x 4 x 32 x clock / (instructions per pair). Defaults: an H200
    (132 SMs; 1.98 GHz, the SM clock ``nvidia-smi`` reported under the P2P load)."""
    from cosmo_dask import cuda
    from cosmo_dask.gravity.p2p_kernels_gpu import (
        DEFAULT_PER_THREAD,
        DEFAULT_THREADS,
        DEFAULT_UNROLL,
        kernel_defines,
    )

    threads, per, unroll = DEFAULT_THREADS["float32"], DEFAULT_PER_THREAD["float32"], \
        DEFAULT_UNROLL
    defines = kernel_defines(np.float32, threads=threads, per_thread=per, unroll=unroll,
                             kernel=0, trunc=0, level=-1, periodic=False,
                             potential=potential, check=False, excl=1)
    ptx = nvrtc_ptx(cuda.source("p2p", defines), (f"-arch=compute_{arch}", *cuda.OPTIONS,
                                                  "-ftz=true", *cuda.include_options()))
    mix = hot_loop_mix(ptx)
    pairs = per * unroll
    slots = sum(v for k, v in mix.items() if k != "ld") / pairs  # + 1 shared load per 4 pairs
    return dict(env, workload="p2p_issue_bound", potential=potential, arch=arch,
                hot_loop_mix=mix, pairs_per_iteration=pairs,
                instructions_per_pair=round(slots, 3), sms=sms, sm_clock_hz=clock_hz,
                issue_bound_pairs_per_s=sms * 4 * 32 * clock_hz / slots)


def sampled_sm_clock(fn, seconds: float = 3.0) -> float | None:
    """Median SM clock (Hz) that ``nvidia-smi`` reports while ``fn()`` runs back to back
    for about ``seconds``; None without nvidia-smi."""
    import shutil
    import subprocess

    import cupy

    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                             "-lms", "200", "-i", str(cupy.cuda.Device().id)],
                            stdout=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        cupy.cuda.Device().synchronize()
    proc.terminate()
    out = proc.communicate()[0].split()
    vals = sorted(float(v) for v in out if v.replace(".", "").isdigit())
    return statistics.median(vals[len(vals) // 4:]) * 1e6 if vals else None


def bench_gpu(env, args):
    import cupy

    from cosmo_dask.gravity.dispatch import p2p_block  # p2p_block_gpu on CuPy arrays

    env = dict(env, device=cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for logn in (18, 20):
        n = 2 ** logn
        x, m = plummer_sphere(n)
        xd, md = cupy.asarray(x), cupy.asarray(m)
        ref = None
        for prec in ("float64", "float32"):
            for pot in (True, False):
                if prec == "float64" and not pot and logn == 20:
                    continue

                def call(prec=prec, pot=pot, xd=xd, md=md):
                    return p2p_block(xd, xd, md, softening=1e-3, precision=prec,
                                     potential=pot, exclude="index")

                rep = args.repeat if prec == "float32" or logn == 18 else 3
                t = cuda_event_seconds(call, rep, warm=1)[0]
                fields = dict(workload="p2p_gpu", n=n, precision=prec, potential=pot,
                              kernel="plummer", seconds=t, pairs_per_s=n * n / t)
                if prec == "float32" and logn == 20:
                    fields["sm_clock_hz_under_load"] = sampled_sm_clock(call)
                if pot:
                    a, p = call()
                    if prec == "float64":
                        ref = (a[::997].get(), p[::997].get())
                    else:
                        ea = np.linalg.norm(a[::997].get() - ref[0], axis=1) / \
                            np.linalg.norm(ref[0], axis=1)
                        ep = np.abs(p[::997].get() - ref[1]) / np.abs(ref[1])
                        fields.update(acc_rel_err_median=float(np.median(ea)),
                                      acc_rel_err_max=float(ea.max()),
                                      pot_rel_err_max=float(ep.max()))
                emit(env, **fields)
        if (args.sweep or args.shapes) and logn == args.sweep_logn:
            sweeps = (("float32", [(64, 8), (128, 2), (128, 4), (128, 8),
                                   (256, 4), (256, 8), (512, 4)]),
                      ("float64", [(128, 1), (128, 2), (128, 4), (256, 2)]))
            if not args.sweep:
                sweeps = (("float32", [tuple(int(v) for v in sh.split("x"))
                                       for sh in args.shapes.split(",")]),)
            for prec, shapes in sweeps:
                for threads, per in shapes:
                    for unroll in (4, 8, 16) if args.sweep and prec == "float32" and \
                            (threads, per) == (128, 4) else (8,):
                        def call(prec=prec, threads=threads, per=per, unroll=unroll, xd=xd,
                                 md=md):
                            return p2p_block(xd, xd, md, softening=1e-3, precision=prec,
                                                 potential=True, exclude="index",
                                                 threads=threads, per_thread=per,
                                                 unroll=unroll)
                        t = cuda_event_seconds(call, 3, warm=1)[0]
                        emit(env, workload="p2p_gpu_sweep", n=n, precision=prec, potential=True,
                             threads=threads, per_thread=per, unroll=unroll, seconds=t,
                             pairs_per_s=n * n / t)
        del xd, md
        cupy.get_default_memory_pool().free_all_blocks()

    # truncated kernel: exact erfc vs table levels, every pair inside the table
    n = 2 ** 18
    rng = np.random.default_rng(2)
    x = rng.uniform(0.0, 1.0, size=(n, 3))
    xd, md = cupy.asarray(x), cupy.asarray(np.full(n, 1.0 / n))
    for prec in ("float32", "float64"):
        base = None
        for level in (None, 0, 1, 2, 3, 4):
            def call(prec=prec, level=level):
                return p2p_block(xd, xd, md, softening=1e-4, precision=prec,
                                 potential=False, box_size=1.0, rs=0.25, r_cut=1.2,
                                 table_level=level, exclude="index")
            t = cuda_event_seconds(call, args.repeat, warm=1)[0]
            base = t if level is None else base
            emit(env, workload="truncated_gpu", n=n, precision=prec, potential=False,
                 table_level=level, seconds=t, pairs_per_s=n * n / t,
                 speedup_vs_exact=base / t)


def bench_cpu(env, args):
    import numba

    from cosmo_dask.gravity.p2p_kernels import p2p_block

    env = dict(env, device="cpu", threads=numba.get_num_threads())
    n = 4096
    rng = np.random.default_rng(2)
    x = rng.uniform(0.0, 1.0, size=(n, 3))
    m = np.full(n, 1.0 / n)
    for prec in ("float32", "float64"):
        base = None
        for level in (None, 0, 1, 2, 3, 4):
            def call(prec=prec, level=level):
                return p2p_block(x, x, m, softening=1e-4, precision=prec, potential=False,
                                 box_size=1.0, rs=0.25, r_cut=1.2, table_level=level,
                                 exclude="index")
            call()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t0)
            t = statistics.median(ts)
            base = t if level is None else base
            emit(env, workload="truncated_cpu", n=n, precision=prec, potential=False,
                 table_level=level, seconds=t, pairs_per_s=n * n / t,
                 speedup_vs_exact=base / t)


def main(argv=None):
    ap = parser(__doc__, repeat=5, devices=("gpu", "cpu"))  # cpu: the CPU rows only
    ap.add_argument("--sweep", action="store_true", help="also sweep GPU launch shapes")
    ap.add_argument("--sweep-logn", type=int, default=20)
    ap.add_argument("--shapes", default="", help="float32 launch shapes to time, e.g. 256x4,128x4")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--issue-bound", action="store_true",
                    help="only the P2P loop's instructions per pair and the pairs/s they allow "
                    "(NVRTC through the nvidia-cuda-nvrtc-cu12 wheel; no GPU needed)")
    args = ap.parse_args(argv)
    start(args, "gravity-direct")
    env = dict(bench="gravity_direct", date=datetime.date.today().isoformat())
    if args.issue_bound:
        for pot in (True, False):
            emit(**issue_bound(env, pot))
        return

    from cosmo_dask.gravity.truncated import table_relative_errors

    for dt in ("float64", "float32"):
        err = table_relative_errors(dtype=np.dtype(dt))
        emit(env, workload="truncated_table_error", precision=dt, n_samples=2**20 + 1,
             **{f"max_rel_err_level{lv}": e for lv, e in err.items()})
    if not args.no_gpu and args.device == "gpu":
        from cosmo_dask.core.backend import gpu_available

        if gpu_available():
            bench_gpu(env, args)
        else:
            emit(env, workload="p2p_gpu", skipped="no GPU")
    if not args.no_cpu:
        bench_cpu(env, args)


if __name__ == "__main__":
    main()
