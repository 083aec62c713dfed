#!/usr/bin/env python3
"""Image inputs, per task: the pack's Engine vs plain diffusers per denoising step, and what switching task on
a loaded model costs next to loading it again. Side by side in one run, one process.

    .venv/bin/python benchmarks/bench_image_tasks.py [--size tiny|bench] [--device auto|tpu|cuda|cpu]
        [--tasks flux1-img2img,...] [--image-size 256x256] [--steps 8] [--denoise 0.75] [--repeats 5] [--threads N]

Per task (FLUX.1 image to image and inpaint, FLUX.1 Kontext edit, SD3 image to image, QwenImage inpaint,
Qwen-Image-Edit-Plus with two references, FLUX.2 with two references; a task whose tools/tiny_models.py
pipeline does not exist yet is skipped, saying so):

- **per step**: the Engine (as the Sampler calls it, in this process) and plain diffusers (the task's class
  loaded with from_pretrained, called with what a diffusers user passes: the same PIL images, mask, strength,
  seed, size and steps) both sample the same request; after one warm run each they alternate --repeats times
  (ABBA order). Step times are the gaps between step-end callbacks (the pack's progress callback, diffusers'
  callback_on_step_end), so image encoding, text encoding and decoding are left out; the table has the
  median of all of an arm's steps and the fastest, the ratios ours / plain of both (target <= 1.02: on a
  shared machine other work only adds time, so the fastest is the fair comparison, the median shows the
  noise), the whole call's ratio (median), and whether both gave the same image (bit for bit).
- **task switch**: on an Engine whose pipeline was loaded by a text-to-image run, the first run of the image
  task (diffusers' from_pipe: no load) vs the same run on an Engine with an empty cache (load from disk, then
  from_pipe): the run info's load_seconds, median over --repeats, 1 step each. A model without text to image
  (Qwen-Image-Edit-Plus) has no switch; one whose image task is its own class (Kontext edit, FLUX.2) switches
  nothing. On a CPU a reload maps the page-cached files again; on an accelerator it copies the weights over.

Both arms share this process and its device (each with its own pipeline): the Engine runs here even where
TPU_DIFFUSERS_WORKER_PROCESS would send a run to a worker (bench_worker_process.py measures that).

--size bench: the tools/tiny_models.py pipelines with real layer widths (compute dominates a step); tiny:
the test suite's (a step is mostly Python and dispatch, so per-step overhead shows most). Kontext and
Qwen-Image-Edit resize their references to about 1 MP, so at bench size these steps are long on a CPU.
--threads sets torch's CPU threads for both arms (on a shared CPU host, 1 keeps other work from stretching
every operator's slowest thread).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from typing import Callable

from common import PROMPT, StepClock, built_model, parse_size

from tpu_diffusers_runtime.device import resolve_device, synchronize
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.tasks import SampleRequest


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    family: str  # a tools/tiny_models.py pipeline
    cls: str  # the diffusers class the task runs (plain diffusers loads this one)
    guidance: float
    images: int = 1  # how many input images
    mask: bool = False
    strength: bool = False  # takes denoise (diffusers' strength)
    max_area: bool = False  # FLUX.1 Kontext: the pack passes max_area = width x height


CASES = [
    Case("flux1-img2img", "flux1-schnell", "FluxImg2ImgPipeline", 0.0, strength=True),
    Case("flux1-inpaint", "flux1-schnell", "FluxInpaintPipeline", 0.0, mask=True, strength=True),
    Case("flux1-kontext-edit", "flux1-kontext", "FluxKontextPipeline", 2.5, max_area=True),
    Case("sd3-img2img", "sd3", "StableDiffusion3Img2ImgPipeline", 4.5, strength=True),
    Case("qwenimage-inpaint", "qwenimage", "QwenImageInpaintPipeline", 4.0, mask=True, strength=True),
    Case("qwenimage-edit-plus", "qwenimage-edit-plus", "QwenImageEditPlusPipeline", 4.0, images=2),
    Case("flux2-edit", "flux2", "Flux2Pipeline", 4.0, images=2),
]


@dataclasses.dataclass
class Inputs:
    """One request's inputs in both forms: ComfyUI's float arrays for the Engine, PIL images for diffusers."""

    request: SampleRequest
    plain: dict  # the task's image arguments of the diffusers call

    @classmethod
    def of(cls, case: Case, width: int, height: int, steps: int, denoise: float, seed: int = 7) -> "Inputs":
        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(0)
        pixels = [(rng.random((height, width, 3)) * 255).astype(np.uint8) for _ in range(case.images)]
        mask = np.zeros((height, width), np.uint8)
        mask[height // 4: 3 * height // 4, width // 4: 3 * width // 4] = 255
        denoise = denoise if case.strength else 1.0
        request = SampleRequest(prompt=PROMPT, width=width, height=height, steps=steps, guidance=case.guidance,
                                seed=seed, denoise=denoise,
                                images=tuple(p[None].astype(np.float32) / 255.0 for p in pixels),
                                mask=(mask[None] / 255.0).astype(np.float32) if case.mask else None)
        pil = [Image.fromarray(p) for p in pixels]
        plain = dict(image=pil if case.images > 1 else pil[0])
        if case.mask:
            plain["mask_image"] = Image.fromarray(mask, "L")
        if case.strength:
            plain["strength"] = denoise
        if case.max_area:
            plain["max_area"] = width * height
        return cls(request, plain)


class Plain:
    """What a diffusers user writes: the task's class from_pretrained, .to(device), pipe(...)."""

    def __init__(self, case: Case, folder, device):
        import diffusers
        import torch

        self.torch, self.device = torch, device
        self.family = family_for(inspect_source(str(folder)))
        self.pipe = getattr(diffusers, case.cls).from_pretrained(folder, dtype=getattr(torch, device.default_dtype),
                                                                local_files_only=True)
        self.pipe.to(device.type)

    def run(self, inputs: Inputs) -> tuple[list[float], float, object]:
        """Seconds of each step after the first, seconds for the call, the image [1, H, W, C]."""
        request, stamps = inputs.request, []

        def step_end(_pipe, _step, _timestep, callback_kwargs):
            stamps.append(time.perf_counter())
            return callback_kwargs

        kwargs = {self.family.guidance_kwarg: request.guidance, **inputs.plain}
        if self.family.takes_negative_prompt:
            kwargs["negative_prompt"] = " "  # QwenImage's true CFG runs only with one (the pack passes " " too)
        start = time.perf_counter()
        images = self.pipe(prompt=request.prompt, height=request.height, width=request.width,
                           num_inference_steps=request.steps, output_type="pt", callback_on_step_end=step_end,
                           generator=self.torch.Generator("cpu").manual_seed(request.seed), **kwargs).images
        synchronize(self.device)
        seconds = time.perf_counter() - start
        return gaps(stamps), seconds, images.permute(0, 2, 3, 1).float().cpu()


