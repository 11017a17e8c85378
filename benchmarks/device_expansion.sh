#!/usr/bin/env bash
# One call on the GPU host for the expansions: SCF and MEX tests (GPU and CPU), then
# GPU timings (kernel level with CUDA events, end to end through dask). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/expansion/test_scf.py \
  tests/expansion/test_mex.py 2>&1 | tee "$OUT/expansion_tests.txt" | tail -8
B="python3 benchmarks/bench_expansion.py --device gpu"
{
  $B --methods scf --n 1000000 10000000 100000000 --chunks 10000000 --repeat 20 --cpu-check
  $B --methods mex --n 1000000 --repeat 10
  $B --methods mex --n 1000000 --precision float32 --repeat 10
  $B --methods mex --n 1000000 --lmax 10 --repeat 5
  $B --methods mex --n 100000000 --precision float32 --chunks 10000000 --repeat 3
} 2>&1 | tee "$OUT/bench_expansion_gpu.jsonl"
