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

# torch and its CUDA libraries (~6 GB) are pinned alike in .venv and here: hard-link .venv's files instead of
# installing them twice (CI's disk is shared and has run out). pip unlinks a file before writing it, so
# nothing done here can change .venv. Without .venv, with another Python or another filesystem, pip installs them.
share_torch_from_venv() {
  local main_py=$ROOT/.venv/bin/python
  [ -x "$main_py" ] || return 0
  "${PYTHON:-$(command -v python3.11 || command -v python3)}" -m venv "$VENV"
  "$main_py" - "$VENV/bin/python" <<'PY' || echo "[latest] torch not shared with .venv: pip installs it"
import importlib.metadata as md, os, subprocess, sys
from pathlib import Path
target_python = sys.argv[1]
probe = "import sys, sysconfig; print(sys.version_info[:2], sysconfig.get_path('purelib'))"
target_version, target = subprocess.check_output([target_python, "-c", probe], text=True).rsplit(" ", 1)
if target_version != str(sys.version_info[:2]):
    sys.exit(f"[latest] .venv has Python {sys.version_info[:2]}, the new venv {target_version}")
target = Path(target.strip())
shared = [d for d in md.distributions() if (name := d.metadata["Name"].lower()) in {"torch", "torchvision", "triton"}
          or name.startswith(("nvidia-", "cuda-"))]
for dist in shared:
    # metadata last: pip takes a distribution as installed only once all of its files are there
    for file in sorted(dist.files or (), key=lambda f: ".dist-info" in str(f)):
        source, dest = Path(dist.locate_file(file)), target / file
        if ".." in file.parts or not source.is_file() or dest.exists():
            continue  # console scripts live outside site-packages and name .venv's Python
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(source, dest)
print(f"[latest] hard-linked from .venv: {', '.join(sorted(d.metadata['Name'] for d in shared))}")
PY
}
share_torch_from_venv
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
