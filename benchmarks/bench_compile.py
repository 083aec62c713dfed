#!/usr/bin/env python3
"""Compiled vs eager, per image size: step times, cold compile, and warm-cache compile in a fresh process.

    .venv/bin/python benchmarks/bench_compile.py [--model DIR] [--device auto|tpu|cuda|cpu]
        [--sizes 256x256,256x512] [--steps 4]

Step times are medians of the gaps between step callbacks (the first compiled call of a size,
which compiles, is excluded). Compile times are dynamo's own (`compile_seconds` in the run
info). Each phase runs in its own process, one after another, all with one new compile-cache
folder: eager, then compiled (cold: it fills the folder), then compiled again in a fresh
process (warm, as after a ComfyUI restart). This process never touches the device: on a TPU a
chip belongs to the first process that uses it until that process exits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PROMPT, StepClock, bench_model, compile_cache_env, parse_size

PHASES = ("eager", "cold", "warm")


def measure(args) -> dict:
    """One phase over every size, in this (child) process: {size: {"step_seconds", "compile_seconds"}}."""
    from tpu_diffusers_runtime import process_env

    process_env.apply(process_env.default_root())  # the cache folder, before torch starts (as ComfyUI does)
    from tpu_diffusers_runtime.engine import Engine
    from tpu_diffusers_runtime.handle import PipelineHandle
    from tpu_diffusers_runtime.loading import inspect_source
    from tpu_diffusers_runtime.tasks import SampleRequest
    from tpu_diffusers_runtime.specs import ExecutionMode

    mode = ExecutionMode.EAGER if args.phase == "eager" else ExecutionMode.COMPILED
    handle = PipelineHandle.of(source=str(args.model), model_class=inspect_source(str(args.model)),
                            device=args.device, mode=mode)
    engine, results = Engine(), {}
    for text in args.sizes.split(","):
        width, height = parse_size(text)
        runs = []
        for seed in (0, 1):  # the first loads, warms eager kernels or compiles; the second is timed
            clock = StepClock()
            info = engine.generate(handle, SampleRequest(prompt=PROMPT, width=width, height=height,
                                                         steps=args.steps, guidance=0.0, seed=seed), clock).info
            runs.append((clock.step_seconds(), info))
        results[text] = {"step_seconds": runs[1][0], "compile_seconds": runs[0][1].compile_seconds,
                         "device": runs[0][1].device}
    return results


def run_phase(args, phase: str, cache_dir: Path) -> dict:
    """A phase in a fresh process; each gets its own TorchTPU host cache, so only the folder carries over."""
    command = [sys.executable, __file__, "--model", str(args.model), "--device", args.device, "--sizes", args.sizes,
               "--steps", str(args.steps), "--phase", phase]
    done = subprocess.run(command, env=compile_cache_env(cache_dir, phase), capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"the {phase} phase failed (exit code {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--sizes", default="256x256,256x512")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.model = bench_model(args.model)

    if args.phase:
        print(json.dumps(measure(args)))
        return 0

    cache_dir = Path(tempfile.mkdtemp(prefix="bench-compile-cache-"))
    phases = {}
    for phase in PHASES:
        phases[phase] = run_phase(args, phase, cache_dir)
        print(f"{phase}: " + ", ".join(f"{size} {r['step_seconds']:.3f}s/step, compile {r['compile_seconds']:.1f}s"
                                       for size, r in phases[phase].items()), flush=True)

    device = next(iter(phases["eager"].values()))["device"]
    print(f"\nmodel {args.model.name}, device {device}, {args.steps} steps; cache {cache_dir}")
    print(f"{'size':<10}{'eager s/step':>13}{'compiled s/step':>16}{'compiled/eager':>15}"
          f"{'cold compile s':>15}{'warm compile s':>15}{'warm/cold':>10}")
    for size in args.sizes.split(","):
        eager, cold, warm = (phases[phase][size] for phase in PHASES)
        print(f"{size:<10}{eager['step_seconds']:>13.3f}{cold['step_seconds']:>16.3f}"
              f"{cold['step_seconds'] / eager['step_seconds']:>15.2f}{cold['compile_seconds']:>15.1f}"
              f"{warm['compile_seconds']:>15.1f}{warm['compile_seconds'] / cold['compile_seconds']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
