#!/usr/bin/env bash
# One command that proves the pack on this machine's accelerator and writes what it measured to
# docs/verified/<device>-<date>.md (the runtime tests, every support-matrix cell, the benchmarks,
# the compile cache across a restart):
#   bash scripts/verify_device.sh [--device tpu|cuda|cpu] [--quick] [--out FILE] [more: tools/verify_device.py --help]
# Sets up .venv first, with the test tools and torch_tpu (scripts/setup_env.sh, EXTRAS=test).
#
#   bash scripts/verify_device.sh --python-here [--wheels DIR] ...
# No venv and no package registry: runs with ${PYTHON:-python3} as it is (its torch untouched), for a
# machine without network or one whose torch should stay alone. The wheels in DIR (default wheels/ when
# it exists; scripts/device_wheels.sh builds it) are unpacked into .comfyui/python-here/, first on
# PYTHONPATH; it refuses, naming them, when a package the pack needs is not importable. See docs/device_check.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
python_here=0
wheels=
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python-here) python_here=1 ;;
    --wheels) wheels=${2:?--wheels needs a folder}; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
export HF_HUB_OFFLINE=1 PYTHONWARNINGS="ignore:<TorchTpu/Performance/TcMalloc/"

if [ "$python_here" = 0 ]; then
  [ -z "$wheels" ] || { echo "[verify] --wheels goes with --python-here" >&2; exit 2; }
  EXTRAS=test bash "$ROOT/scripts/setup_env.sh"
  exec "$ROOT/.venv/bin/python" tools/verify_device.py "${args[@]}"
fi

PYTHON=${PYTHON:-python3}
[ -n "$wheels" ] || [ ! -d wheels ] || wheels=wheels
if [ -n "$wheels" ]; then
  export PYTHONPATH=$ROOT/.comfyui/python-here${PYTHONPATH:+:$PYTHONPATH}
  "$PYTHON" tools/python_here.py --wheels "$wheels" --into "$ROOT/.comfyui/python-here"
  args=(--python-here --wheels "$wheels" "${args[@]}")
else
  "$PYTHON" tools/python_here.py
  args=(--python-here "${args[@]}")
fi
exec "$PYTHON" tools/verify_device.py "${args[@]}"
