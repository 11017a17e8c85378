"""CUDA C kernels run on the host, for tests on machines without a GPU.

:func:`host_kernels` compiles a kernel source of the package, ``cosmo_dask/cuda/<name>.cu``
with its defines, from the very text the GPU compiles (:func:`cosmo_dask.cuda.source`);
:class:`HostKernels` takes any source text (test kernels of the shared headers).
The kernel source is compiled as C++ (g++, no fused multiply-adds, the shared headers of
:mod:`cosmo_dask.cuda` on the include path) with a small shim:
``__global__``/``__device__`` vanish, ``blockIdx``/``threadIdx``/``blockDim``/``gridDim``
are per-thread variables set before each call, atomics are GCC builtins, ``rsqrt`` is
``1 / sqrt``, and a warp has one lane (``__ballot_sync`` and ``__match_any_sync`` answer
for this lane only; a lane is ``threadIdx.x % 32``, so at most 32 threads per launch
here). Each ``extern "C"`` kernel is
called through ctypes with NumPy arrays and NumPy scalars (``np.int64`` -> ``long long``,
``np.int32`` -> ``int``, ``np.float64`` -> ``double``). Kernels must use grid-stride
loops (every launch here covers all items whatever the thread count).

Every launch checks its arguments against the kernel's declared parameters (typedefs
resolved): a pointer takes a C-contiguous array of that element type, ``long long``
(``i64``) an ``np.int64``, ``int`` an ``np.int32``, ``double`` an ``np.float64``, as
CuPy needs them to lay out the parameter buffer.

``order`` picks how a launch runs: ``"serial"`` (one thread does every item in order),
``"reversed"`` (``threads`` threads one after the other, the last first), or
``"concurrent"`` (``threads`` OS threads at once: ctypes releases the GIL, so atomics
and benign races run for real). Results that must not depend on thread order are
checked under each.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from cosmo_dask import cuda
from cosmo_dask.cuda import HEADER_DIR, HEADERS, header_text

SHIM = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
struct host_dim3 { unsigned x, y, z; };
static thread_local host_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static thread_local host_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
extern "C" void host_launch_index(unsigned b, unsigned t, unsigned nb, unsigned nt)
{
    blockIdx.x = b; threadIdx.x = t; gridDim.x = nb; blockDim.x = nt;
}
inline int atomicCAS(int* p, int c, int v) { return __sync_val_compare_and_swap(p, c, v); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c,
                                    unsigned long long v)
{
    return __sync_val_compare_and_swap(p, c, v);
}
template <class T> inline T host_atomic_min(T* p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old) {
        const T prev = __sync_val_compare_and_swap(p, old, v);
        if (prev == old) break;
        old = prev;
    }
    return old;
}
inline int atomicMin(int* p, int v) { return host_atomic_min(p, v); }
inline long long atomicMin(long long* p, long long v) { return host_atomic_min(p, v); }
template <class T> inline T host_atomic_max(T* p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old) {
        const T prev = __sync_val_compare_and_swap(p, old, v);
        if (prev == old) break;
        old = prev;
    }
    return old;
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v)
{
    return host_atomic_max(p, v);
}
inline long long __double_as_longlong(double x)
{
    long long r;
    std::memcpy(&r, &x, sizeof r);
    return r;
}
inline int atomicOr(int* p, int v) { return __sync_fetch_and_or(p, v); }
inline int atomicAdd(int* p, int v) { return __sync_fetch_and_add(p, v); }
inline unsigned __ballot_sync(unsigned, bool p) { return p ? 1u << (threadIdx.x & 31) : 0u; }
template <class T> inline unsigned __match_any_sync(unsigned, T)
{
    return 1u << (threadIdx.x & 31);
}
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
"""


def compiler() -> str | None:
    """The C++ compiler used (``g++``), or None when there is none."""
    return shutil.which("g++")


