"""Shared by the benchmarks: the default model, and step times read from progress callbacks."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
import runtime_package  # noqa: E402

runtime_package.load()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "a golden retriever surfing a wave, photorealistic"


def built_model(family: str, size: str) -> Path:
    """A tools/tiny_models.py pipeline under .comfyui/<size>-models/, built once and kept (random weights,
    byte-identical for given library versions). Built beside its final name, so an interrupted build is
    never taken for a finished one."""
    import tiny_models

    model = ROOT / ".comfyui" / f"{size}-models" / f"{size}-{family}"
    if not (model / "model_index.json").exists():
        print(f"building the {size} {family} model into {model}", flush=True)
        partial = model.with_name(model.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        tiny_models.build(family, partial, size=size)
        shutil.rmtree(model, ignore_errors=True)  # what an interrupted build of an older version left
        partial.rename(model)
    return model


def built_wide_flux1() -> Path:
    """tools/tiny_single_files.flux1_wide (FLUX.1-dev at the real width, one double and one single block,
    bf16) under .comfyui/bench-models/, built once: the BFL-layout converters of diffusers and ComfyUI
    hard-code FLUX's width. Built beside its final name, like built_model."""
    import tiny_single_files

    folder = ROOT / ".comfyui" / "bench-models" / "wide-flux1-dev"
    if not (folder / "model_index.json").exists():
        print(f"building the wide FLUX.1-dev folder into {folder}", flush=True)
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        tiny_single_files.flux1_wide(partial)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def compile_cache_env(folder: Path, process: str) -> dict:
    """The environment of a child process whose compile caches live in `folder` (the pack's
    TPU_DIFFUSERS_COMPILE_CACHE, which the child applies before torch starts, as ComfyUI's prestartup
    does). Cache variables already set here are dropped, so the measurement starts where we say; and
    TorchTPU's host-shared tier-2 cache (in /dev/shm, which outlives processes) gets a name of its own
    per folder and `process`, so the folder is the only cache a fresh process can reuse."""
    from tpu_diffusers_runtime import process_env

    managed = (process_env.INDUCTOR_CACHE, process_env.TPU_TIER2_CACHE, process_env.TPU_TIER3_CACHE,
               process_env.TPU_TIER3_LOCAL_BACKUP)
    env = {name: value for name, value in os.environ.items() if name not in managed}
    return {**env, process_env.COMPILE_CACHE_ENV: str(folder), process_env.TPU_TIER2_CACHE: f"{folder.name}-{process}"}


def bench_model(model: Path | None, size: str = "bench") -> Path:
    """The given diffusers folder, or a FLUX.1-schnell-shaped one built once: with real layer widths
    ("bench"), or the test suite's tiny one ("tiny")."""
    return model.resolve() if model is not None else built_model("flux1-schnell", size)


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
