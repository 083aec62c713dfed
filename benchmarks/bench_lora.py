#!/usr/bin/env python3
"""LoRAs: step time without a LoRA, with a fused one, and with peft's unfused adapter, side by side in one
run; and the seconds to switch LoRAs on the loaded pipeline against reloading it.

    .venv/bin/python benchmarks/bench_lora.py [--model DIR ...] [--device auto|tpu|cuda|cpu]
        [--size 512x512] [--steps 4] [--runs 3] [--rank 32] [--repeat 10] [--clock wall|process]
        [--threads N]

Without --model it measures the tiny FLUX.1-schnell of the tests and the FLUX.1-schnell-shaped bench model
(real layer widths). The LoRAs are tools/tiny_loras.py ones (diffusers format, the transformer's attention
linears, rank --rank), made once next to the model. Rounds alternate the three ways; in each, the
transformer's forward at the first step is timed alone (the fastest of --repeat calls: other work on a
shared machine only adds time), then a whole run's step gaps (median; noisier). "unfused" is diffusers'
own LoRA path without fusing: `load_lora_weights` + `set_adapters`, so every step runs the peft layers.
Switching is `apply_loras` from one LoRA to another (restore the base weights
from the CPU backups, load, fuse, unload), to another strength, and back to none (restore only); reloading
is `load_pipeline` from disk (files in the page cache after the first load), placed on the device; on the
CPU safetensors maps the files, so the weights are read only when first used: the fair comparison is the
time to the next image, after switching vs in a new engine (load, apply B, one step).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import timeit
from pathlib import Path

from common import PROMPT, StepClock, bench_model, parse_size

import tiny_loras
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source, load_pipeline
from tpu_diffusers_runtime.features.lora import apply_loras
from tpu_diffusers_runtime.modes import outside_inference_mode
from tpu_diffusers_runtime.tasks import SampleRequest, run_pipeline
from tpu_diffusers_runtime.specs import LoraSpec


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


CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
clock = time.perf_counter  # --clock; "process" (this process's CPU time, all threads) is the steadier figure on
# a shared CPU, where other work only adds wall time; it means nothing for an accelerator's asynchronous work


def seconds(action) -> float:
    start = clock()
    action()
    return clock() - start


def transformer_call(pipe, family, request) -> tuple[tuple, dict]:
    """The transformer's arguments at the first denoising step of `request` (captured by a hook)."""
    calls = []
    hook = pipe.transformer.register_forward_pre_hook(lambda _m, args, kwargs: calls.append((args, kwargs)),
                                                      with_kwargs=True)
    try:
        run_pipeline(pipe, family, dataclasses.replace(request, steps=1))
    finally:
        hook.remove()
    return calls[0]


