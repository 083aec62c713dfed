#!/usr/bin/env bash
# Does the pack still work with the newest releases of everything requirements.txt leaves loose?
# In a throwaway venv (LOCK=none: newest diffusers, transformers, ...; torch stays at ComfyUI's pin)
# it builds the offline default model and runs README command 1's workflow in a real ComfyUI.
# CI runs it, so a dependency release that breaks the pack is seen here first, not by users.
#   bash scripts/check_latest.sh [--keep]    --keep leaves the venv and ComfyUI folder for a look
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -t tpu_diffusers_latest.XXXXXX)
[ "${1:-}" = "--keep" ] || trap 'rm -rf "$WORK"' EXIT
VENV="$WORK/venv"

LOCK=none VENV="$VENV" bash "$ROOT/scripts/setup_env.sh"
echo "[latest] versions that differ from requirements-lock.txt:"
"$VENV/bin/python" - "$ROOT/requirements-lock.txt" <<'PY'
import importlib.metadata as md, re, sys
locked = dict(re.match(r"([^=]+)==(.+)", line).groups() for line in open(sys.argv[1])
              if re.match(r"[^#].*==", line))
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
locked = {norm(k): v for k, v in locked.items()}
changed = [f"  {norm(d.metadata['Name'])}: {locked[norm(d.metadata['Name'])]} -> {d.version}"
           for d in md.distributions() if locked.get(norm(d.metadata["Name"]), d.version) != d.version]
print("\n".join(sorted(changed)) or "  (none: the lock is the newest today)")
PY
port=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if ! HF_HUB_OFFLINE=1 "$VENV/bin/python" "$ROOT/tools/comfy_host.py" demo --exit --port "$port" --base-dir "$WORK/base"; then
  echo "[latest] FAILED: with the newest releases listed above, the demo workflow no longer runs." >&2
  echo "[latest] Users installing requirements.txt today get these versions. Fix the pack, or bound the" >&2
  echo "[latest] breaking package in requirements.txt and pyproject.toml, then refresh requirements-lock.txt." >&2
  exit 1
fi
echo "[latest] OK: the pack runs the demo workflow with the newest releases."
