#!/usr/bin/env bash
# One call on the lent GPU host for the CLI pipeline (issue 12): install the carried
# wheels, then run what PART names, logging under $OUT.
#   PART=tests   the GPU tests of the pipeline work (writers, CLI end to end, tree, ids)
#   PART=all     every gpu-marked test
#   PART=bench   benchmarks/bench_pipeline.py --device gpu at $SIZES (default 256 512)
#   PART="tests bench" runs both, in that order
#   bash benchmarks/device_pipeline.sh      (from the repo root, with .whl carried)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nproc; free -g | head -2; df -h /tmp | tail -1; } > "$OUT/env.txt" 2>&1
for part in ${PART:-tests}; do
case "$part" in
  tests)
    timeout ${TEST_TIMEOUT:-560} python3 -m pytest -q -p no:cacheprovider -rs -x --timeout 500 \
      tests/test_store_writes.py tests/test_gravity_tree_gpu.py tests/test_validation.py \
      tests/test_cli_gpu_pipeline.py ${EXTRA_TESTS:-} -s 2>&1 | tail -60 > "$OUT/gpu_tests_pipeline.txt"
    ;;
  all)
    timeout 580 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests \
      2>&1 | tail -80 > "$OUT/gpu_tests_all.txt"
    ;;
  bench)
    for n in ${SIZES:-256 512}; do
      timeout ${BENCH_TIMEOUT:-560} python3 benchmarks/bench_pipeline.py --device gpu \
        --n-side $n --dir /tmp/bench ${BENCH_EXTRA:-} 2>&1 | tee -a "$OUT/bench_pipeline_gpu.jsonl" | tail -3
    done
    ;;
esac
done
ls -la "$OUT"
