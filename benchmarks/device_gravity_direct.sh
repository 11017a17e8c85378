#!/usr/bin/env bash
# One call on the lent GPU host for direct-summation gravity: install the carried wheels,
# run the gravity-direct tests (GPU and CPU), then bench_gravity_direct.py. Logs go to $OUT.
#   bash benchmarks/device_gravity_direct.sh      (repo root, .whl carried)
#   GD_BENCH="--sweep"   extra arguments of bench_gravity_direct.py
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import cupy, numba; print('cupy', cupy.__version__, 'numba', numba.__version__)"; } \
  2>&1 | tee "$OUT/gravity_direct_env.txt"
python3 -m pytest -q -p no:cacheprovider -rfs tests/gravity/test_direct.py \
  tests/gravity/test_truncated.py 2>&1 \
  | tee "$OUT/gravity_direct_tests.txt" | tail -15
python3 benchmarks/bench_gravity_direct.py ${GD_BENCH:-} 2>&1 \
  | tee "$OUT/gravity_direct_bench.jsonl"
