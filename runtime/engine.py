"""The runtime's front door: realise a handle and generate images with it.

One process-wide `Engine` holds the loaded pipelines, so ComfyUI nodes stay stateless.
Everything here works without ComfyUI; the nodes only adapt inputs, progress and cancel.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from .device import peak_memory_bytes, reset_peak_memory, resolve_device
from .families import family_for
from .handle import PipelineHandle
from .loading import PipelineCache, ProgressCallback
from .modes import execution_mode
from .sampling import SampleRequest, run_pipeline, validate_request

log = logging.getLogger("tpu_diffusers")


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What actually happened in one run, for the node's info output and the log."""

    device: str
    mode: str  # the mode that ran, which may differ from the one asked for
    placement: str
    loaded: bool  # False when the pipeline came from the cache
    load_seconds: float
    sample_seconds: float
    peak_device_memory_mb: float | None = None  # None on cpu, where the process RSS is the measure
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        load = f"loaded in {self.load_seconds:.1f}s" if self.loaded else "reused loaded pipeline"
        lines = [f"device: {self.device}", f"mode: {self.mode}", f"placement: {self.placement}",
                 f"pipeline: {load}", f"sampling: {self.sample_seconds:.2f}s", *self.notes]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Generation:
    images: object  # torch.Tensor [B, H, W, C] float32 in 0..1
    info: RunInfo


class Engine:
    def __init__(self, cache: PipelineCache | None = None):
        self.cache = cache or PipelineCache()

    def realise(self, handle: PipelineHandle, on_progress: ProgressCallback | None = None):
        """The loaded, placed pipeline for a handle; (pipe, device, loaded_now)."""
        device = resolve_device(handle.device)
        pipe, loaded = self.cache.get(handle, device, on_progress)
        return pipe, device, loaded

    def generate(self, handle: PipelineHandle, request: SampleRequest,
                 on_progress: ProgressCallback | None = None) -> Generation:
        family = family_for(handle.pipeline_class)
        validate_request(family, request)  # fail before loading anything
        notes = []
        if request.negative_prompt.strip() and not family.takes_negative_prompt:
            notes.append(f"negative prompt ignored: {family.name} takes none")
        start = time.perf_counter()
        pipe, device, loaded = self.realise(handle, on_progress)
        load_seconds = time.perf_counter() - start

        def on_step(done: int, total: int) -> None:
            if on_progress:
                on_progress(done, total, "sampling")

        reset_peak_memory(device)
        start = time.perf_counter()
        with execution_mode(handle.mode, device) as mode_ran:
            images = run_pipeline(pipe, family, request, on_step)
        peak = peak_memory_bytes(device)
        info = RunInfo(device=device.type, mode=mode_ran, placement=handle.placement.value, loaded=loaded,
                       load_seconds=load_seconds, sample_seconds=time.perf_counter() - start,
                       peak_device_memory_mb=None if peak is None else peak / 2**20, notes=tuple(notes))
        log.info("TPU Diffusers: %s", info.summary().replace("\n", "; "))
        return Generation(images=images, info=info)

    def unload(self) -> int:
        """Drop all loaded pipelines (ComfyUI's "Unload Models"); returns how many were dropped."""
        return self.cache.clear(resolve_device("auto"))


ENGINE = Engine()