class Ours:
    """The Engine in this process, called as the Sampler calls it (progress callback on)."""

    def __init__(self, folder, device_name: str):
        self.engine = Engine(distribute=False)
        self.handle = PipelineHandle.of(source=str(folder), model_class=inspect_source(str(folder)),
                                        device=device_name)

    def run(self, inputs: Inputs, cls: str) -> tuple[list[float], float, object]:
        clock = StepClock()
        start = time.perf_counter()
        generation = self.engine.generate(self.handle, inputs.request, on_progress=clock)
        seconds = time.perf_counter() - start
        if generation.info.pipeline != cls:
            raise SystemExit(f"the Engine ran {generation.info.pipeline}, not {cls}")
        return gaps(clock.stamps), seconds, generation.images


def gaps(stamps: list[float]) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:])]


def per_step(case: Case, folder, device, device_name: str, inputs: Inputs, repeats: int) -> dict:
    ours, plain = Ours(folder, device_name), Plain(case, folder, device)
    arms: dict[str, Callable] = {"ours": lambda: ours.run(inputs, case.cls), "plain": lambda: plain.run(inputs)}
    try:
        first = {arm: run() for arm, run in arms.items()}  # warm: loaded, from_pipe done, this shape seen
        steps, calls = {arm: [] for arm in arms}, {arm: [] for arm in arms}
        for repeat in range(repeats):
            for arm in (("plain", "ours") if repeat % 2 == 0 else ("ours", "plain")):
                step, call, _ = arms[arm]()
                steps[arm] += step
                calls[arm].append(call)
                print(f"  {case.name} {arm}: {statistics.median(step) * 1000:.1f} ms/step (median), "
                      f"{call:.3f} s/call", flush=True)
        equal = bool(first["ours"][2].shape == first["plain"][2].shape
                     and (first["ours"][2] == first["plain"][2]).all())
        return {**{f"{arm}_step": statistics.median(steps[arm]) for arm in arms},
                **{f"{arm}_fastest": min(steps[arm]) for arm in arms},
                **{f"{arm}_call": statistics.median(calls[arm]) for arm in arms}, "equal": equal,
                "steps_run": len(first["plain"][0]) + 1}  # plain diffusers' step callbacks (gaps after the first)
    finally:
        ours.engine.unload()
        del ours, plain, arms
        gc.collect()


