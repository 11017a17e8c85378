#!/usr/bin/env bash
# The one script for a lent GPU host: run benchmark workloads there, logs and JSON lines
# under $OUT (the device tool brings them back). From the repository root, with the
# wheels in .whl/ carried (.whl_ucx/ with UCX=1):
#
#   bash benchmarks/device.sh halos pipeline          # or WORKLOADS="halos pipeline"
#
# MODE=bench (default): for each workload W of the arguments (or $WORKLOADS),
#   python -m benchmarks W --device $DEVICE --out $OUT $ARGS $ARGS_<W>
# with a $T_RUN s limit (default 540) each, stdout and stderr to $OUT/W.log; the rows go
# to $OUT/W.jsonl. DEVICE defaults to gpu; ARGS goes to every workload, ARGS_<W> (W in
# capitals, - as _) to W alone, e.g.
#   ARGS_HALOS="--n-side 256 --kinds clustered uniform plummer --repeat 5 --check-cpu"
#   ARGS_PIPELINE="--n-side 256 512 --dir /tmp/bench"
#   ARGS_SIMULATION="--n-side 256 512 --method treepm --split"
#   ARGS_SCALING="--protocol ucx --workers 1 4 --n-side-strong 512 --n-side-weak 256 \
#     --mesh 1024 --dir /dev/shm" UCX=1 bash benchmarks/device.sh scaling
# `python -m benchmarks --list` names the workloads, `... W --help` their options.
#
# MODE=capabilities: the "behaviour unchanged" benchmark of a refactor (issue 15, 35):
#   the capabilities workload under each source tree of $TREES (default: the trees under
#   .baseline/, exported there by `git archive <commit> cosmo_dask | tar -x -C
#   .baseline/<name>`, then the working tree "."), on each device of $DEVICES (default
#   "cpu gpu"), one process per (device, workload, tree) with a $T_RUN s limit (default
#   120), trees interleaved so that drift of the host shows between rounds ($ROUNDS,
#   default 1); $WORKLOADS (default "fof tree scf pse pk"), $REPEAT (5), $CPU_ARGS and
#   $GPU_ARGS (sizes). Rows to $OUT/capabilities.jsonl (label = the tree), then a table
#   of the medians per (device, workload, tree).
#
# MODE=gpu-suite: the whole `pytest -m gpu` in two calls of under 10 minutes
#   (benchmarks/device_gpu_suite.sh runs this mode): PART=A the long modules (~7 min on
#   an H200), PART=B every other gpu-marked module (~2 min); $T_SUITE s (default 560).
#
# MODE=tests: `pytest -m gpu $TESTS` (test files or -k expressions), $T_SUITE s.
#
# UCX=1: install .whl_ucx/ (distributed-ucxx, ucxx, libucx, rmm; cuda-bindings and
#   cuda-core only where the host lacks them) instead of .whl/ and probe a one-worker
#   LocalCUDACluster over UCX first ($OUT/ucx_probe.txt).
# SETUP=0: no wheels installed, PYTHONPATH as it is (a CPU run on the dev machine:
#   SETUP=0 DEVICE=cpu bash benchmarks/device.sh graphs).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD

