#!/usr/bin/env bash
# One call on the GPU host for MEX: the MEX tests (GPU and CPU), then the GPU
# timings (kernel level with CUDA events, and end to end through dask). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import scipy, cupy, numba; print(scipy.__version__, cupy.__version__, numba.__version__)" \
  | tee -a "$OUT/env.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_mex_gpu.py tests/test_mex.py \
  2>&1 | tee "$OUT/mex_tests.txt" | tail -25
{
  python3 benchmarks/bench_mex_part.py --device gpu --n 100000 1000000 --repeat 10
  python3 benchmarks/bench_mex_part.py --device gpu --n 1000000 --precision float32 --repeat 10
  python3 benchmarks/bench_mex_part.py --device gpu --n 1000000 --lmax 10 --repeat 5
  python3 benchmarks/bench_mex_part.py --device gpu --n 10000000 --repeat 3 --chunks 2500000
} 2>&1 | tee "$OUT/bench_mex_gpu.jsonl"
