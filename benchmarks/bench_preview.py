#!/usr/bin/env python3
"""Live previews: step time with and without a preview per step, side by side in one run.

    .venv/bin/python benchmarks/bench_preview.py [--model DIR ...] [--device auto|tpu|cuda|cpu]
        [--size 512x512] [--steps 4] [--runs 3]

Without --model it measures the tiny FLUX.1-schnell of the tests and the FLUX.1-schnell-shaped
bench model (real layer widths). Runs alternate previews off and on; the figures are the fastest
and the median gap between step callbacks over all runs (on a shared machine other work only adds
time, so the fastest step is the fair comparison; the median shows the noise). "On" is the
runtime's preview (latents off the device, unpacked, mapped to RGB) plus what ComfyUI then does
with it, in the same thread here (an upper bound: ComfyUI scales and JPEG-encodes on its server
thread): a PIL image, scaled to 512, JPEG. "preview alone" times that work by itself, on the
latents of one step of the same pipeline (the fastest of 30), and compares it with a step.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import statistics
import sys
import time
import timeit
from pathlib import Path

from common import PROMPT, bench_model, parse_size
from PIL import Image, ImageOps

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.preview import Previewer, PreviewSpec
from tpu_diffusers_runtime.tasks import TASKS, SampleRequest

# Latent channels per ComfyUI latent format: the cost depends on the shape of the factors, not on their values
# (the real ones are ComfyUI's, which this benchmark does not import).
CHANNELS = {"Flux": 16, "SD3": 16, "Flux2": 32, "Wan21": 16, "QwenImage21": 64}
PREVIEW_SIZE = 512  # ComfyUI's default --preview-size


def comfy_side(preview) -> None:
    """What ComfyUI's server does with a preview: a PIL image, scaled to fit --preview-size, as JPEG."""
    image = ImageOps.contain(Image.fromarray(preview), (PREVIEW_SIZE, PREVIEW_SIZE), Image.BILINEAR)
    image.save(io.BytesIO(), format="JPEG", quality=95)


class Clock:
    """Timestamps sampling steps; hands each preview to comfy_side, in the same thread (an upper bound)."""

    def __init__(self):
        self.stamps, self.previews = [], 0

    def __call__(self, done, total, what, *preview):
        if what != "sampling":
            return
        if preview and preview[0] is not None:
            comfy_side(preview[0])
            self.previews += 1
        self.stamps.append(time.perf_counter())

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]


def preview_work_seconds(pipe, family, request, spec, repeat: int = 30) -> float:
    """The preview work of one step alone (fastest of `repeat`), on latents of this run's shape taken
    from the pipeline's own loop: a figure that the machine's noise barely touches."""
    latents = []
    pipe(**TASKS["text2image"].pipeline_kwargs(family, dataclasses.replace(request, steps=1)),
         callback_on_step_end=lambda _pipe, _step, _t, kwargs: latents.append(kwargs["latents"]) or kwargs)
    previewer = Previewer(spec, pipe, family, request.height, request.width)
    return min(timeit.repeat(lambda: comfy_side(previewer(latents[0])), number=1, repeat=repeat))


def measure(model: Path, args) -> tuple[list[float], list[float], float]:
    handle = PipelineHandle.of(source=str(model), model_class=inspect_source(str(model)), device=args.device)
    family = family_for(handle.model_class)
    spec = PreviewSpec(factors=((0.1, 0.0, -0.1),) * CHANNELS[family.comfy_latent_format], bias=(0.0, 0.0, 0.0))
    width, height = parse_size(args.size)
    engine = Engine()
    request = SampleRequest(prompt=PROMPT, width=width, height=height, steps=args.steps, guidance=0.0, seed=0)
    engine.generate(handle, request)  # loads, and warms the kernels
    off, on = [], []
    for _ in range(args.runs):
        for preview, gaps in ((None, off), (spec, on)):
            clock = Clock()
            engine.generate(handle, request, on_progress=clock, preview=preview)
            assert clock.previews == (args.steps if preview else 0), clock.previews  # one per step when on
            gaps += clock.gaps()
    work = preview_work_seconds(engine.realise(handle)[0].pipe, family, request, spec)
    engine.unload()
    return off, on, work


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, action="append", help="a diffusers folder (repeatable)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--size", default="512x512")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    models = args.model or [bench_model(None, "tiny"), bench_model(None, "bench")]
    rows = []
    for model in models:
        off, on, work = measure(bench_model(model), args)
        rows.append((model.name, min(off), min(on), statistics.median(off), statistics.median(on), work))

    print(f"\ndevice {args.device}, {args.size}, {args.steps} steps, {args.runs} runs each, alternating; ms per step")
    print(f"{'model':<22}{'off fastest':>12}{'on fastest':>11}{'on/off':>8}{'off median':>11}{'on median':>10}"
          f"{'preview alone':>14}{'of a step':>10}")
    for name, off, on, off_median, on_median, work in rows:
        print(f"{name:<22}{off * 1000:>12.1f}{on * 1000:>11.1f}{on / off:>8.3f}{off_median * 1000:>11.1f}"
              f"{on_median * 1000:>10.1f}{work * 1000:>14.2f}{work / off:>10.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
