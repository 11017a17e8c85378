#!/usr/bin/env bash
# One call on the lent GPU host for the CLI pipeline (issue 12): install the carried
# wheels, then run what PART names, logging under $OUT.
#   PART=tests   the GPU tests of the pipeline work (writers, CLI end to end, tree, ids)
#   PART=all     every gpu-marked test
#   PART=bench   benchmarks/bench_pipeline.py --device gpu at $SIZES (default 256 512)
#   PART=ics     the IC tests on the GPU (tests/models/test_lpt.py gpu-marked: CPU vs GPU, chunking)
#                and benchmarks/bench_ics.py: 512^3 2LPT float32 ICs on the GPU, generated
#                (default, 3 and 9 slabs) and written to a Zarr store, plus the CLI
#                `cosmo-dask --gpu ics` as a user runs it (logs: gpu_tests_ics.txt,
#                bench_ics_gpu.jsonl, cli_ics_512.txt)
#   PART=ics-1024  the acceptance check on the host's CPUs: 1024^3 ICs (ORDER, default 1:
#                2LPT holds ~9 meshes of 8 GiB in all, more than 2 workers of 64 GiB keep in memory)
#                on 1 and on 2 LocalCluster workers, chunk digests compared
#                (bench_ics_compare_workers.jsonl)
#   PART="tests bench" runs both, in that order
#   bash benchmarks/device_pipeline.sh      (from the repo root, with .whl carried)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nproc; free -g | head -2; df -h /tmp | tail -1; } > "$OUT/env.txt" 2>&1
for part in ${PART:-tests}; do
case "$part" in
  tests)
    timeout ${TEST_TIMEOUT:-560} python3 -m pytest -q -p no:cacheprovider -rs -x --timeout 500 \
      tests/store/test_zarr_write.py tests/gravity/tree/test_tree.py tests/store/test_validation.py \
      tests/cli/test_gpu_pipeline.py ${EXTRA_TESTS:-} -s 2>&1 | tail -60 > "$OUT/gpu_tests_pipeline.txt"
    ;;
  all)
    timeout 580 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests \
      2>&1 | tail -80 > "$OUT/gpu_tests_all.txt"
    ;;
  bench)
    for n in ${SIZES:-256 512}; do
      timeout ${BENCH_TIMEOUT:-560} python3 benchmarks/bench_pipeline.py --device gpu \
        --n-side $n --dir /tmp/bench ${BENCH_EXTRA:-} 2>&1 | tee -a "$OUT/bench_pipeline_gpu.jsonl" | tail -3
    done
    ;;
  ics)
    timeout 240 python3 -m pytest -q -p no:cacheprovider -rs -s tests/models/test_lpt.py -k gpu \
      2>&1 | tail -30 > "$OUT/gpu_tests_ics.txt"
    for slabs in "" 3 9; do
      timeout 200 python3 benchmarks/bench_ics.py --device gpu --n-side ${ICS_N:-512} \
        --order 2 --repeat 3 ${slabs:+--slabs $slabs} 2>&1 | tee -a "$OUT/bench_ics_gpu.jsonl" | tail -1
    done
    mkdir -p /tmp/ics_bench
    timeout 200 python3 benchmarks/bench_ics.py --device gpu --n-side ${ICS_N:-512} --order 2 \
      --repeat 3 --zarr /tmp/ics_bench 2>&1 | tee -a "$OUT/bench_ics_gpu.jsonl" | tail -1
    { time timeout 200 python3 -m cosmo_dask --gpu ics /tmp/ics_bench/cli.zarr \
        --n-side ${ICS_N:-512} --box-size ${ICS_N:-512} --redshift 49 --precision float32 \
        --overwrite; } > "$OUT/cli_ics_512.txt" 2>&1
    tail -25 "$OUT/cli_ics_512.txt"
    ;;
  ics-1024)
    timeout 580 python3 benchmarks/bench_ics.py --n-side 1024 --order ${ORDER:-1} \
      --compare-workers 1,2 2>&1 | tee "$OUT/bench_ics_compare_workers.jsonl" | tail -3
    ;;
esac
done
ls -la "$OUT"
