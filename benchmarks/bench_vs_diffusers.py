#!/usr/bin/env python3
"""Our nodes in a real ComfyUI server vs a plain diffusers script: same pipeline, seed, size, steps.

The two arms alternate, image by image, in one run, so machine noise hits both alike.
Ours is timed from ComfyUI's own execution_start to execution_success messages (the whole
prompt: Sampler plus Save Image); plain is `pipe(...)` plus saving the PNG. Peak memory:
the process's peak RSS (VmHWM) for each arm, and peak accelerator memory where there is one.

    .venv/bin/python benchmarks/bench_vs_diffusers.py [--model DIR] [--device auto|tpu|cuda|cpu]
        [--size 256] [--steps 4] [--runs 5]

Without --model it builds a FLUX.1-schnell-shaped model with real layer widths (3072) and
few layers, random weights (tools/tiny_models.py, size "bench"), so compute dominates a step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from comfy_host import ComfyServer, execution_error, prepare_comfyui  # noqa: E402

PROMPT = "a golden retriever surfing a wave, photorealistic"


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PlainDiffusers:
    """What a user would write without ComfyUI: from_pretrained, .to(device), pipe(...)."""

    def __init__(self, folder: Path, device: str):
        import torch

        from runtime.device import resolve_device

        self.torch = torch
        self.device = resolve_device(device)
        dtype = getattr(torch, self.device.default_dtype)
        import diffusers

        index = json.loads((folder / "model_index.json").read_text())
        self.pipe = getattr(diffusers, index["_class_name"]).from_pretrained(folder, dtype=dtype)
        self.pipe.to(self.device.type)

    def run(self, size: int, steps: int, seed: int, out: Path) -> float:
        from runtime.device import synchronize

        start = time.perf_counter()
        image = self.pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=steps, guidance_scale=0.0,
                          generator=self.torch.Generator("cpu").manual_seed(seed)).images[0]
        synchronize(self.device)
        image.save(out / f"plain_{seed}.png")
        return time.perf_counter() - start

    def peak_device_mb(self) -> float | None:
        from runtime.device import peak_memory_bytes

        peak = peak_memory_bytes(self.device)
        return None if peak is None else peak / 2**20


def ours_workflow(model_name: str, device: str, size: int, steps: int, seed: int) -> dict:
    workflow = json.loads((ROOT / "workflows" / "api" / "tpu_demo_tiny_flux.json").read_text())
    workflow["1"]["inputs"].update(model=model_name, device=device)
    workflow["3"]["inputs"].update(width=size, height=size, steps=steps, seed=seed, guidance=0.0, prompt=PROMPT)
    return workflow


def prompt_seconds(entry: dict) -> float:
    stamps = {kind: data["timestamp"] for kind, data in entry["status"]["messages"]}
    return (stamps["execution_success"] - stamps["execution_start"]) / 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a diffusers folder (default: build the bench model)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-vs-diffusers-"))
    model = args.model
    if model is None:
        import tiny_models

        model = ROOT / ".comfyui" / "bench-models" / "bench-flux1-schnell"
        if not (model / "model_index.json").exists():
            print(f"building the bench model into {model}", flush=True)
            tiny_models.build("flux1-schnell", model, size="bench")
    model = model.resolve()
    (work / "models" / "diffusers").mkdir(parents=True)
    (work / "models" / "diffusers" / model.name).symlink_to(model, target_is_directory=True)

    server = ComfyServer(prepare_comfyui(), base_dir=work)
    server.start()
    try:
        plain = PlainDiffusers(model, args.device)
        times = {"plain": [], "ours": []}
        loads_after_first = 0
        for i in range(args.runs + 1):  # run 0 warms both arms up (ours loads the model in it)
            seed = 1000 + i
            t_plain = plain.run(args.size, args.steps, seed, work)
            entry = server.run(ours_workflow(model.name, args.device, args.size, args.steps, seed), timeout=3600)
            error = execution_error(entry)
            if error:
                raise SystemExit(f"ComfyUI run failed: {error['exception_message']}")
            info = entry["outputs"]["3"]["tpu_run_info"][0]
            if i == 0:
                ours_peak_device = info["peak_device_memory_mb"]
                continue
            loads_after_first += info["loaded"]
            times["plain"].append(t_plain)
            times["ours"].append(prompt_seconds(entry))
            print(f"run {i}: plain {t_plain:.3f}s  ours {times['ours'][-1]:.3f}s", flush=True)
        plain_peak_device = plain.peak_device_mb()
        rss = {"plain": peak_rss_mb(), "ours": peak_rss_mb(server.process.pid)}
    finally:
        server.stop()

    def fmt(value):
        return "-" if value is None else f"{value:.0f}"

    med = {arm: statistics.median(t) for arm, t in times.items()}
    print()
    print(f"model {model.name}, device {plain.device.type}, {args.size}x{args.size}, {args.steps} steps, "
          f"{args.runs} runs per arm (alternating, after one warm-up each)")
    print(f"{'arm':<8}{'median s/image':>16}{'min s/image':>14}{'peak RSS MiB':>14}{'peak device MiB':>17}")
    for arm, device_peak in (("plain", plain_peak_device), ("ours", ours_peak_device)):
        print(f"{arm:<8}{med[arm]:>16.3f}{min(times[arm]):>14.3f}{rss[arm]:>14.0f}{fmt(device_peak):>17}")
    print(f"ratio ours/plain (median per image): {med['ours'] / med['plain']:.3f}")
    print(f"pipeline loads after the first run: {loads_after_first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
