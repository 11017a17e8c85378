#!/usr/bin/env bash
# One call on the GPU host for issue 15 item 1, the mesh path: the slab exchange
# (spatial/slabs.py), the LPT fields, the generation blocks and the spherical overdensity
# now build their graphs through cosmo_dask.core.task_graph. Installs the carried wheels and
# runs the gpu-marked tests on CuPy chunks (paint, P(k), PM, TreePM, LPT ICs, slab FFT,
# simulation), then their CPU twins.
#   bash benchmarks/device_mesh_idiom.sh     (repo root, .whl carried)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy, dask; print('cupy', cupy.__version__, 'dask', dask.__version__)"; } \
  2>&1 | tee "$OUT/mesh_idiom_env.txt"
python3 -m pytest -q -p no:cacheprovider -rfs -m gpu tests/test_paint_gpu.py \
  tests/test_pm_gpu.py tests/test_lpt.py tests/test_distributed_fft.py tests/test_treepm.py \
  tests/test_simulation_gpu.py 2>&1 | tee "$OUT/mesh_idiom_gpu_tests.txt" | tail -15
python3 -m pytest -q -p no:cacheprovider -rf -m "not slow" tests/test_task_graph.py \
  tests/test_mesh_slabs.py tests/test_paint.py tests/test_power.py tests/test_pm.py \
  tests/test_spherical_overdensity.py 2>&1 | tee "$OUT/mesh_idiom_cpu_tests.txt" | tail -6
