#!/usr/bin/env bash
# One call on the GPU host for the halo and expansion kernel contracts (issue 15 item 2),
# logs under $OUT:
#   1. the gpu-marked tests of the contracts (tests/test_kernel_contracts_{halos,expansion}.py:
#      each contract called with CuPy chunks against its float64 reference and the CPU
#      kernel) and of every GPU call site changed (FOF graph and catalog on CuPy snapshots,
#      the centre kernels, SCF and MEX on CuPy chunks, the FOF CUDA source);
#   2. timings through the changed call sites, medians: FOF at 256^3 clustered (the kernel,
#      fof_labels, and the catalog with MBP and MCP centres against bare fof_labels) and
#      SCF / MEX fits and evaluations at 1e6 particles;
#      with BASELINE=<git ref> (e.g. BASELINE=main, needs git and the ref in the copy) the
#      same timings of that ref run first in a worktree of it, on the same card.
# About 6 minutes on one H100/H200; every step has its own time limit.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
HERE=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/env.txt"

PYTHONPATH=/tmp/site:$HERE timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu -rs \
  --durations=10 tests/test_kernel_contracts_halos.py tests/test_kernel_contracts_expansion.py \
  tests/test_center_kernels.py tests/test_gpu_halos.py tests/test_fof_kernels_gpu.py \
  tests/test_scf_gpu.py tests/test_mex_gpu.py tests/test_cli_gpu_pipeline.py \
  2>&1 | tee "$OUT/gpu_tests.txt" | tail -25

timings() {  # $1: tree to run in, $2: label of the log files
  ( cd "$1" && export PYTHONPATH=/tmp/site:$1
    { timeout 100 python3 benchmarks/bench_halos.py --device gpu --n-side 256 \
        --kinds clustered --repeat 5 --no-store
      timeout 100 python3 benchmarks/bench_halos.py --device gpu --n-side 256 \
        --kinds clustered --repeat 5 --catalog; } 2>&1 | tee "$OUT/bench_halos_gpu_$2.jsonl"
    B="timeout 60 python3 benchmarks/bench_expansion.py --device gpu --n 1000000"
    { $B --methods scf --repeat 10; $B --methods mex --repeat 5; } \
      2>&1 | tee "$OUT/bench_expansion_gpu_$2.jsonl" )
}
if [ -n "${BASELINE:-}" ]; then
  if git worktree add -f /tmp/baseline "$BASELINE" >/dev/null 2>&1; then
    timings /tmp/baseline "baseline"
  else
    echo "no worktree of $BASELINE here: baseline skipped" | tee "$OUT/baseline_skipped.txt"
  fi
fi
timings "$HERE" "branch"
