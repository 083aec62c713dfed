#!/usr/bin/env python3
"""Data parallelism: images per second for a batch on 1 rank vs R replicas vs R/T replicas x T TP
vs 1 x R TP, side by side in one run.

    .venv/bin/python benchmarks/bench_dp.py [--model DIR] [--device auto|tpu|cuda|cpu]
        [--ranks 2] [--tp 2] [--batch 2,4] [--size 256x256] [--steps 4]

1 rank is this process (no workers); the others are one worker group each, launched with
torchrun, one process per chip. For every shape and batch a first run loads (and launches,
and compiles) and a second one is timed, from the request to the images back in this process.
On a CPU host the ranks share the same cores (torchrun gives each one thread), so the CPU
numbers show the mechanism and its overheads, not the speed-up of separate chips.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import PROMPT, bench_model, parse_size

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.tasks import SampleRequest
from tpu_diffusers_runtime.specs import MeshSpec


def shapes(ranks: int, tp: int) -> list[tuple[str, MeshSpec | None]]:
    """(label, mesh) of each configuration compared; None = this process alone."""
    found = [("1 rank", None), (f"{ranks} x 1", MeshSpec(chips=ranks, replicas=ranks))]
    if 1 < tp < ranks and ranks % tp == 0:
        found.append((f"{ranks // tp} x {tp}", MeshSpec(chips=ranks, replicas=ranks // tp)))
    found.append((f"1 x {ranks}", MeshSpec(chips=ranks, replicas=1)))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2, help="TP degree of the mixed shape (ranks / tp replicas)")
    parser.add_argument("--batch", default="2,4", help="batch sizes, comma-separated")
    parser.add_argument("--size", default="256x256")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    model = bench_model(args.model)
    width, height = parse_size(args.size)
    batches = [int(b) for b in args.batch.split(",")]
    base = PipelineHandle.of(source=str(model), model_class=inspect_source(str(model)), device=args.device)
    engine = Engine()
    rows = {}  # (label, batch) -> images per second
    device = "?"
    for label, mesh in shapes(args.ranks, args.tp):
        handle = base.replace(mesh=mesh)
        for batch in batches:
            request = SampleRequest(prompt=PROMPT, width=width, height=height, steps=args.steps, guidance=0.0,
                                    batch_size=batch)
            engine.generate(handle, request)  # loads, launches, compiles this batch's shape
            start = time.perf_counter()
            result = engine.generate(handle, request)
            rows[label, batch] = batch / (time.perf_counter() - start)
            device = result.info.device
            print(f"{label}, batch {batch}: {rows[label, batch]:.3f} images/s", flush=True)
        engine.unload()

    labels = [label for label, _ in shapes(args.ranks, args.tp)]
    print(f"\nimages per second: model {model.name}, device {device}, {args.size}, {args.steps} steps "
          f"(replicas x tp)")
    print(f"{'batch':<7}" + "".join(f"{label:>12}" for label in labels))
    for batch in batches:
        print(f"{batch:<7}" + "".join(f"{rows[label, batch]:>12.3f}" for label in labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