setup() {  # the carried wheels to /tmp/site, PYTHONPATH, the host's record
  local wheels
  if [ -n "${UCX:-}" ]; then
    wheels=$(python3 - <<'PY'
import glob, importlib.util, sys
have = {"cuda_bindings": "cuda.bindings", "cuda_core": "cuda.core"}
skip = []
for prefix, mod in have.items():
    try:
        if importlib.util.find_spec(mod) is not None:
            skip.append(prefix)
    except ModuleNotFoundError:
        pass
print("host has:", skip or "neither", file=sys.stderr)
print(" ".join(w for w in sorted(glob.glob(".whl_ucx/*.whl"))
               if not any(w.split("/")[-1].startswith(p) for p in skip)))
PY
)
  else
    wheels=$(ls .whl/*.whl)
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $wheels || exit 1
  export PYTHONPATH=/tmp/site:$ROOT PYTHONUNBUFFERED=1
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nproc; python3 -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
  [ -n "${UCX:-}" ] && ucx_probe
  return 0
}

ucx_probe() {  # a one-worker LocalCUDACluster over UCX (a file: workers re-import __main__)
  python3 -c "import ucxx; print('ucxx', ucxx.__version__, 'ucx', ucxx.get_ucx_version())" \
    2>&1 | tee "$OUT/ucx_version.txt"
  cat > /tmp/ucx_probe.py <<'PY'
import logging, time
import dask.array as da
from dask_cuda import LocalCUDACluster
from distributed import Client
if __name__ == "__main__":
    t0 = time.time()
    with LocalCUDACluster(n_workers=1, protocol="ucx", dashboard_address=":0",
                          silence_logs=logging.WARNING) as cl, Client(cl) as c:
        import cupy
        x = da.random.random((2**24, 3), chunks=(2**22, 3)).map_blocks(cupy.asarray)
        print("ucx probe:", cl.scheduler_address, "sum", float(x.sum().compute()),
              "workers", list(c.scheduler_info()["workers"]), round(time.time() - t0, 1), "s")
PY
  timeout 120 python3 /tmp/ucx_probe.py > "$OUT/ucx_probe.txt" 2>&1
  grep -E "ucx probe|Error" "$OUT/ucx_probe.txt" | head -5
}

bench() {  # python -m benchmarks W --device gpu --out $OUT for each workload
  local w var
  for w in "$@"; do
    var="ARGS_$(echo "$w" | tr 'a-z-' 'A-Z_')"
    echo "== $w $(date -u +%T)" | tee -a "$OUT/$w.log"
    # shellcheck disable=SC2086
    timeout "${T_RUN:-540}" python3 -m benchmarks "$w" --device "${DEVICE:-gpu}" \
      --out "$OUT" ${ARGS:-} ${!var:-} >> "$OUT/$w.log" 2>&1 \
      || echo "FAILED or timed out: $w (rc $?)" | tee -a "$OUT/$w.log"
    tail -15 "$OUT/$w.log"
  done
}

capabilities() {  # the capabilities workload under each tree of $TREES, interleaved
  local trees round dev args work tree
  trees=${TREES:-"$(ls -d .baseline/* 2>/dev/null | tr '\n' ' ') ."}
  for round in $(seq "${ROUNDS:-1}"); do
    for dev in ${DEVICES:-cpu gpu}; do
      args=${CPU_ARGS:-""}
      [ "$dev" = gpu ] && args=${GPU_ARGS:-"--fof-n 4194304 --tree-n 262144 --scf-n 4194304 --pse-side 96 --pk-side 256"}
      for work in ${WORKLOADS:-fof tree scf pse pk}; do
        for tree in $trees; do
          echo "== $dev $work $tree round $round $(date +%T)" >> "$OUT/capabilities_${dev}.err"
          # run as a file from benchmarks/ (not -m from the root, whose cosmo_dask would
          # shadow the tree's): the tree first on the path, the repository root last
          # shellcheck disable=SC2086
          (cd benchmarks && PYTHONPATH=/tmp/site:$ROOT/$tree:$ROOT timeout "${T_RUN:-120}" \
            python3 capabilities.py --device "$dev" --label "$tree" --only "$work" \
            --repeat "${REPEAT:-5}" --out "$OUT" $args > /dev/null \
            2>> "$OUT/capabilities_${dev}.err") \
            || echo "FAILED: $dev $work $tree round $round" | tee -a "$OUT/capabilities_${dev}.err"
        done
      done
    done
  done
  python3 - "$OUT/capabilities.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = collections.defaultdict(list)
for r in rows:
    t[(r["device"], r["workload"], r["label"])].append(r["seconds"])
for key in sorted(t):
    print(*key, sorted(t[key]), sep="  ")
PY
}

gpu_suite() {  # pytest -m gpu in two parts of under 10 minutes
  local A files ignore
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
  # shellcheck disable=SC2086
  timeout "${T_SUITE:-560}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfs \
    --durations=10 $files $ignore 2>&1 | tee "$OUT/gpu_suite_${PART:-A}.txt" | tail -25
  echo "pytest exit: ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_suite_${PART:-A}.txt"
}

if [ "${SETUP:-1}" = 0 ]; then export PYTHONUNBUFFERED=1; else setup; fi
case "${MODE:-bench}" in
  bench) # shellcheck disable=SC2086
         bench "$@" ${WORKLOADS:-} ;;
  capabilities) capabilities ;;
  gpu-suite) gpu_suite ;;
  tests) # shellcheck disable=SC2086
         timeout "${T_SUITE:-560}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfs \
           --durations=10 ${TESTS:-tests} 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25 ;;
  *) echo "device.sh: MODE must be bench, capabilities, gpu-suite or tests" >&2; exit 2 ;;
esac
