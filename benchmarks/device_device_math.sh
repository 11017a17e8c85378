#!/usr/bin/env bash
# One call on the GPU host for the shared device math (issue 15, item 5), logs under $OUT:
# the gpu-marked tests of every module whose CUDA source now includes a header of
# cosmo_dask/cuda (periodic.cuh, softening.cuh, tet_clip.cuh) or lost a device function
# to one: direct P2P (p2p_kernels_gpu, truncated), tree (tree_gpu) and its graph, PM and
# TreePM (pm_kernels_gpu), painting (paint_kernels_gpu), FOF (fof_kernels_gpu), halo
# centres (center_kernels_gpu), tetrahedron volumes and deposits (tet_volume_gpu and the
# comparison kernels of benchmarks/tet_deposit_clip_gpu.py). No timings (the lead times
# the benchmarks separately). About 3-4 minutes on one H100/H200 (7.5 min limit).
# Run from the repository root with the wheels in .whl/: bash benchmarks/device_device_math.sh
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/env.txt"
python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tee -a "$OUT/env.txt"
timeout 450 python3 -m pytest -m gpu -q -x -p no:cacheprovider -rs --durations=15 \
  tests/gravity/test_direct.py tests/gravity/test_truncated.py \
  tests/gravity/tree/test_tree.py tests/gravity/tree/test_tree_graph.py \
  tests/gravity/test_pm.py tests/gravity/test_treepm.py tests/density/test_paint.py \
  tests/halos/test_fof_kernels.py tests/halos/test_fof.py tests/halos/test_center_kernels.py \
  tests/density/test_tet_volume.py tests/cuda/test_device_math.py \
  2>&1 | tee "$OUT/gpu_tests_device_math.txt" | tail -30
echo "pytest exit: ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_tests_device_math.txt"
