#!/usr/bin/env bash
# The whole `pytest -m gpu` on the lent GPU host in two calls of under 10 minutes
# (repo root, .whl carried; logs under $OUT):
#   PART=A  the long modules (~7 min on an H200): centres, the CLI's GPU pipeline, the
#           distributed FFT, FOF kernels and halos, CuPy snapshots and the
#           LocalCUDACluster (backend, cluster, snapshot, zeldovich), graph growth, the
#           gravity API, direct, tree and tree-graph gravity
#   PART=B  every other gpu-marked module (~2 min)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
A="tests/halos/test_center_kernels.py tests/cli/test_gpu_pipeline.py tests/spatial/test_fft.py
   tests/halos/test_fof_kernels.py tests/halos/test_fof.py tests/core/test_backend.py
   tests/core/test_cluster.py tests/store/test_snapshot.py tests/models/test_zeldovich.py
   tests/system/test_graph_growth.py tests/gravity/test_api.py tests/gravity/test_direct.py
   tests/gravity/tree/test_tree.py tests/gravity/tree/test_tree_graph.py"
if [ "${PART:-A}" = A ]; then
  files=$A; ignore=""
else
  files=tests; ignore=$(for f in $A; do printf -- "--ignore=%s " "$f"; done)
fi
timeout ${T_SUITE:-560} python3 -m pytest -m gpu -q -p no:cacheprovider -rfs --durations=10 \
  $files $ignore 2>&1 | tee "$OUT/gpu_suite_${PART:-A}.txt" | tail -25
echo "pytest exit: ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_suite_${PART:-A}.txt"
