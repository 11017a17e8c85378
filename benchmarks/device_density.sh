#!/usr/bin/env bash
# One call on the lent GPU host for the densities: install the carried wheels,
# run the gpu-marked tests, then the PSE deposit benchmark end to end on the GPU.
# Logs go to $OUT.   bash benchmarks/device_density.sh   (repo root, .whl carried)
#   DENSITY_TESTS=tests/...   restrict the test run (default: every gpu test)
#   DENSITY_BENCH="--n-side 128 --box 100"   arguments of bench_density.py
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu ${DENSITY_TESTS:-tests} -rfs 2>&1 \
  | tee "$OUT/gpu_tests.txt" | tail -8
python3 benchmarks/bench_density.py --device gpu --skip-strategy --repeat 3 \
  ${DENSITY_BENCH:---n-side 128 --box 100} 2>&1 | tee -a "$OUT/bench_density_gpu.jsonl" | tail -3
