#!/usr/bin/env python3
"""Context parallelism: per-step time of a video on 1 rank vs N context-parallel ranks, side by side in one run.

    .venv/bin/python benchmarks/bench_cp.py [--model DIR | --model-size tiny|bench] [--device auto|tpu|cuda|cpu]
        [--ranks 2] [--size 256x256] [--frames 17] [--steps 4]

The model is Wan 2.2 T2V A14B-shaped (tools/tiny_models.py wan22-t2v-a14b: "bench" has the real widths with one
block per expert, "tiny" is the test suite's). 1 rank is this process (no workers); N ranks is one replica of N
context-parallel ranks (a worker group launched with torchrun, one process per chip), each running 1/N of the
video's latent tokens through both experts. N ranks run first and their workers are stopped before this process
uses the device: on a TPU a chip belongs to the first process that uses it until that process exits. Step times
are medians of the gaps between step callbacks of a warm run (the second of two).
On a CPU host the ranks share the same cores (torchrun gives each one thread), so the CPU numbers show the
mechanism and its overheads (all-to-all of every attention's q, k, v and output), not the speed-up of chips.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import PROMPT, StepClock, built_model, parse_size

from tpu_diffusers_runtime.distributed.mesh import latent_tokens
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.specs import MeshSpec
from tpu_diffusers_runtime.tasks import SampleRequest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a Wan 2.2 diffusers folder (default: a built one)")
    parser.add_argument("--model-size", default="bench", choices=("tiny", "bench"))
    parser.add_argument("--device", default="cpu", help="auto, tpu, cuda or cpu")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", default="256x256")
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    model = args.model.resolve() if args.model else built_model("wan22-t2v-a14b", args.model_size)
    width, height = parse_size(args.size)
    base = PipelineHandle.of(source=str(model), model_class=inspect_source(str(model)), device=args.device)
    engine = Engine()
    rows = []
    for ranks, handle in ((args.ranks, base.replace(mesh=MeshSpec(chips=args.ranks, context_parallel=args.ranks))),
                          (1, base)):
        for seed in (0, 1):  # the first run loads (and launches the workers); the second is timed
            clock = StepClock()
            result = engine.generate(handle, SampleRequest(prompt=PROMPT, width=width, height=height,
                                                           frames=args.frames, steps=args.steps, guidance=1.0,
                                                           seed=seed), clock)
        rows.append((ranks, clock.step_seconds(), result.info.device))
        print(f"{ranks} rank(s): {rows[-1][1]:.3f}s/step", flush=True)
        engine.unload()

    family = family_for(base.model_class)
    tokens = latent_tokens(family, width, height, args.frames)
    one = rows[1]
    print(f"\nmodel {model.name}, device {one[2]}, {args.size} x {args.frames} frames ({tokens} latent tokens), "
          f"{args.steps} steps")
    print(f"{'ranks':<7}{'tokens/rank':>13}{'s/step':>9}{'vs 1 rank':>11}")
    for ranks, step, _ in reversed(rows):
        print(f"{ranks:<7}{tokens // ranks:>13}{step:>9.3f}{step / one[1]:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
