#!/usr/bin/env bash
# One call on the GPU host for issue 19 item 5 (graphs at 2048^3, branch graphs2048):
# install the carried wheels, run the gpu-marked tests of the graphs this branch changed
# (FOF on TaskGraph with the two-stage exchange and the way back by pieces, the tree's
# multi-domain path on CuPy chunks, the one-GPU-domain path _whole_gpu) and their CPU
# twins. No timing: the graphs' shapes changed, not their kernels.
#   bash benchmarks/device_graphs2048.sh      (repo root, .whl carried)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy, dask; print('cupy', cupy.__version__, 'dask', dask.__version__)"; } \
  2>&1 | tee "$OUT/graphs2048_env.txt"
python3 -m pytest -q -p no:cacheprovider -rfs -m gpu tests/system/test_graph_growth.py \
  tests/halos/test_fof.py tests/halos/test_fof_kernels.py tests/gravity/tree/test_tree_graph.py \
  tests/gravity/tree/test_tree.py tests/gravity/test_treepm.py 2>&1 \
  | tee "$OUT/graphs2048_gpu_tests.txt" | tail -15
python3 -m pytest -q -p no:cacheprovider -rf tests/system/test_graph_growth.py tests/spatial/test_domains.py \
  tests/gravity/tree/test_tree_graph.py 2>&1 | tee "$OUT/graphs2048_cpu_tests.txt" | tail -6
