#!/usr/bin/env bash
# The wheels `bash scripts/verify_device.sh --python-here --wheels DIR` needs on a machine that has torch
# and no network, built here from the package registries and carried there with the pack:
#   bash scripts/device_wheels.sh DIR
# PACKAGES: what the lent GPU machine (Python 3.12, torch, transformers 5, accelerate, peft, safetensors,
# huggingface_hub, numpy, pillow, pytest) lacks of the pack's requirements: diffusers and its
# importlib_metadata (which needs zipp and lazy-importer), sentencepiece and protobuf (requirements.txt).
# Each at its version in requirements-lock.txt, without dependencies, built for PYTHON_VERSION on
# manylinux x86_64 where it is binary. DIR is emptied of wheels first; the total must stay under the
# 64 MiB the device tool carries.
#   PYTHON_VERSION=3.12 (default)   PACKAGES="..." (default above)   PYTHON=python3 (the pip that downloads)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:?usage: bash scripts/device_wheels.sh DIR}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
PACKAGES=${PACKAGES:-diffusers importlib_metadata zipp lazy-importer sentencepiece protobuf}
PYTHON=${PYTHON:-python3}
LIMIT=$((64 * 1024 * 1024))

pins=()
for name in $PACKAGES; do
  pattern=$(echo "$name" | sed 's/[-_.]/[-_.]/g')
  pin=$(grep -iE "^${pattern}==" "$ROOT/requirements-lock.txt") \
    || { echo "[wheels] $name has no version in requirements-lock.txt" >&2; exit 1; }
  pins+=("$pin")
done
mkdir -p "$DIR"
rm -f "$DIR"/*.whl
echo "[wheels] ${pins[*]} for Python $PYTHON_VERSION, manylinux x86_64, into $DIR"
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$DIR" "${pins[@]}"
ls -l "$DIR"/*.whl
total=$(cat "$DIR"/*.whl | wc -c)
mib=$(awk "BEGIN {printf \"%.1f\", $total / 1048576}")
echo "[wheels] total $((total / 1024)) KiB ($mib MiB) of the 64 MiB the device tool carries"
[ "$total" -lt "$LIMIT" ] || { echo "[wheels] over 64 MiB: carry fewer packages" >&2; exit 1; }
