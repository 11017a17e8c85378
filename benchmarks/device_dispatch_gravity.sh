#!/usr/bin/env bash
# One call on the lent GPU host for the kernel contracts of gravity and spatial (issue 15
# item 2): install the carried wheels, run the gpu tests of every changed GPU call site
# (the contract tests on CuPy, the P2P/PM/TreePM/tree graph tests on CuPy chunks, the GPU
# octree and tree), then time a contract call against a direct call of its GPU kernel and
# the multi-domain GPU tree graph. Logs go to $OUT.
#   bash benchmarks/device_dispatch_gravity.sh     (repo root, .whl carried)
#   DISPATCH_TESTS=0                                skip the tests
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
if [ "${DISPATCH_TESTS:-1}" != 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -m gpu -rfs \
    tests/test_kernel_contracts_gravity.py tests/test_kernel_contracts_spatial.py \
    tests/test_gravity_direct_gpu.py tests/test_pm_gpu.py tests/test_gravity_tree_gpu.py \
    tests/test_gravity_tree_graph_gpu.py tests/test_octree_gpu.py tests/test_treepm.py 2>&1 \
    | tee "$OUT/gpu_tests.txt" | tail -25
  # the CPU side of the changed graphs, on the same host
  python3 -m pytest -q -p no:cacheprovider -m "not gpu and not slow" \
    tests/test_kernel_contracts_gravity.py tests/test_kernel_contracts_spatial.py \
    tests/test_gravity_tree_graph.py tests/test_pm.py tests/test_gravity_direct.py 2>&1 \
    | tee "$OUT/cpu_tests.txt" | tail -5
fi
python3 benchmarks/bench_dispatch.py --device gpu 2>&1 | tee "$OUT/bench_dispatch_gpu.jsonl"
NUMBA_NUM_THREADS=1 python3 benchmarks/bench_dispatch.py --device cpu 2>&1 \
  | tee "$OUT/bench_dispatch_cpu.jsonl"
