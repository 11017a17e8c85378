#!/usr/bin/env bash
# One call on the GPU host for the halo work: gpu-marked tests, then FOF throughput
# from a Zarr snapshot on the GPU (256^3), MBP timing, and the CPU path vs scipy on
# the host's cores. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests 2>&1 | tee "$OUT/gpu_tests.txt" | tail -8
python3 benchmarks/bench_halos.py --device gpu --n-side 256 --kinds clustered uniform \
  --no-scipy --repeat 5 --check-cpu ${HALO_GPU_EXTRA:---mbp --memory} \
  2>&1 | tee "$OUT/bench_halos_gpu.jsonl"
if [ -z "${SKIP_CPU:-}" ]; then
  python3 benchmarks/bench_halos.py --device cpu --n-side 128 256 --repeat 3 \
    2>&1 | tee "$OUT/bench_halos_cpu.jsonl"
fi