@functools.cache
def _library(source: str) -> ctypes.CDLL:
    headers = "".join(header_text(h) for h in HEADERS)   # what #include "x.cuh" reads
    tag = hashlib.sha256((SHIM + source + headers).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "cosmo_dask_cuda_host"
    folder.mkdir(exist_ok=True)
    lib = folder / f"k{tag}.so"
    if not lib.exists():
        src = folder / f"k{tag}.cpp"
        src.write_text(SHIM + source)
        tmp = folder / f"k{tag}.{threading.get_ident()}.so"
        subprocess.run([compiler(), "-O1", "-std=c++17", "-shared", "-fPIC",
                        "-ffp-contract=off", f"-I{HEADER_DIR}", str(src), "-o", str(tmp)],
                       check=True, capture_output=True, text=True)
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


def _argument(a):
    if isinstance(a, np.ndarray):
        if not a.flags.c_contiguous:
            raise ValueError("kernel arguments must be C-contiguous arrays")
        return ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, np.int64):
        return ctypes.c_longlong(int(a))
    if isinstance(a, np.int32):
        return ctypes.c_int(int(a))
    if isinstance(a, np.float64):
        return ctypes.c_double(float(a))
    raise TypeError(f"unsupported kernel argument type {type(a).__name__}")


_C_TYPES = {"double": np.float64, "float": np.float32, "long long": np.int64,
            "unsigned long long": np.uint64, "int": np.int32, "unsigned int": np.uint32,
            "unsigned char": np.uint8, "bool": np.bool_}


@functools.cache
def signatures(source: str) -> dict:
    """``name -> [(numpy type, is pointer), ...]`` of every ``extern "C"`` kernel."""
    typedefs = dict((b, a) for a, b in re.findall(r"typedef\s+([\w ]+?)\s+(\w+)\s*;", source))
    # types given as defines (``#define COORD_T double`` before ``typedef COORD_T coord_t;``)
    typedefs.update(re.findall(r"^#define\s+(\w+)\s+([\w ]+?)\s*$", source, flags=re.M))

    def resolve(t):
        while t in typedefs:
            t = typedefs[t]
        return _C_TYPES[t]

    out = {}
    for name, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', source):
        sig = []
        for p in params.split(","):
            p = re.sub(r"\b(const|__restrict__)\b", " ", p).strip()
            pointer = "*" in p
            ctype = " ".join(p.replace("*", " ").split()[:-1])
            sig.append((resolve(ctype), pointer))
        out[name] = sig
    return out


def host_kernels(name: str, defines=(), order: str = "serial", threads: int = 7):
    """The kernels of the package's ``cosmo_dask/cuda/<name>.cu`` with ``defines`` (the text
    :func:`cosmo_dask.cuda.source` gives the GPU), run on the host."""
    return HostKernels(cuda.source(name, defines), order, threads)


class HostKernels:
    """The kernels of one CUDA source, run on the host (see the module docstring)."""

    def __init__(self, source: str, order: str = "serial", threads: int = 7):
        if not 1 <= threads <= 32:
            raise ValueError("threads must be 1..32 (one warp)")
        self.lib = _library(source)
        self.signatures = signatures(source)
        self.order = order
        self.threads = threads

    def __getitem__(self, name: str):
        fn = getattr(self.lib, name)
        fn.restype = None
        return functools.partial(self._launch, name, fn)

    def _launch(self, name, fn, grid, block, args):
        sig = self.signatures[name]
        if len(args) != len(sig):
            raise TypeError(f"{name}: {len(args)} arguments for {len(sig)} parameters")
        for k, (a, (ctype, pointer)) in enumerate(zip(args, sig, strict=True)):
            if pointer:
                ok = isinstance(a, np.ndarray) and a.dtype == ctype
            else:
                ok = type(a) is ctype
            if not ok:
                got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
                raise TypeError(f"{name}: argument {k} is {got}, the kernel takes "
                                f"{np.dtype(ctype)}{' *' if pointer else ''}")
        cargs = [_argument(a) for a in args]
        lib = self.lib
        if self.order == "serial":
            lib.host_launch_index(0, 0, 1, 1)
            fn(*cargs)
            return
        n = self.threads
        if self.order == "reversed":
            for t in reversed(range(n)):
                lib.host_launch_index(0, t, 1, n)
                fn(*cargs)
            return
        if self.order != "concurrent":
            raise ValueError(f"unknown order {self.order!r}")

        def run(t):
            lib.host_launch_index(0, t, 1, n)
            fn(*cargs)

        workers = [threading.Thread(target=run, args=(t,)) for t in range(n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
