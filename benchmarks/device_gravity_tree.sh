#!/usr/bin/env bash
# One call on the lent GPU host for the GPU tree: install the carried wheels, run the
# gpu tests of the octree builder and the tree forces, then part (c) of the gravity
# benchmark (N = 2^23 Hernquist). Logs go to $OUT.
#   bash benchmarks/device_gravity_tree.sh        (repo root, .whl carried)
#   TREE_BENCH="--n 8388608 --repeat 5"            arguments of bench_gravity_tree_gpu.py
#   TREE_TESTS=0                                   skip the tests
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
if [ "${TREE_TESTS:-1}" != 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -m gpu -s -rfs \
    tests/spatial/test_octree.py tests/gravity/tree/test_tree.py 2>&1 \
    | tee "$OUT/gpu_tests.txt" | tail -25
fi
python3 benchmarks/bench_gravity_tree_gpu.py ${TREE_BENCH:-} 2>&1 \
  | tee -a "$OUT/bench_gravity_tree_gpu.jsonl" | tail -5
