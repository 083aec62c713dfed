#!/usr/bin/env python3
"""Our nodes in a real ComfyUI server vs a plain diffusers script: same pipeline, seed, size, steps.

The two arms alternate, image by image, in one run, so machine noise hits both alike (on a TPU
they run one after the other, ComfyUI's first: a chip belongs to the first process that uses it
until that process exits, so the server must be gone before this process takes the chip).
Ours is timed from ComfyUI's own execution_start to execution_success messages (the whole
prompt: Sampler plus Save Image); plain is `pipe(...)` plus saving the PNG. Peak memory:
the process's peak RSS (VmHWM) for each arm, and peak accelerator memory where there is one.

    .venv/bin/python benchmarks/bench_vs_diffusers.py [--model DIR] [--device auto|tpu|cuda|cpu]
        [--size 256] [--steps 4] [--runs 5] [--ours comfyui|engine]

--ours engine, for a machine where no ComfyUI server can start (only the pack's own packages are
there): ours is the runtime's Engine in this process, called as the Sampler node calls it, plus the
PNG saved as Save Image saves it. Both arms then share this process (and the device, each with its
own pipeline loaded), so the memory columns are not measured.

Without --model it builds a FLUX.1-schnell-shaped model with real layer widths (3072) and
few layers, random weights (tools/tiny_models.py, size "bench"), so compute dominates a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import PROMPT, ROOT, bench_model
from comfy_host import ComfyServer, execution_error, prepare_comfyui


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

        from tpu_diffusers_runtime.device import resolve_device

        self.torch = torch
        self.device = resolve_device(device)
        dtype = getattr(torch, self.device.default_dtype)
        import diffusers

        index = json.loads((folder / "model_index.json").read_text())
        self.pipe = getattr(diffusers, index["_class_name"]).from_pretrained(folder, dtype=dtype)
        self.pipe.to(self.device.type)

    def run(self, size: int, steps: int, seed: int, out: Path) -> float:
        from tpu_diffusers_runtime.device import synchronize

        start = time.perf_counter()
        image = self.pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=steps, guidance_scale=0.0,
                          generator=self.torch.Generator("cpu").manual_seed(seed)).images[0]
        synchronize(self.device)
        image.save(out / f"plain_{seed}.png")
        return time.perf_counter() - start

    def peak_device_mb(self) -> float | None:
        from tpu_diffusers_runtime.device import peak_memory_bytes

        peak = peak_memory_bytes(self.device)
        return None if peak is None else peak / 2**20


class OursEngine:
    """Ours without a server: the runtime's Engine with the handle the demo workflow's nodes build
    (eager, on the device), and the image saved as ComfyUI's Save Image saves it."""

    def __init__(self, folder: Path, device: str):
        from tpu_diffusers_runtime.engine import Engine
        from tpu_diffusers_runtime.handle import PipelineHandle
        from tpu_diffusers_runtime.loading import inspect_source

        self.engine = Engine()
        self.handle = PipelineHandle.of(source=str(folder), model_class=inspect_source(str(folder)), device=device)

    def run(self, size: int, steps: int, seed: int, out: Path) -> tuple[float, dict]:
        """Seconds for one image, and its run info."""
        import numpy as np
        from PIL import Image

        from tpu_diffusers_runtime.tasks import SampleRequest

        start = time.perf_counter()
        generation = self.engine.generate(self.handle, SampleRequest(prompt=PROMPT, width=size, height=size,
                                                                     steps=steps, guidance=0.0, seed=seed))
        pixels = np.clip(255.0 * generation.images[0].cpu().numpy(), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(out / f"ours_{seed}.png")
        return time.perf_counter() - start, generation.info.as_dict()


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
    parser.add_argument("--ours", choices=("comfyui", "engine"), default="comfyui",
                        help="ours through a real ComfyUI server, or through the runtime's Engine here (no ComfyUI)")
    args = parser.parse_args(argv)

    from tpu_diffusers_runtime.device import resolve_device

    work = Path(tempfile.mkdtemp(prefix="bench-vs-diffusers-"))
    model = bench_model(args.model)
    (work / "models" / "diffusers").mkdir(parents=True)
    (work / "models" / "diffusers" / model.name).symlink_to(model, target_is_directory=True)
    alternate = resolve_device(args.device).type != "tpu"
    seeds = [1000 + i for i in range(args.runs + 1)]  # the first run warms each arm up (ours loads the model)
    times, infos, plain = {"plain": [], "ours": []}, [], None

    def run_plain(seed: int) -> None:
        times["plain"].append(plain.run(args.size, args.steps, seed, work))
        print(f"plain, seed {seed}: {times['plain'][-1]:.3f}s", flush=True)

    def run_ours(seed: int) -> None:
        if args.ours == "engine":
            seconds, info = ours.run(args.size, args.steps, seed, work)
            infos.append(info)
            times["ours"].append(seconds)
            print(f"ours (Engine, no server), seed {seed}: {seconds:.3f}s", flush=True)
            return
        entry = server.run(ours_workflow(model.name, args.device, args.size, args.steps, seed), timeout=3600)
        error = execution_error(entry)
        if error:
            raise SystemExit(f"ComfyUI run failed: {error['exception_message']}")
        infos.append(entry["outputs"]["3"]["tpu_run_info"][0])
        times["ours"].append(prompt_seconds(entry))
        print(f"ours, seed {seed}: {times['ours'][-1]:.3f}s", flush=True)

    if args.ours == "engine":  # one process holds the device for both arms: they alternate everywhere
        ours, plain, alternate = OursEngine(model, args.device), PlainDiffusers(model, args.device), True
        for seed in seeds:
            run_plain(seed)
            run_ours(seed)
        ours_rss = None
    else:
        server = ComfyServer(prepare_comfyui(), base_dir=work)
        server.start()
        try:
            if alternate:
                plain = PlainDiffusers(model, args.device)
            for seed in seeds:
                if alternate:
                    run_plain(seed)
                run_ours(seed)
            ours_rss = peak_rss_mb(server.process.pid)
        finally:
            server.stop()
    if not alternate:
        plain = PlainDiffusers(model, args.device)
        for seed in seeds:
            run_plain(seed)
    times = {arm: runs[1:] for arm, runs in times.items()}
    shared = args.ours == "engine"
    rss = {"plain": None if shared else peak_rss_mb(), "ours": ours_rss}
    plain_peak_device = None if shared else plain.peak_device_mb()
    ours_peak_device = None if shared else infos[0]["peak_device_memory_mb"]
    loads_after_first = sum(info["loaded"] for info in infos[1:])

    def fmt(value):
        return "-" if value is None else f"{value:.0f}"

    med = {arm: statistics.median(t) for arm, t in times.items()}
    print()
    print(f"model {model.name}, device {plain.device.type}, {args.size}x{args.size}, {args.steps} steps, "
          f"{args.runs} runs per arm ({'alternating' if alternate else 'one arm after the other'}, "
          f"after one warm-up each)" + ("; ours through the Engine in this process, no ComfyUI server: memory "
                                        "not compared" if shared else ""))
    print(f"{'arm':<8}{'median s/image':>16}{'min s/image':>14}{'peak RSS MiB':>14}{'peak device MiB':>17}")
    for arm, device_peak in (("plain", plain_peak_device), ("ours", ours_peak_device)):
        print(f"{arm:<8}{med[arm]:>16.3f}{min(times[arm]):>14.3f}{fmt(rss[arm]):>14}{fmt(device_peak):>17}")
    print(f"ratio ours/plain (median per image): {med['ours'] / med['plain']:.3f}")
    print(f"pipeline loads after the first run: {loads_after_first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
