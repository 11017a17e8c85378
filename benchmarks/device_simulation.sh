#!/usr/bin/env bash
# Simulation validation and timing on the lent GPU host (issue 17, items 6-7).
# Logs go to $OUT. PART selects what runs:
#   PART=converge   TreePM 256^3 in 256 Mpc/h from 2LPT z = 49 (CAMB table), fixed ICs:
#                   candidate defaults and theta 0.3 / twice the steps; linear growth
#                   in 1000 Mpc/h (paired-and-fixed, PM and TreePM)
#   PART=validate   paired-and-fixed 256^3 runs of CONFIGS (boost, halos, float64)
#   PART=seeds      the default run (128 steps in a, theta 0.5, float32) paired-and-fixed
#                   for each seed of SEEDS (default "8 9"), T_SEED (240) s each, one
#                   log per seed (validate256_seedS.jsonl): more phases for the boost
#                   and the mass function (bench_simulation_boost.py --from A B ...)
#   PART=precision  the default run in float32 and float64 (fixed ICs, seed 7, no halos):
#                   the P(k) at z = 0 of the two against each other (T_PREC, 560 s)
#   PART=speed      bench_simulation.py at 256^3 and 512^3 with the step split
#   PART=treepm-speed  (issue 17 item 7) the gpu tests of the truncated kernel, the GPU
#                   tree, the tree graph, TreePM and the simulation (T_TESTS s, TESTS=0
#                   skips them), then bench_simulation.py --split at 256^3 and 512^3,
#                   STEPS (5) steps to z = 0, the GPU tree also at SPLIT_TREES leaf:group
#                   sizes (T_SPEED s; BENCH=0 skips it). About 3 + 5 min: run it as two
#                   calls (TESTS=0 / BENCH=0) if one call's 10 minutes are tight.
#   bash benchmarks/device_simulation.sh      (repo root, .whl carried)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/env.txt"
TABLE=results/2026-11-25/camb_linear_pk_z0_planck18.txt
if [ "${PART:-converge}" = treepm-speed ] && [ "${TESTS:-1}" != 0 ]; then
  python3 -c "import cupy; print('cupy', cupy.__version__)" >> "$OUT/env.txt" 2>&1
  timeout ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider -m gpu -s -rfs \
    tests/gravity/test_truncated.py tests/gravity/tree/test_tree.py \
    tests/gravity/tree/test_tree_graph.py tests/gravity/test_treepm.py tests/simulation/test_simulation.py \
    2>&1 | tee "$OUT/gpu_tests_treepm.txt" | tail -30
fi
cd benchmarks
case "${PART:-converge}" in
  converge)
    python3 bench_simulation_treepm.py --device gpu --n-side 256 --box 256 --z-init 49 \
      --power $TABLE --fixed --outputs 1 --configs ${CONFIGS:-treepm:fastpm:0.5:40:float32:a \
      treepm:fastpm:0.3:80:float32:a treepm:fastpm:0.5:64:float32:a \
      treepm:fastpm:0.3:128:float32:a} 2>&1 | tee "$OUT/converge256.jsonl" | cut -c1-300
    python3 bench_simulation_treepm.py --device gpu --n-side 256 --box 1000 --z-init 49 \
      --power $TABLE --fixed --paired --no-halos --kmax 0.1 --outputs 1 \
      --configs ${LINEAR_CONFIGS:-treepm:fastpm:0.5:40:float32:a pm:fastpm:-:40:float32:a} \
      2>&1 | tee "$OUT/linear1000.jsonl" | cut -c1-300 ;;
  validate)
    python3 bench_simulation_treepm.py --device gpu --n-side 256 --box 256 --z-init 49 \
      --power $TABLE --fixed --paired --outputs 1 --configs $CONFIGS \
      2>&1 | tee "$OUT/validate256.jsonl" | cut -c1-300 ;;
  final)  # speed, then the default run paired-and-fixed, then its theta 0.3 / 2x twin
    timeout ${T_SPEED:-220} python3 bench_simulation.py --device gpu --n-side 256 512 \
      --method treepm --z-init 9 --steps 10 --schedule a --split 2>&1 \
      | tee "$OUT/speed_treepm.jsonl" | cut -c1-400
    timeout ${T_PM:-60} python3 bench_simulation.py --device gpu --n-side 512 --method pm \
      --steps 3 --pm-mesh-factor 2 2>&1 | tee "$OUT/speed_pm1024.jsonl" | cut -c1-300
    timeout ${T_VAL:-170} python3 bench_simulation_treepm.py --device gpu --n-side 256 \
      --box 256 --z-init 49 --power $TABLE --fixed --paired --outputs 1 \
      --configs treepm:fastpm:0.5:128:float32:a 2>&1 | tee "$OUT/validate256.jsonl" \
      | cut -c1-300
    timeout ${T_CONV:-150} python3 bench_simulation_treepm.py --device gpu --n-side 256 \
      --box 256 --z-init 49 --power $TABLE --fixed --outputs 1 \
      --configs treepm:fastpm:0.3:256:float32:a 2>&1 | tee "$OUT/converge256_x2.jsonl" \
      | cut -c1-300 ;;
  seeds)
    for s in ${SEEDS:-8 9}; do
      timeout ${T_SEED:-240} python3 bench_simulation_treepm.py --device gpu --n-side 256 \
        --box 256 --z-init 49 --power $TABLE --fixed --paired --outputs 1 --seed $s \
        --configs treepm:fastpm:0.5:128:float32:a 2>&1 \
        | tee "$OUT/validate256_seed$s.jsonl" | cut -c1-300
    done ;;
  precision)
    timeout ${T_PREC:-560} python3 bench_simulation_treepm.py --device gpu --n-side 256 \
      --box 256 --z-init 49 --power $TABLE --fixed --no-halos --outputs 1 \
      --configs treepm:fastpm:0.5:128:float32:a treepm:fastpm:0.5:128:float64:a 2>&1 \
      | tee "$OUT/precision256.jsonl" | cut -c1-400 ;;
  speed)
    python3 bench_simulation.py --device gpu ${SPEED_ARGS:---n-side 256 512 --method treepm} \
      2>&1 | tee "$OUT/speed.jsonl" | cut -c1-400 ;;
  treepm-speed)  # the 512^3 split must finish: few steps, 2 timed repeats, no PM-alone runs
    if [ "${BENCH:-1}" != 0 ]; then
      timeout ${T_SPEED:-330} python3 bench_simulation.py --device gpu --n-side 256 512 \
        --method treepm --z-init 9 --steps ${STEPS:-5} --schedule a --split \
        --split-repeat 2 --no-pm-force --split-trees ${SPLIT_TREES:-32:32 16:32} 2>&1 \
        | tee "$OUT/speed_treepm.jsonl" | cut -c1-600
    fi ;;
esac
