#!/usr/bin/env python3
"""Tensor parallelism: per-step time and per-rank transformer weight memory, 1 rank vs N ranks.

    .venv/bin/python benchmarks/bench_tp.py [--model DIR] [--device auto|tpu|cuda|cpu]
        [--ranks 2] [--size 256x256] [--steps 4]

1 rank is this process (no workers); N ranks is a worker group launched with torchrun, one
process per chip. N ranks run first and their workers are stopped before this process uses the
device: on a TPU a chip belongs to the first process that uses it until that process exits.
Step times are medians of the gaps between step callbacks of a warm run.
On a CPU host the N ranks share the same cores (torchrun gives each one thread), so the CPU
numbers show the mechanism and the memory split, not a speed-up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import PROMPT, StepClock, bench_model, parse_size

from tpu_diffusers_runtime.distributed.sharding import local_bytes
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.tasks import SampleRequest
from tpu_diffusers_runtime.specs import MeshSpec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", default="256x256")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    model = bench_model(args.model)
    width, height = parse_size(args.size)
    base = PipelineHandle.of(source=str(model), model_class=inspect_source(str(model)), device=args.device)
    engine = Engine()
    rows = []
    sharded = base.replace(mesh=MeshSpec(chips=args.ranks))
    for ranks, spec in ((args.ranks, sharded), (1, base)):
        for seed in (0, 1):  # the first run loads (and launches the workers); the second is timed
            clock = StepClock()
            result = engine.generate(spec, SampleRequest(prompt=PROMPT, width=width, height=height,
                                                         steps=args.steps, guidance=0.0, seed=seed), clock)
        info = result.info
        per_rank = info.transformer_bytes_per_rank or (local_bytes(engine.realise(spec)[0].pipe.transformer),)
        rows.append((ranks, clock.step_seconds(), max(per_rank) / 2**20, info.device))
        print(f"{ranks} rank(s): {rows[-1][1]:.3f}s/step, {rows[-1][2]:.0f} MiB of transformer per rank", flush=True)
        engine.unload()

    one = rows[1]
    print(f"\nmodel {model.name}, device {one[3]}, {args.size}, {args.steps} steps")
    print(f"{'ranks':<7}{'s/step':>9}{'vs 1 rank':>11}{'transformer MiB/rank':>22}{'vs 1 rank':>11}")
    for ranks, step, mib, _ in reversed(rows):
        print(f"{ranks:<7}{step:>9.3f}{step / one[1]:>11.2f}{mib:>22.0f}{mib / one[2]:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
