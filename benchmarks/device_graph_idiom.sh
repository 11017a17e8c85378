#!/usr/bin/env bash
# One call on the GPU host for issue 15 item 1 (one graph idiom): install the carried
# wheels, run the gpu-marked tests of the graphs that moved to cosmo_dask.core.task_graph
# (direct, tree domains, FOF domains, MEX, PSE columns/schedule/octree, CuPy stores) and
# their CPU twins, then the graph paths end to end on CuPy chunks
# (benchmarks/bench_graph_paths.py), against the old code when bench-out/base holds it.
#   mkdir -p bench-out/base && git -C /work/main archive <old rev> cosmo_dask \
#       | tar -x -C bench-out/base            # optional baseline, carried as bench-out/base
#   bash benchmarks/device_graph_idiom.sh     (repo root, .whl carried)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy, dask; print('cupy', cupy.__version__, 'dask', dask.__version__)"; } \
  2>&1 | tee "$OUT/graph_idiom_env.txt"
python3 -m pytest -q -p no:cacheprovider -rfs -m gpu tests/test_gravity_direct_gpu.py \
  tests/test_mex_gpu.py tests/test_gravity_tree_graph_gpu.py tests/test_gravity_tree_gpu.py \
  tests/test_pse_density_gpu.py tests/test_gpu_halos.py tests/test_gpu.py \
  tests/test_cli_gpu_pipeline.py tests/test_store_writes.py 2>&1 \
  | tee "$OUT/graph_idiom_gpu_tests.txt" | tail -15
python3 -m pytest -q -p no:cacheprovider -rf tests/test_task_graph.py tests/test_structure.py \
  tests/test_gravity_direct.py tests/test_mex.py tests/test_spatial.py tests/test_gadget.py \
  tests/test_tessellation.py tests/test_density_octree_result.py tests/test_validation.py 2>&1 \
  | tee "$OUT/graph_idiom_cpu_tests.txt" | tail -6
BASE=(); [ -d bench-out/base/cosmo_dask ] && BASE=(--base bench-out/base)
python3 benchmarks/bench_graph_paths.py --device gpu --cases \
  direct,direct-build,tree,fof,mex,pse-gather,pse-reduce,dupids --rounds 3 "${BASE[@]}" 2>&1 \
  | tee "$OUT/graph_idiom_bench_gpu.jsonl" | grep summary
