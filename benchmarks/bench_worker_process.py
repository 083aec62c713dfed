#!/usr/bin/env python3
"""A single-chip run in a worker process (what TPU_DIFFUSERS_WORKER_PROCESS=tpu does on a TPU) vs the same run
in this process: seconds per image, side by side in one run, and their ratio.

    .venv/bin/python benchmarks/bench_worker_process.py [--model DIR] [--size tiny|bench] [--device auto]
        [--sizes 512x512,1024x1024] [--batch 1,4] [--steps 4] [--repeats 3]

Both sides are warm (loaded, the worker launched) before anything is timed; each cell alternates the two
`--repeats` times and keeps the median, from the request to the images back in this process. The worker's
images travel back as raw float32 bytes, so the difference is the channel's cost per image (plus the
scheduling noise of a shared host). The tiny model makes that cost as large a share as it can be.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import PROMPT, bench_model, parse_size

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.worker_client import SINGLE_CHIP
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.tasks import SampleRequest


def seconds_per_image(engine: Engine, handle: PipelineHandle, request: SampleRequest) -> float:
    start = time.perf_counter()
    engine.generate(handle, request)
    return (time.perf_counter() - start) / request.batch_size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--size", default="tiny", help="the built model when --model is not given: tiny or bench")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--sizes", default="512x512,1024x1024")
    parser.add_argument("--batch", default="1,4")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    model = bench_model(args.model, args.size)
    here = PipelineHandle.of(source=str(model), model_class=inspect_source(str(model)), device=args.device)
    in_worker = here.replace(mesh=SINGLE_CHIP)
    engine = Engine()
    rows = []
    try:
        for size in args.sizes.split(","):
            width, height = parse_size(size)
            for batch in (int(b) for b in args.batch.split(",")):
                request = SampleRequest(prompt=PROMPT, width=width, height=height, steps=args.steps, guidance=0.0,
                                        batch_size=batch)
                for handle in (here, in_worker):
                    engine.generate(handle, request)  # warm: loaded, launched, this shape run once
                times = {"here": [], "worker": []}
                for _ in range(args.repeats):
                    times["here"].append(seconds_per_image(engine, here, request))
                    times["worker"].append(seconds_per_image(engine, in_worker, request))
                here_s, worker_s = (statistics.median(times[side]) for side in ("here", "worker"))
                rows.append((size, batch, here_s, worker_s))
                print(f"{size} batch {batch}: {here_s:.3f} s/image here, {worker_s:.3f} in a worker "
                      f"(x{worker_s / here_s:.3f})", flush=True)
    finally:
        engine.unload()
    print(f"\nseconds per image, model {model.name}, {args.steps} steps, median of {args.repeats}")
    print("| size | batch | in ComfyUI's process | in a worker process | worker / in-process |")
    print("|---|---|---|---|---|")
    for size, batch, here_s, worker_s in rows:
        print(f"| {size} | {batch} | {here_s:.3f} | {worker_s:.3f} | {worker_s / here_s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
