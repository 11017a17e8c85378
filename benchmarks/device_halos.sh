#!/usr/bin/env bash
# One call on the GPU host for the halo work (issue 18, items 1 and 3), logs under $OUT:
#   1. the gpu-marked halo tests (CUDA FOF kernel and per-group rows against the CPU
#      kernel and scipy, GPU fof_labels and catalog against the references);
#   2. GPU FOF at 256^3 on the clustered, uniform and Plummer sets of bench_halos.py:
#      the kernel alone (dense-cell path, stage times, peak GPU memory; the friend-
#      counting path beside it), fof_labels from device-resident data, and end to end
#      from a Zarr store with the store read timed alone; medians of 5; labels checked
#      equal to the CPU kernel's and the CPU fof_labels';
#   3. a 512^3 clustered set: kernel and fof_labels times, peak GPU memory, the kernel's
#      labels checked against the CPU kernel's.
# About 4 minutes on one H100/H200; every step has its own time limit (5.5 min in all).
# HALO_GPU_EXTRA="--mbp --memory" adds the MBP and memory rows at 256^3 (about a minute),
# RUN_CPU=1 the CPU path against scipy (several minutes).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/env.txt"
timeout 140 python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 \
  tests/halos/test_fof_kernels.py tests/halos/test_fof.py 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
timeout 100 python3 benchmarks/bench_halos.py --device gpu --n-side 256 \
  --kinds clustered uniform plummer --repeat 5 --check-cpu \
  2>&1 | tee "$OUT/bench_halos_gpu_256.jsonl"
timeout 90 python3 benchmarks/bench_halos.py --device gpu --n-side 512 --kinds clustered \
  --repeat 3 --no-store --check-cpu kernel 2>&1 | tee "$OUT/bench_halos_gpu_512.jsonl"
if [ -n "${HALO_GPU_EXTRA:-}" ]; then
  python3 benchmarks/bench_halos.py --device gpu --n-side 256 --kinds clustered --repeat 3 \
    --no-store $HALO_GPU_EXTRA 2>&1 | tee "$OUT/bench_halos_gpu_extra.jsonl"
fi
if [ -n "${RUN_CPU:-}" ]; then
  python3 benchmarks/bench_halos.py --device cpu --n-side 128 256 --repeat 3 \
    2>&1 | tee "$OUT/bench_halos_cpu.jsonl"
fi
