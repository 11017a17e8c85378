#!/usr/bin/env bash
# One call on the lent GPU host: install the carried wheels, run the gpu-marked
# tests (and the rest of the suite), then the I/O benchmark on CPU and GPU.
# Logs go to $OUT (the device tool brings them back).
#   bash benchmarks/device_run.sh            (from the repo root, with .whl carried)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, numpy, cupy, dask, distributed, zarr; print(sys.version.split()[0],
numpy.__version__, cupy.__version__, dask.__version__, distributed.__version__, zarr.__version__)"
  for m in scipy h5py numba xarray dask_cuda pynvml rmm pytest_timeout; do
    python3 -c "import $m; print('$m', getattr($m, '__version__', 'ok'))" 2>&1 | tail -1; done
} 2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/core/test_backend.py tests/core/test_cluster.py tests/store/test_snapshot.py tests/models/test_zeldovich.py -rs 2>&1 | tee "$OUT/gpu_tests.txt" | tail -15
python3 -m pytest -q -p no:cacheprovider tests -m "not gpu" -rf 2>&1 | tee "$OUT/cpu_tests.txt" | tail -6
python3 benchmarks/bench_io.py --device gpu --repeat 7 2>&1 | tee "$OUT/bench_io_gpu.jsonl" | tail -1
python3 benchmarks/bench_io.py --device cpu --repeat 7 2>&1 | tee "$OUT/bench_io_cpu.jsonl" | tail -1
