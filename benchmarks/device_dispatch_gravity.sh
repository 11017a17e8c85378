#!/usr/bin/env bash
# One call on the GPU host for the kernel contracts of gravity and spatial (issue 15
# item 2): install the carried wheels, run the gpu tests of every changed GPU call site
# (the contract tests on CuPy, the P2P/PM/TreePM/tree-graph tests on CuPy chunks, the GPU
# octree and tree) and the CPU tests of the changed graphs, then time a contract call
# against a direct call of its GPU kernel and the tree graph on CuPy chunks (1 and 4
# domains), the latter also with the code before the contracts when bench-out/base holds it.
#   mkdir -p bench-out/base && git -C /work/main archive effecdf cosmo_dask \
#       | tar -x -C bench-out/base            # optional baseline, carried as bench-out/base
#   bash benchmarks/device_dispatch_gravity.sh   (repo root, .whl carried)
#   DISPATCH_TESTS=0                              skip the tests
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/dispatch_env.txt"
if [ "${DISPATCH_TESTS:-1}" != 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -m "gpu and not slow" -rfs \
    tests/test_kernel_contracts_gravity.py tests/test_kernel_contracts_spatial.py \
    tests/test_gravity_direct_gpu.py tests/test_pm_gpu.py tests/test_gravity_tree_gpu.py \
    tests/test_gravity_tree_graph_gpu.py tests/test_octree_gpu.py tests/test_treepm.py 2>&1 \
    | tee "$OUT/dispatch_gpu_tests.txt" | tail -25
  python3 -m pytest -q -p no:cacheprovider -m "not gpu and not slow" \
    tests/test_kernel_contracts_gravity.py tests/test_kernel_contracts_spatial.py \
    tests/test_gravity_tree_graph.py tests/test_pm.py tests/test_gravity_direct.py 2>&1 \
    | tee "$OUT/dispatch_cpu_tests.txt" | tail -5
fi
for _r in 1 2; do  # before and after alternated, twice
  if [ -d bench-out/base/cosmo_dask ]; then
    PYTHONPATH=/tmp/site:$PWD/bench-out/base python3 benchmarks/bench_dispatch.py \
      --device gpu --graph-only 2>&1 | tee -a "$OUT/bench_dispatch_gpu.jsonl"
  fi
  python3 benchmarks/bench_dispatch.py --device gpu 2>&1 | tee -a "$OUT/bench_dispatch_gpu.jsonl"
done
NUMBA_NUM_THREADS=1 python3 benchmarks/bench_dispatch.py --device cpu 2>&1 \
  | tee "$OUT/bench_dispatch_cpu.jsonl"
