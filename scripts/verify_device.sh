#!/usr/bin/env bash
# One command that proves the pack on this machine's accelerator and writes what it measured to
# docs/verified/<device>-<date>.md (the runtime tests, every support-matrix cell, the benchmarks,
# the compile cache across a restart):
#   bash scripts/verify_device.sh [--device tpu|cuda|cpu] [--quick] [--out FILE]
# Sets up .venv first, with the test tools and torch_tpu (scripts/setup_env.sh, EXTRAS=test).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
EXTRAS=test bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 PYTHONWARNINGS="ignore:<TorchTpu/Performance/TcMalloc/"
exec "$ROOT/.venv/bin/python" tools/verify_device.py "$@"
