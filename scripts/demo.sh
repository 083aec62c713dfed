#!/usr/bin/env bash
# README command 1: set up everything and run the shipped offline workflow in a real ComfyUI.
#   bash scripts/demo.sh            serve on http://127.0.0.1:8188 after writing the image (Ctrl-C stops)
#   bash scripts/demo.sh --exit     stop once the image is written
#   COMFYUI_DIR=~/ComfyUI COMFYUI_PYTHON=~/ComfyUI/venv/bin/python bash scripts/demo.sh
#                                   use your own ComfyUI (the pack's requirements go into its Python)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
if [ -n "${COMFYUI_DIR:-}" ]; then
  PY=${COMFYUI_PYTHON:-python3}
  "$PY" -m pip install -q -r "$ROOT/requirements.txt"
  exec "$PY" "$ROOT/tools/comfy_host.py" demo --comfyui "$COMFYUI_DIR" "$@"
fi
bash "$ROOT/scripts/setup_env.sh"
exec "$ROOT/.venv/bin/python" "$ROOT/tools/comfy_host.py" demo "$@"
