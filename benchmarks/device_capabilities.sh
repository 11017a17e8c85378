#!/usr/bin/env bash
# The "behaviour unchanged" benchmark of issue 15 on the lent GPU host (repo root, .whl and
# the baseline trees carried): benchmarks/bench_capabilities.py under each source tree in
# $TREES (default: the trees exported under .baseline/ by `git archive <commit> cosmo_dask`,
# then the working tree "."), on each device in $DEVICES, one process per (device,
# workload, tree) with a $T_RUN s limit, trees interleaved so that drift of the host
# shows between rounds ($ROUNDS).
# JSON lines to $OUT/capabilities.jsonl.
source benchmarks/device_setup.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nproc; } 2>&1 | tee "$OUT/env.txt"
ROOT=$PWD
TREES=${TREES:-"$(ls -d .baseline/* 2>/dev/null | tr '\n' ' ') ."}
CPU_ARGS=${CPU_ARGS:-""}
GPU_ARGS=${GPU_ARGS:-"--fof-n 4194304 --tree-n 262144 --scf-n 4194304 --pse-side 96 --pk-side 256"}
for round in $(seq ${ROUNDS:-1}); do
  for dev in ${DEVICES:-cpu gpu}; do
    args=$CPU_ARGS; [ "$dev" = gpu ] && args=$GPU_ARGS
    for work in ${WORKLOADS:-fof tree scf pse pk}; do
      for tree in $TREES; do
        echo "== $dev $work $tree round $round $(date +%T)" >> "$OUT/capabilities_${dev}.err"
        (cd benchmarks && PYTHONPATH=/tmp/site:$ROOT/$tree timeout ${T_RUN:-120} \
          python3 bench_capabilities.py --device "$dev" --label "$tree" --only "$work" \
          --repeat ${REPEAT:-5} $args >> "$OUT/capabilities.jsonl" 2>> "$OUT/capabilities_${dev}.err") \
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
