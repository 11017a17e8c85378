#!/usr/bin/env bash
# On the lent GPU host: `cosmo-dask --gpu info` of a 512^3 store, twice (cold, then warm
# caches), and its phases in one process (profile_info.py, three repetitions), logged
# under $OUT. Run after device_pipeline.sh installed the wheels (PYTHONPATH set there).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
d=/tmp/info512; rm -rf $d; mkdir -p $d
python3 -m cosmo_dask --gpu generate zeldovich $d/s.zarr --n-side ${N_SIDE:-512} \
  --box-size 800 --redshift 0 --seed 1 --precision float32 > "$OUT/info_generate.txt" 2>&1
for i in 1 2; do
  s=$(date +%s.%N)
  python3 -m cosmo_dask --gpu info $d/s.zarr > "$OUT/info_$i.txt" 2> "$OUT/info_${i}_err.txt"
  echo "info run $i rc=$? wall $(echo "$(date +%s.%N) - $s" | bc) s" >> "$OUT/info_walls.txt"
done
python3 benchmarks/profile_info.py $d/s.zarr --chunks 0 0 0 > "$OUT/profile_info.jsonl" 2>&1
rm -rf $d
