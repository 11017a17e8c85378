# Sourced on a GPU host instead of device_setup.sh, with .whl_ucx carried (built on the
# dev VM: the core wheels of .whl without h5py, plus distributed-ucxx, ucxx,
# libucxx, libucx (static libraries, perftest and tools removed so that all fits the
# 64 MiB a call carries), rmm, librmm, rapids-logger; cuda-core and cuda-bindings come
# from the host (the lent GPU hosts have both), or from .whl_ucx where the host lacks them).
# Installs them to /tmp/site, skipping cuda-bindings/cuda-core where the host has them
# (numba-cuda uses the host's), and sets PYTHONPATH; prints what UCX sees.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
wheels=$(python3 - <<'PY'
import glob, importlib.util
have = {"cuda_bindings": "cuda.bindings", "cuda_core": "cuda.core"}
skip = []
for prefix, mod in have.items():
    try:
        if importlib.util.find_spec(mod) is not None:
            skip.append(prefix)
    except ModuleNotFoundError:
        pass
import sys
print("host has:", skip or "neither", file=sys.stderr)
print(" ".join(w for w in sorted(glob.glob(".whl_ucx/*.whl"))
               if not any(w.split("/")[-1].startswith(p) for p in skip)))
PY
)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $wheels || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import ucxx, distributed_ucxx; print('ucxx', ucxx.__version__, 'ucx', ucxx.get_ucx_version())" \
  2>&1 | tee "$OUT/ucx_version.txt"
# a one-worker LocalCUDACluster over UCX (a file: worker processes re-import __main__)
cat > /tmp/ucx_probe.py <<'PY'
import logging, time
import dask.array as da
from dask_cuda import LocalCUDACluster
from distributed import Client
if __name__ == "__main__":
    t0 = time.time()
    with LocalCUDACluster(n_workers=1, protocol="ucx", dashboard_address=":0",
                          silence_logs=logging.WARNING) as cl, Client(cl) as c:
        import cupy
        x = da.random.random((2**24, 3), chunks=(2**22, 3)).map_blocks(cupy.asarray)
        print("ucx probe:", cl.scheduler_address, "sum", float(x.sum().compute()),
              "workers", list(c.scheduler_info()["workers"]), round(time.time() - t0, 1), "s")
PY
timeout 120 python3 /tmp/ucx_probe.py > "$OUT/ucx_probe.txt" 2>&1
grep -E "ucx probe|Error" "$OUT/ucx_probe.txt" | head -5
