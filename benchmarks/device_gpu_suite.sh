#!/usr/bin/env bash
# The whole `pytest -m gpu` on the lent GPU host in two calls of under 10 minutes
# (repo root, .whl carried; logs under $OUT): PART=A the long modules, PART=B the rest.
# Kept under this path for those who call it; the work is `MODE=gpu-suite` of device.sh.
MODE=gpu-suite exec bash "$(dirname "$0")/device.sh"
