#!/usr/bin/env python3
"""Loading from ComfyUI-style single files vs from the diffusers folder, side by side in one run.

    .venv/bin/python benchmarks/bench_single_file.py [--model DIR] [--device auto|tpu|cuda|cpu] [--runs 3]

Without --model it uses FLUX.1-dev at the real width with one double and one single block (bf16, ~1 GB;
tiny text encoders and VAE) and writes its files in the Comfy-Org layout once (tools/tiny_single_files.py):
the BFL-layout transformer, clip_l, t5xxl, ae, and the scaled-fp8 transformer and T5. Every load runs in a fresh
process (nothing cached in memory; the OS file cache is warm for all after the first round), the
ways alternate, and the table gives the fastest and median load seconds and the process's peak RSS
above what it held before loading (`ru_maxrss`), next to the weights' size on disk: a single file is
read whole into host memory and converted before the model is built, a folder is memory-mapped.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, built_wide_flux1

WAYS = ("folder", "files", "files fp8")


def written_files(model: Path) -> dict[str, str]:
    """The model's single files, written beside it once."""
    import tiny_single_files

    out = model.parent / f"files-{model.name}"
    done = out / "written.json"
    if not done.exists():
        print(f"writing the single files of {model.name} into {out}", flush=True)
        files = tiny_single_files.flux1_files(model, out)
        done.write_text(json.dumps({kind: str(path) for kind, path in files.items()}))
    return json.loads(done.read_text())


def handle_files(way: str, files: dict[str, str]) -> tuple:
    if way == "folder":
        return ()
    fp8 = way == "files fp8"
    return (("transformer", files["transformer_fp8" if fp8 else "transformer"]), ("text_encoder", files["clip_l"]),
            ("text_encoder_2", files["t5xxl_fp8" if fp8 else "t5xxl"]), ("vae", files["ae"]))


def child(model: str, way: str, device: str) -> None:
    """One load in this fresh process; prints seconds and peak RSS growth as JSON."""
    import torch  # noqa: F401  (imported before the baseline, as ComfyUI has it loaded)

    from tpu_diffusers_runtime.device import resolve_device
    from tpu_diffusers_runtime.handle import PipelineHandle
    from tpu_diffusers_runtime.loading import load_pipeline

    files = written_files(Path(model)) if way != "folder" else {}
    handle = PipelineHandle.of(source=model, model_class="FluxPipeline", files=handle_files(way, files),
                            device=device, dtype="bfloat16")
    info = resolve_device(device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    load_pipeline(handle, info)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_growth_mib": (peak - before) / 1024}))


def measure(model: Path, way: str, device: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", way, "--model", str(model), "--device", device],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"{way} load failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def disk_mib(model: Path, way: str, files: dict[str, str]) -> float:
    paths = [Path(p) for _, p in handle_files(way, files)] or \
        [p for p in model.rglob("*.safetensors") if p.parent.name in ("transformer", "text_encoder", "text_encoder_2", "vae")]
    return sum(p.stat().st_size for p in paths) / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a FLUX.1-dev diffusers folder (FLUX's real width)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model = args.model.resolve() if args.model else built_wide_flux1()
    if args.child:
        child(str(model), args.child, args.device)
        return 0
    files = written_files(model)
    results = {way: [] for way in WAYS}
    for _ in range(args.runs):
        for way in WAYS:
            results[way].append(measure(model, way, args.device))
    folder_fastest = min(r["seconds"] for r in results["folder"])
    print(f"\n{model.name}, device {args.device}, bf16, {args.runs} loads each in fresh processes, alternating")
    print(f"{'way':<11}{'on disk MiB':>12}{'fastest s':>10}{'median s':>9}{'vs folder':>10}{'peak RSS growth MiB':>20}")
    for way, runs in results.items():
        seconds = [r["seconds"] for r in runs]
        print(f"{way:<11}{disk_mib(model, way, files):>12.0f}{min(seconds):>10.2f}{statistics.median(seconds):>9.2f}"
              f"{min(seconds) / folder_fastest:>10.2f}{max(r['peak_growth_mib'] for r in runs):>20.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
