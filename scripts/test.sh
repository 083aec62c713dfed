#!/usr/bin/env bash
# README command 2: set up the environment (with test tools and the TPU extra) and run every test.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k sampling
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
EXTRAS=test bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 PYTHONWARNINGS="ignore:<TorchTpu/Performance/TcMalloc/"
exec "$ROOT/.venv/bin/python" -m pytest tests -v -p no:cacheprovider --durations=30 "$@"
