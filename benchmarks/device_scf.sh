#!/usr/bin/env bash
# One call on the GPU host for SCF: the SCF tests (GPU and CPU), then the GPU timings
# (kernel level with CUDA events, end to end through dask) and accuracy. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/scf_env.txt"
python3 -c "import scipy, cupy, numba; print(scipy.__version__, cupy.__version__, numba.__version__)" \
  | tee -a "$OUT/scf_env.txt"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs -s tests/test_scf_gpu.py tests/test_scf.py \
  2>&1 | tee "$OUT/scf_tests.txt" | tail -30
timeout 150 python3 benchmarks/bench_expansion.py --device gpu --n 1000000 10000000 --repeat 20 --cpu-check \
  2>&1 | tee "$OUT/bench_scf_gpu.jsonl"
