#!/usr/bin/env python3
"""Make this interpreter, as it is, able to run the pack, or say exactly why it cannot.

    python tools/python_here.py [--wheels DIR [--into FOLDER]]

What `bash scripts/verify_device.sh --python-here` runs first: a machine with its own torch and no
network (a lent GPU machine, a TPU VM whose torch stays as it is) gets the packages it lacks as wheels
carried beside the pack (scripts/device_wheels.sh builds the folder). The wheels are unpacked into
FOLDER, which the caller puts first on PYTHONPATH; nothing is installed into the interpreter. A wheel
is a zip of what goes into site-packages, so unpacking is installing for the wheels that have no
.data folder, and it needs no pip (a venv made by uv has none). Then every package the pack needs is
imported; the exit code is 1, with a list of what is missing and how to carry it, if any fails.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Beyond requirements.txt (which never names torch: ComfyUI owns it): the tests, tiny_models' tokenizers,
# and packaging for the version checks here.
ALSO_NEEDED = ["torch", "pytest", "tokenizers", "packaging"]
IMPORT_NAMES = {"protobuf": "google.protobuf", "pillow": "PIL"}


def python_of(wheel: str) -> str | None:
    """The CPython a wheel's compiled code is built for ("cp312"), or None when any Python 3 takes it
    (py3-none, cp310-abi3)."""
    python_tag, abi_tag = wheel.removesuffix(".whl").split("-")[-3:-1]
    return python_tag if abi_tag.startswith("cp") else None


def unpack(wheels: Path, into: Path) -> list[str]:
    """Unpack every wheel in `wheels` into `into` (emptied first, so it holds exactly these);
    returns the wheels' file names."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"[python-here] no wheels in {wheels}: build them with bash scripts/device_wheels.sh {wheels}")
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    other = [wheel.name for wheel in found if python_of(wheel.name) not in (None, here)]
    if other:
        raise SystemExit(f"[python-here] built for another Python than this {sys.version.split()[0]}: "
                         f"{', '.join(other)}; build the folder for it with PYTHON_VERSION="
                         f"{sys.version_info.major}.{sys.version_info.minor} bash scripts/device_wheels.sh {wheels}")
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for wheel in found:
        with zipfile.ZipFile(wheel) as archive:
            if any(re.match(r"[^/]+\.data/", name) for name in archive.namelist()):
                raise SystemExit(f"[python-here] {wheel.name} has a .data folder, which unpacking does not "
                                 f"install: install it with pip instead")
            archive.extractall(into)
    return [wheel.name for wheel in found]


def requirements() -> list[str]:
    """The pack's requirements (requirements.txt) and ALSO_NEEDED, as requirement strings."""
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    listed = [line.split("#")[0].strip() for line in lines]
    return [line for line in listed if line] + ALSO_NEEDED


def problem(requirement: str) -> str | None:
    """Why `requirement` is not met by this interpreter (not importable, or too old), or None."""
    name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", requirement).groups()
    module = IMPORT_NAMES.get(name.lower(), name.replace("-", "_"))
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001  (an import that fails in any way is a package this run lacks)
        return f"{requirement}: `import {module}` fails: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if spec:
        try:
            from packaging.specifiers import SpecifierSet
        except ImportError:
            return None  # packaging is in ALSO_NEEDED: its own line says it is missing
        version = importlib.metadata.version(name)
        if version not in SpecifierSet(spec):
            return f"{requirement}: {version} is installed"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, help="a folder of wheels to unpack (scripts/device_wheels.sh)")
    parser.add_argument("--into", type=Path, default=ROOT / ".comfyui" / "python-here",
                        help="where to unpack them (default .comfyui/python-here), for the caller's PYTHONPATH")
    args = parser.parse_args(argv)
    if args.wheels:
        names = unpack(args.wheels, args.into)
        sys.path.insert(0, str(args.into))
        print(f"[python-here] unpacked into {args.into}: {', '.join(names)}", flush=True)
    problems = [p for p in map(problem, requirements()) if p]
    if not problems:
        return 0
    print(f"[python-here] {sys.executable} (Python {sys.version.split()[0]}) cannot run the pack; it lacks:",
          *(f"  - {p}" for p in problems), sep="\n", file=sys.stderr)
    print("Carry what is missing as wheels: on a machine with the package registries, "
          "`bash scripts/device_wheels.sh wheels` (PYTHON_VERSION= the Python above; PACKAGES= the names), "
          "then `bash scripts/verify_device.sh --python-here --wheels wheels ...` here (with the device tool: "
          "carry [\"wheels\"]). See docs/device_check.md.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
