#!/usr/bin/env python3
"""LoRAs: step time without a LoRA, with a fused one, and with peft's unfused adapter, side by side in one
run; and the seconds to switch LoRAs on the loaded pipeline against reloading it.

    .venv/bin/python benchmarks/bench_lora.py [--model DIR ...] [--device auto|tpu|cuda|cpu]
        [--size 512x512] [--steps 4] [--runs 3] [--rank 32]

Without --model it measures the tiny FLUX.1-schnell of the tests and the FLUX.1-schnell-shaped bench model
(real layer widths). The LoRAs are tools/tiny_loras.py ones (diffusers format, the transformer's attention
linears, rank --rank), made once next to the model. Runs alternate the three ways; the figures are the
fastest and the median gap between step callbacks over all runs (other work on a shared machine only adds
time). "unfused" is diffusers' own LoRA path without fusing: `load_lora_weights` + `set_adapters`, so every
step runs the peft layers. Switching is `apply_loras` from one LoRA to another (restore the base weights
from the CPU backups, load, fuse, unload), to another strength, and back to none (restore only); reloading
is `load_pipeline` from disk (files in the page cache after the first load), placed on the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from common import PROMPT, StepClock, bench_model, parse_size

import tiny_loras
from runtime.engine import Engine
from runtime.handle import PipelineHandle
from runtime.loading import inspect_source, load_pipeline
from runtime.lora import apply_loras
from runtime.modes import outside_inference_mode
from runtime.sampling import SampleRequest
from runtime.specs import LoraSpec


def lora_files(model: Path, rank: int) -> tuple[str, str]:
    """Two LoRAs for `model` (seeds 1 and 2), built once beside it."""
    files = []
    for seed in (1, 2):
        path = model.parent / f"{model.name}-loras" / f"attention-r{rank}-s{seed}.safetensors"
        if not path.exists():
            print(f"building LoRA {path}", flush=True)
            partial = path.with_name(path.stem + ".partial.safetensors")
            tiny_loras.build(model, partial, seed=seed, rank=rank)
            partial.rename(path)
        files.append(str(path))
    return files[0], files[1]


def seconds(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def measure(model: Path, args) -> dict:
    a, b = lora_files(model, args.rank)
    handle = PipelineHandle(source=str(model), pipeline_class=inspect_source(str(model)), device=args.device)
    width, height = parse_size(args.size)
    request = SampleRequest(prompt=PROMPT, width=width, height=height, steps=args.steps, guidance=0.0, seed=0)
    engine = Engine()
    fused_handle = dataclasses.replace(handle, loras=(LoraSpec(a, 1.0),))
    engine.generate(handle, request)  # loads, and warms the kernels
    entry, device, _ = engine.realise(handle)
    pipe = entry.pipe

    def unfused_on():
        pipe.load_lora_weights(a, adapter_name="unfused")
        pipe.set_adapters(["unfused"], [1.0])

    gaps = {"none": [], "fused": [], "unfused": []}
    for _ in range(args.runs):
        for way in gaps:
            with outside_inference_mode():
                if way == "unfused":
                    unfused_on()  # the pipeline has no LoRA applied now: this adapter is all there is
            clock = StepClock()
            engine.generate(fused_handle if way == "fused" else handle, request, on_progress=clock)
            gaps[way] += [y - x for x, y in zip(clock.stamps, clock.stamps[1:])]
            if way == "unfused":
                with outside_inference_mode():
                    pipe.unload_lora_weights()

    switch = {}
    with outside_inference_mode():
        apply_loras(pipe, (LoraSpec(a, 1.0),), entry.lora)
        switch["A -> B"] = seconds(lambda: apply_loras(pipe, (LoraSpec(b, 1.0),), entry.lora))
        switch["B -> B at 0.5"] = seconds(lambda: apply_loras(pipe, (LoraSpec(b, 0.5),), entry.lora))
        switch["B -> none"] = seconds(lambda: apply_loras(pipe, (), entry.lora))
        switch["none -> A"] = seconds(lambda: apply_loras(pipe, (LoraSpec(a, 1.0),), entry.lora))
        layers = len({key.rsplit(".", 1)[0] for key in entry.lora.changed})  # layers, not parameters
        apply_loras(pipe, (), entry.lora)
        engine.unload()
        reload = seconds(lambda: load_pipeline(handle, device))
    return dict(gaps=gaps, switch=switch, reload=reload, layers=layers)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, action="append", help="a diffusers folder (repeatable)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--size", default="512x512")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args(argv)
    models = args.model or [bench_model(None, "tiny"), bench_model(None, "bench")]
    results = [(model.name, measure(bench_model(model), args)) for model in models]

    print(f"\ndevice {args.device}, {args.size}, {args.steps} steps, {args.runs} runs each, alternating, "
          f"LoRA rank {args.rank} on the attention linears; ms per step")
    print(f"{'model':<22}{'none fastest':>13}{'fused':>9}{'unfused':>9}{'fused/none':>11}{'unfused/none':>13}"
          f"{'none median':>12}{'fused med':>10}{'unfused med':>12}")
    for name, r in results:
        fast = {way: min(g) for way, g in r["gaps"].items()}
        median = {way: statistics.median(g) for way, g in r["gaps"].items()}
        print(f"{name:<22}{fast['none'] * 1000:>13.1f}{fast['fused'] * 1000:>9.1f}{fast['unfused'] * 1000:>9.1f}"
              f"{fast['fused'] / fast['none']:>11.3f}{fast['unfused'] / fast['none']:>13.3f}"
              f"{median['none'] * 1000:>12.1f}{median['fused'] * 1000:>10.1f}{median['unfused'] * 1000:>12.1f}")
    print("\nseconds to switch LoRAs on the loaded pipeline vs reloading it")
    print(f"{'model':<22}{'layers':>7}" + "".join(f"{k:>15}" for k in results[0][1]["switch"]) +
          f"{'reload':>9}{'A->B / reload':>15}")
    for name, r in results:
        print(f"{name:<22}{r['layers']:>7}" + "".join(f"{v:>15.3f}" for v in r["switch"].values()) +
              f"{r['reload']:>9.2f}{r['switch']['A -> B'] / r['reload']:>15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