def switch_and_reload(case: Case, folder, device_name: str, inputs: Inputs, repeats: int) -> dict:
    """load_seconds of the image task's first run: after a text-to-image run (the switch), and on an empty
    cache (a reload), one step each."""
    request = dataclasses.replace(inputs.request, steps=1, denoise=1.0)
    text_only = dataclasses.replace(request, images=(), mask=None)
    handle = PipelineHandle.of(source=str(folder), model_class=inspect_source(str(folder)), device=device_name)
    has_text2image = "text2image" in family_for(handle.model_class).model_classes[handle.model_class]
    switch, reload = [], []
    for _ in range(repeats):
        engine = Engine(distribute=False)
        try:
            if has_text2image:
                engine.generate(handle, text_only)
                info = engine.generate(handle, request).info
                assert not info.loaded and info.pipeline == case.cls, info
                switch.append(info.load_seconds)
                engine.unload()
            info = engine.generate(handle, request).info
            assert info.loaded and engine.cache.stats.loads == (2 if has_text2image else 1), info
            reload.append(info.load_seconds)
        finally:
            engine.unload()
            del engine
            gc.collect()
    return dict(switch=statistics.median(switch) if switch else None, reload=statistics.median(reload))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="bench", help="the tools/tiny_models.py size: tiny or bench")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tasks", default=",".join(c.name for c in CASES), help="comma-separated, of: "
                        + ", ".join(c.name for c in CASES))
    parser.add_argument("--image-size", default="256x256", help="width x height of the inputs and the output")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--denoise", type=float, default=0.75, help="for image to image and inpaint")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own)")
    args = parser.parse_args(argv)
    import tiny_models
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    device = resolve_device(args.device)
    width, height = parse_size(args.image_size)
    wanted = args.tasks.split(",")
    unknown = set(wanted) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown tasks {sorted(unknown)}")
    rows, skipped = [], []
    for case in (c for c in CASES if c.name in wanted):
        if case.family not in tiny_models.MODEL_CLASSES:
            skipped.append(f"{case.name}: tools/tiny_models.py has no '{case.family}' pipeline yet")
            continue
        folder = built_model(case.family, args.size)
        inputs = Inputs.of(case, width, height, args.steps, args.denoise)
        print(f"{case.name} ({case.cls}, {folder.name})", flush=True)
        rows.append(dict(case=case, folder=folder.name,
                         **per_step(case, folder, device, args.device, inputs, args.repeats),
                         **switch_and_reload(case, folder, args.device, inputs, args.repeats)))

    def seconds(value):
        return "—" if value is None else f"{value:.3f}"

    print(f"\ndevice {device.type} ({torch.get_num_threads()} CPU threads), size {args.size}, {width}x{height}, "
          f"{args.steps} steps (denoise {args.denoise:g} where the task takes it), {args.repeats} alternating runs "
          "per arm after one warm run each; ms per step = gaps between step callbacks, over all runs; switch and "
          "reload: median of load_seconds, 1 step")
    print("| task | model | diffusers class | steps run | ms/step ours / plain (median) | ours / plain (median) "
          "| ms/step ours / plain (fastest) | ours / plain (fastest) | ours / plain (call) | same image "
          "| switch s (from_pipe) | reload s | switch / reload |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "—" if r["switch"] is None else f"{r['switch'] / r['reload']:.3f}"
        print(f"| {r['case'].name} | {r['folder']} | `{r['case'].cls}` | {r['steps_run']} | "
              f"{r['ours_step'] * 1000:.1f} / {r['plain_step'] * 1000:.1f} | {r['ours_step'] / r['plain_step']:.3f} | "
              f"{r['ours_fastest'] * 1000:.1f} / {r['plain_fastest'] * 1000:.1f} | "
              f"{r['ours_fastest'] / r['plain_fastest']:.3f} | {r['ours_call'] / r['plain_call']:.3f} | "
              f"{'yes' if r['equal'] else 'NO'} | {seconds(r['switch'])} | {seconds(r['reload'])} | {ratio} |")
    for line in skipped:
        print(f"skipped {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
