#!/usr/bin/env bash
# One call on the lent GPU host for the TreePM graph at 2048^3 (branch treepm-graph):
# install the carried wheels, then run the gpu-marked tests the branch touches: the PM
# interpolation passes on CuPy chunks (one per interlaced mesh vs one per mesh and
# component, against the CPU graph), the two-stage mesh path, TreePM's short range with
# LETs cut for neighbouring 2x2x2 blocks on 64 GPU domains (against per-pair LETs and
# the truncated direct sum), and the GPU PM / paint / tree-graph tests.
# Logs go to $OUT.   bash benchmarks/device_treepm_graph.sh   (repo root, .whl carried)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy, dask; print('cupy', cupy.__version__, 'dask', dask.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/spatial/test_slabs.py \
  tests/gravity/tree/test_tree_graph.py tests/gravity/test_pm.py tests/density/test_paint.py -rfs 2>&1 \
  | tee "$OUT/treepm_graph_gpu_tests.txt" | tail -8