def measure(model: Path, args) -> dict:
    a, b = lora_files(model, args.rank)
    handle = PipelineHandle.of(source=str(model), model_class=inspect_source(str(model)), device=args.device)
    family = family_for(handle.model_class)
    width, height = parse_size(args.size)
    request = SampleRequest(prompt=PROMPT, width=width, height=height, steps=args.steps, guidance=0.0, seed=0)
    engine = Engine()
    fused_handle = handle.replace(loras=(LoraSpec(a, 1.0),))
    engine.generate(handle, request)  # loads, and warms the kernels
    entry, device, _ = engine.realise(handle)
    pipe = entry.pipe
    with outside_inference_mode():
        call_args, call_kwargs = transformer_call(pipe, family, request)

    def way_on(way):
        if way == "fused":
            apply_loras(pipe, (LoraSpec(a, 1.0),), entry.states["lora"])
        elif way == "unfused":  # diffusers' own adapter on the base weights: peft layers run in every step
            apply_loras(pipe, (), entry.states["lora"])
            pipe.load_lora_weights(a, adapter_name="unfused")
            pipe.set_adapters(["unfused"], [1.0])
        else:
            apply_loras(pipe, (), entry.states["lora"])

    def way_off(way):
        if way == "unfused":
            pipe.unload_lora_weights()

    forward = {"none": [], "fused": [], "unfused": []}
    gaps = {way: [] for way in forward}
    for _ in range(args.runs):
        for way in forward:
            with outside_inference_mode():
                way_on(way)
                forward[way].append(min(timeit.repeat(lambda: pipe.transformer(*call_args, **call_kwargs),
                                                      number=1, repeat=args.repeat, timer=clock)))
            step_clock = StepClock()  # wall clock
            engine.generate(fused_handle if way == "fused" else handle, request, on_progress=step_clock)
            gaps[way] += [y - x for x, y in zip(step_clock.stamps, step_clock.stamps[1:])]
            with outside_inference_mode():
                way_off(way)

    one_step = dataclasses.replace(request, steps=1)
    switch = {}
    with outside_inference_mode():
        apply_loras(pipe, (LoraSpec(a, 1.0),), entry.states["lora"])
        switch["A -> B"] = seconds(lambda: apply_loras(pipe, (LoraSpec(b, 1.0),), entry.states["lora"]))
        switch["B -> B at 0.5"] = seconds(lambda: apply_loras(pipe, (LoraSpec(b, 0.5),), entry.states["lora"]))
        switch["B -> none"] = seconds(lambda: apply_loras(pipe, (), entry.states["lora"]))
        switch["none -> A"] = seconds(lambda: apply_loras(pipe, (LoraSpec(a, 1.0),), entry.states["lora"]))
        layers = len({key.rsplit(".", 1)[0] for key in entry.states["lora"].changed})  # layers, not parameters
    b_handle = handle.replace(loras=(LoraSpec(b, 1.0),))
    image_after_switch = seconds(lambda: engine.generate(b_handle, one_step))
    engine.unload()
    with outside_inference_mode():
        reload = seconds(lambda: load_pipeline(handle, device))
    image_after_reload = seconds(lambda: Engine().generate(b_handle, one_step))
    return dict(forward=forward, gaps=gaps, switch=switch, reload=reload, layers=layers,
                image_after_switch=image_after_switch, image_after_reload=image_after_reload)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, action="append", help="a diffusers folder (repeatable)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--size", default="512x512")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=10, help="transformer calls per round and way")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="wall, or this process's CPU time (cpu device on a shared machine)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's CPU threads (0: torch's default); 1 with --clock process is the steadiest on "
                             "a shared CPU (no threads spinning while they wait)")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    models = args.model or [bench_model(None, "tiny"), bench_model(None, "bench")]
    results = [(model.name, measure(bench_model(model), args)) for model in models]

    print(f"\n{args.clock} clock, {args.threads or 'default'} threads; device {args.device}, {args.size}, "
          f"LoRA rank {args.rank} on the attention linears, {args.runs} rounds alternating none/fused/unfused")
    print(f"transformer forward alone, fastest of {args.repeat} per round (ms), and pipeline step gaps over "
          f"{args.steps}-step runs (median ms)")
    print(f"{'model':<22}{'none':>9}{'fused':>9}{'unfused':>9}{'fused/none':>11}{'unfused/none':>13}"
          f"{'step none':>11}{'fused':>9}{'unfused':>9}")
    for name, r in results:
        fast = {way: min(f) for way, f in r["forward"].items()}
        median = {way: statistics.median(g) for way, g in r["gaps"].items()}
        print(f"{name:<22}{fast['none'] * 1000:>9.2f}{fast['fused'] * 1000:>9.2f}{fast['unfused'] * 1000:>9.2f}"
              f"{fast['fused'] / fast['none']:>11.3f}{fast['unfused'] / fast['none']:>13.3f}"
              f"{median['none'] * 1000:>11.1f}{median['fused'] * 1000:>9.1f}{median['unfused'] * 1000:>9.1f}")
    print("\nseconds: apply_loras on the loaded pipeline; load_pipeline again; a 1-step image after switching "
          "A -> B vs in a new engine (load + B + image)")
    print(f"{'model':<22}{'layers':>7}" + "".join(f"{k:>15}" for k in results[0][1]["switch"]) +
          f"{'reload':>9}{'image: switch':>15}{'reload':>9}{'ratio':>8}")
    for name, r in results:
        print(f"{name:<22}{r['layers']:>7}" + "".join(f"{v:>15.3f}" for v in r["switch"].values()) +
              f"{r['reload']:>9.3f}{r['image_after_switch']:>15.3f}{r['image_after_reload']:>9.3f}"
              f"{r['image_after_switch'] / r['image_after_reload']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
