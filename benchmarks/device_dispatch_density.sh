#!/usr/bin/env bash
# One call on the lent GPU host for density's kernel contracts (issue 15 item 2):
# install the carried wheels, run the gpu-marked tests of the density contracts and of
# every GPU call site that now goes through density.dispatch (PSE tessellation and
# deposit, tetrahedron kernels, painting, P(k)), then time the PSE deposit and P(k) on
# the GPU: this tree, and, when BASE names a directory holding main's cosmo_dask/
# (e.g. `git -C /work/main archive main cosmo_dask | tar -x -C shared/dispatch-base`),
# main's code on the same card, alternating, so the two can be compared.
# Logs go to $OUT.   bash benchmarks/device_dispatch_density.sh   (repo root, .whl carried)
#   BASE=shared/dispatch-base   main's tree for the before figures (default: none)
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import cupy, dask; print('cupy', cupy.__version__, 'dask', dask.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_contracts_density.py \
  tests/test_tet_volume_gpu.py tests/test_pse_density_gpu.py tests/test_paint_gpu.py \
  tests/test_cli_gpu_pipeline.py -rfs 2>&1 | tee "$OUT/density_gpu_tests.txt" | tail -8
HERE=$PYTHONPATH
for round in 1 2; do
  for tree in ${BASE:+base} branch; do
    if [ "$tree" = base ]; then export PYTHONPATH=/tmp/site:$BASE; else export PYTHONPATH=$HERE; fi
    python3 benchmarks/bench_density.py --device gpu --skip-strategy --repeat 3 \
      --n-side 128 --box 100 2>/dev/null | sed "s/^{/{\"tree\": \"$tree\", /" \
      | tee -a "$OUT/bench_density_gpu.jsonl" | tail -2
    python3 benchmarks/bench_power.py --device gpu --sizes 256:256 --repeat 3 --no-baseline \
      2>/dev/null | sed "s/^{/{\"tree\": \"$tree\", /" \
      | tee -a "$OUT/bench_power_gpu.jsonl" | tail -1
  done
done
