#!/usr/bin/env bash
# Issue 20 over UCX: bench_scaling.py on a multi-GPU host with dask-cuda's UCX transport
# (NVLink between the GPUs where the host has it), the FOF, TreePM, PM and P(k) rows for
# 1 and 4 GPUs (strong 512^3, weak 256^3 per GPU, mesh 1024^3). Run from the repo root
# with .whl_ucx carried (benchmarks/device_ucx_setup.sh); logs under $OUT.
#   SCALING_ARGS="--workers 1 2 4 --tasks fof"   other worker counts or tasks
source benchmarks/device_ucx_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvidia-smi topo -m; } 2>&1 | tee "$OUT/env.txt" | head -8
timeout "${SCALING_TIMEOUT:-560}" python3 benchmarks/bench_scaling.py --gpu --protocol ucx \
  --n-side-strong 512 --n-side-weak 256 --mesh 1024 --dir /dev/shm \
  ${SCALING_ARGS:---workers 1 4 --tasks fof,treepm,pm,power} \
  > "$OUT/bench_scaling_ucx.jsonl" 2> "$OUT/bench_scaling_ucx.err"
python3 - "$OUT/bench_scaling_ucx.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        if "task" in r:
            print(r["task"], r["kind"], r["workers"], r["n_side"], r["seconds"], r["efficiency"],
                  round(r["bytes_moved"] / 1e9, 2), "GB", r["equal_to_1_worker"])
PY
tail -3 "$OUT/bench_scaling_ucx.err"
