#!/usr/bin/env bash
# One call on the lent GPU host for the mesh path (issue 19): install the carried
# wheels, run the gpu-marked tests of painting, P(k), PM/TreePM and the slab FFT,
# then bench_mesh_scale.py on one GPU: the 2048^3-mesh P(k) (interlaced, then one
# mesh) and the PM force of 512^3 particles on a 2048^3 mesh (time, peak GPU memory).
# Logs go to $OUT.   bash benchmarks/device_mesh.sh   (repo root, .whl carried)
#   MESH_BENCH="--n-mesh 1024 --n-side 256"   other sizes (default 2048 / 512)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy, dask; print('cupy', cupy.__version__, 'dask', dask.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/gravity/test_pm.py tests/density/test_paint.py \
  tests/spatial/test_fft.py tests/simulation/test_simulation.py -rfs 2>&1 \
  | tee "$OUT/mesh_gpu_tests.txt" | tail -8
B="python3 benchmarks/bench_mesh_scale.py --device gpu ${MESH_BENCH:-}"
$B --what power 2>&1 | tee -a "$OUT/bench_mesh_scale_gpu.jsonl" | grep -v '^\s*$' | tail -2
$B --what power --no-interlace 2>&1 | tee -a "$OUT/bench_mesh_scale_gpu.jsonl" | tail -1
$B --what pm 2>&1 | tee -a "$OUT/bench_mesh_scale_gpu.jsonl" | tail -1
