#!/usr/bin/env bash
# GPU check of the transformers engine and the batcher (see bench/gpu_check.py for what it runs).
#   bash bench/gpu_check.sh --out DIR                        on CUDA, under 8 minutes
#   bash bench/gpu_check.sh --device cpu --quick --out DIR   CPU smoke test (before a GPU run)
#   bash bench/gpu_check.sh --device cpu --smoke --out DIR   the least that runs every part (the test suite's)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
exec python3 -m bench.gpu_check "$@"
