#!/usr/bin/env bash
# One call on the lent GPU host for the two-stage particle -> mesh-slab exchange
# (spatial/slabs.py, branch slab-two-stage): install the carried wheels, run the
# gpu-marked tests of tests/spatial/test_slabs.py (CuPy chunks through the forced
# two-stage exchange: mesh, P(k), PM forces against the one-stage CuPy graph and the
# CPU graph) and the GPU paint/PM tests, then time P(k) and PM of 256^3 particles
# (64 chunks) on a 512^3 mesh in 32 slabs, one-stage and forced two-stage, on CuPy
# chunks (bench_mesh_scale.py --device gpu).
# Logs go to $OUT.   bash benchmarks/device_slab_two_stage.sh   (repo root, .whl carried)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy, dask; print('cupy', cupy.__version__, 'dask', dask.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/spatial/test_slabs.py \
  tests/density/test_paint.py tests/gravity/test_pm.py -rfs 2>&1 \
  | tee "$OUT/slab_two_stage_gpu_tests.txt" | tail -8
B="python3 benchmarks/bench_mesh_scale.py --device gpu --n-side 256 --n-mesh 512 --slabs 32"
for rep in 1 2 3; do  # alternate, so drifts hit both
  $B --chunk-rows 262144 2>&1 | tee -a "$OUT/bench_slab_two_stage_gpu.jsonl" | tail -2
  $B --chunk-rows 262144 --two-stage 2>&1 | tee -a "$OUT/bench_slab_two_stage_gpu.jsonl" | tail -2
done
