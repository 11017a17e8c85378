# Sourced by a benchmarks/device_*.sh script on the GPU host (repo root, .whl carried):
# strict mode, $OUT made, the carried wheels installed to /tmp/site, PYTHONPATH set.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
