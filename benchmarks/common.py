"""Shared by the benchmarks: the default model, and step times read from progress callbacks."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "a golden retriever surfing a wave, photorealistic"


def bench_model(model: Path | None, size: str = "bench") -> Path:
    """The given diffusers folder, or a FLUX.1-schnell-shaped one built once: with real layer widths
    ("bench"), or the test suite's tiny one ("tiny")."""
    if model is not None:
        return model.resolve()
    import tiny_models

    model = ROOT / ".comfyui" / "bench-models" / f"{size}-flux1-schnell"
    if not (model / "model_index.json").exists():
        print(f"building the {size} model into {model}", flush=True)
        tiny_models.build("flux1-schnell", model, size=size)
    return model


class StepClock:
    """A runtime progress callback that timestamps denoising steps; median seconds per step."""

    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, done: int, total: int, what: str, *preview) -> None:
        if what == "sampling":
            self.stamps.append(time.perf_counter())

    def step_seconds(self) -> float:
        deltas = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
        return statistics.median(deltas)


def parse_size(text: str) -> tuple[int, int]:
    width, height = text.lower().split("x")
    return int(width), int(height)
