#!/usr/bin/env bash
# One call on the lent GPU host for density's kernel contracts (issue 15 item 2):
# install the carried wheels, run the gpu-marked tests of the density contracts and of
# every GPU call site that now goes through density.dispatch (PSE tessellation and
# deposit, tetrahedron kernels, painting, P(k)), then the before/after timings of PSE
# and P(k) on the GPU through benchmarks/device_capabilities.sh (the trees under
# .baseline/, e.g. `git archive effecdf cosmo_dask | tar -x -C .baseline/effecdf`, and
# this tree, interleaved on one card).
# Logs go to $OUT.   bash benchmarks/device_dispatch_density.sh   (repo root, .whl and
# .baseline carried)
source benchmarks/device_setup.sh
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_contracts_density.py \
  tests/test_tet_volume_gpu.py tests/test_pse_density_gpu.py tests/test_paint_gpu.py \
  tests/test_cli_gpu_pipeline.py -rfs 2>&1 | tee "$OUT/density_gpu_tests.txt" | tail -8
DEVICES=${DEVICES:-gpu} WORKLOADS=${WORKLOADS:-"pse pk"} ROUNDS=${ROUNDS:-2} \
  bash benchmarks/device_capabilities.sh
