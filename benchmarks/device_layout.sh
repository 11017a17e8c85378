#!/usr/bin/env bash
# One call on the lent GPU host for the domain layout (issue 15 item 3): install the
# carried wheels, run the gpu-marked tests of the layout and of its users (FOF, tree /
# TreePM, the two-stage exchanges), then time FOF and multi-domain tree forces on CuPy
# chunks through the layout (benchmarks/bench_layout.py; run the same file from a
# checkout of main in the same session for the before figures). Logs go to $OUT.
#   bash benchmarks/device_layout.sh   (repo root, .whl carried)
#   LAYOUT_TESTS=0                skip the tests (timings only)
#   LAYOUT_BENCH="--n 4000000 --chunks 16 --domains 8 --repeat 5"   bench_layout.py args
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
if [ "${LAYOUT_TESTS:-1}" != 0 ]; then
  timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu -rfs --durations=10 \
    tests/test_layout.py tests/test_graph_growth.py tests/test_gravity_tree_graph_gpu.py \
    tests/test_gpu_halos.py tests/test_treepm.py 2>&1 | tee "$OUT/gpu_tests.txt" | tail -12
fi
timeout 150 python3 benchmarks/bench_layout.py --device gpu \
  ${LAYOUT_BENCH:---n 4000000 --chunks 16 --domains 8 --repeat 5} --label "$(pwd)" 2>&1 \
  | tee -a "$OUT/bench_layout_gpu.jsonl" | tail -4
