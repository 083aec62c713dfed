#!/usr/bin/env python3
"""Compiled vs eager, per image size: step times, cold compile, and warm-cache compile in a fresh process.

    .venv/bin/python benchmarks/bench_compile.py [--model DIR] [--device auto|tpu|cuda|cpu]
        [--sizes 256x256,256x512] [--steps 4]

Step times are medians of the gaps between step callbacks (the first compiled call of a size,
which compiles, is excluded). Compile times are dynamo's own (`compile_seconds` in the run
info). The warm number comes from a new Python process pointed at the same cache directory,
as after a ComfyUI restart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PROMPT, StepClock, bench_model, parse_size

from runtime.compile_cache import CompileSpec
from runtime.engine import Engine
from runtime.handle import PipelineHandle
from runtime.loading import inspect_source
from runtime.modes import ExecutionMode
from runtime.sampling import SampleRequest


def handle(model: Path, device: str, cache_dir: str | None) -> PipelineHandle:
    compiled = cache_dir is not None
    return PipelineHandle(source=str(model), pipeline_class=inspect_source(str(model)), device=device,
                          mode=ExecutionMode.COMPILED if compiled else ExecutionMode.EAGER,
                          compile=CompileSpec(cache_dir=cache_dir) if compiled else None)


def request(size: tuple[int, int], steps: int, seed: int = 0) -> SampleRequest:
    return SampleRequest(prompt=PROMPT, width=size[0], height=size[1], steps=steps, guidance=0.0, seed=seed)


def timed_run(engine: Engine, spec: PipelineHandle, req: SampleRequest):
    clock = StepClock()
    info = engine.generate(spec, req, on_progress=clock).info
    return clock.step_seconds(), info


def warm_compile_seconds(args, size, cache_dir: str) -> float:
    """Compile time of `size` in a new process with the cache directory the first process filled."""
    out = subprocess.run([sys.executable, __file__, "--model", str(args.model), "--device", args.device,
                          "--steps", "2", "--warm-child", f"{size[0]}x{size[1]}", "--cache-dir", cache_dir],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["compile_seconds"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--sizes", default="256x256,256x512")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warm-child", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.model = bench_model(args.model)

    if args.warm_child:  # the fresh process of warm_compile_seconds
        _, info = timed_run(Engine(), handle(args.model, args.device, args.cache_dir),
                            request(parse_size(args.warm_child), args.steps))
        print(json.dumps({"compile_seconds": info.compile_seconds}))
        return 0

    cache_dir = tempfile.mkdtemp(prefix="bench-compile-cache-")
    eager_engine, compiled_engine = Engine(), Engine()
    eager, compiled = handle(args.model, args.device, None), handle(args.model, args.device, cache_dir)
    rows = []
    for text in args.sizes.split(","):
        size = parse_size(text)
        timed_run(eager_engine, eager, request(size, args.steps))  # loads, and warms eager kernels
        eager_step, _ = timed_run(eager_engine, eager, request(size, args.steps, seed=1))
        _, cold = timed_run(compiled_engine, compiled, request(size, args.steps))
        compiled_step, _ = timed_run(compiled_engine, compiled, request(size, args.steps, seed=1))
        warm = warm_compile_seconds(args, size, cache_dir)
        rows.append((text, eager_step, compiled_step, cold.compile_seconds, warm))
        print(f"{text}: eager {eager_step:.3f}s/step, compiled {compiled_step:.3f}s/step, "
              f"compile cold {cold.compile_seconds:.1f}s, warm {warm:.1f}s", flush=True)

    print(f"\nmodel {args.model.name}, device {cold.device}, {args.steps} steps; cache {cache_dir}")
    print(f"{'size':<10}{'eager s/step':>13}{'compiled s/step':>16}{'compiled/eager':>15}"
          f"{'cold compile s':>15}{'warm compile s':>15}{'warm/cold':>10}")
    for text, eager_step, compiled_step, cold_s, warm_s in rows:
        print(f"{text:<10}{eager_step:>13.3f}{compiled_step:>16.3f}{compiled_step / eager_step:>15.2f}"
              f"{cold_s:>15.1f}{warm_s:>15.1f}{warm_s / cold_s:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
