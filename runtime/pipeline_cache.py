"""Loaded pipelines kept for reuse, keyed by the handle's load key, and what has been done to each.

The default capacity is one pipeline: accelerator memory is the scarce resource, and a second model is
better loaded after the first is gone than beside it. When the application around the runtime needs that
memory (ComfyUI's own models, on CUDA), `move_to_host` parks idle pipelines in host memory and the next
`get` moves them back; `make_room` is how the cache asks the application for memory in turn. See
docs/memory.md.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import logging
import threading
from typing import Callable

from . import pipeline_kinds
from .device import DeviceInfo, empty_cache
from .features import offload
from .handle import PipelineHandle
from .loading import load_pipeline
from .pipeline_kinds import init_options
from .specs import Placement, ProgressCallback

log = logging.getLogger("tpu_diffusers")


@dataclasses.dataclass
class LoadedPipeline:
    """A loaded pipeline and what has been done to it since: each feature's state (runtime/features) by name,
    present while that feature is applied (placement, the LoRAs fused in, the compiled denoisers, ...)."""

    pipe: object
    device: DeviceInfo
    placement: Placement
    states: dict[str, object] = dataclasses.field(default_factory=dict)
    load_notes: tuple[str, ...] = ()  # what loading found
    on_host: str = ""  # why it was moved to host memory, while it waits there to be moved back
    placed_note: str = ""  # set by each get(): how this realisation placed it, when it did anything
    task_pipes: dict = dataclasses.field(default_factory=dict)  # diffusers class -> pipeline from_pipe made of `pipe`
    hooked: object = None  # under model CPU offload, the pipeline whose offload hooks the shared models carry now
    upscaler: tuple = ()  # (path, its upsample pipeline): the last latent upscaler a run used, kept with the models
    decoder: tuple = ()  # (its decode pipeline or None,): the family's latent decoder, once looked for

    def pipeline(self, cls: str, task: str, upsample_prompt: bool = True):
        """The pipeline of diffusers class `cls` on this entry's models: `pipe` itself, or one that `from_pipe`
        made of its components once (nothing loads; the same modules, so a compiled denoiser stays compiled and
        fused LoRAs stay fused). Under model CPU offload the hooks move to the pipeline that runs: diffusers
        re-arms them at the end of each call through the pipeline that installed them. A modular pipeline runs
        `task` as one workflow of its blocks (pipeline_kinds.ModularKind.task_pipeline), with or without the prompt
        upsampler its blocks may have."""
        import diffusers

        if pipeline_kinds.is_modular(self.pipe):  # pipeline kind
            kind = pipeline_kinds.modular_kind_of(self.pipe)
            return kind.task_pipeline(self.pipe, task, self.task_pipes, upsample_prompt)
        if cls == type(self.pipe).__name__:
            pipe = self.pipe
        elif cls in self.task_pipes:
            pipe = self.task_pipes[cls]
        else:
            task_cls = getattr(diffusers, cls)
            pipe = self.task_pipes[cls] = task_cls.from_pipe(self.pipe, **init_options(task_cls))
        if self.placement is Placement.MODEL_CPU_OFFLOAD and (self.hooked or self.pipe) is not pipe:
            offload.place(pipe, self.placement, self.device)
            self.hooked = pipe
        return pipe

    def upsample_pipeline(self, two_stage, path: str):
        """The pipeline that upscales latents with the upscaler at `path` (a family's TwoStage) on this entry's VAE:
        loaded once, on this entry's device in its VAE's dtype, and kept until another upscaler is asked for."""
        import diffusers

        from . import upscalers

        if not self.upscaler or self.upscaler[0] != path:
            self.upscaler = ()  # the previous one goes before the next loads
            model = upscalers.load(path, two_stage, self.pipe.vae.dtype, self.device.torch_device())
            upsample = getattr(diffusers, two_stage.upsample_pipeline)(vae=self.pipe.vae, latent_upsampler=model)
            self.upscaler = (path, upsample)
        return self.upscaler[1]

    def decode_pipeline(self, latent_decoder, load):
        """The pipeline that decodes this entry's latents with the family's latent decoder (Family.latent_decoder),
        where the model has one (`load(dtype)` loads it, or gives None: the VAE decodes): loaded once, on this entry's
        device in its VAE's dtype, kept with the models while they are on the device."""
        import diffusers

        if not self.decoder:
            model = load(self.pipe.vae.dtype) if latent_decoder else None
            decode = None
            if model is not None:
                model.to(self.device.torch_device())
                decode = getattr(diffusers, latent_decoder.decode_pipeline)(
                    **{latent_decoder.component: model}, scheduler=self.pipe.scheduler)
            self.decoder = (decode,)
        return self.decoder[0]

    @property
    def notes(self) -> tuple[str, ...]:
        """For this run's info: what loading found, and a move back from host memory."""
        return self.load_notes + ((self.placed_note,) if self.placed_note else ())


@dataclasses.dataclass
class CacheStats:
    loads: int = 0  # pipelines loaded from disk since start
    hits: int = 0  # realisations served from memory


class PipelineCache:
    """Loaded pipelines keyed by `PipelineHandle.load_key`, least recently used evicted first."""

    def __init__(self, capacity: int = 1, loader=load_pipeline, context_parallel=lambda handle: None):
        self.capacity = capacity
        self.loader = loader  # (handle, device, on_progress, notes=[]) -> pipeline; appends to notes
        # context_parallel(handle): the CP mesh this process splits the handle's denoisers over (a worker rank's
        # replica), or None; features.realise asks it for the context parallelism feature
        self.context_parallel = context_parallel
        # make_room(bytes): asks the application to free that much device memory its own models hold, or all
        # of it for None; set by the ComfyUI nodes on CUDA, None where nothing else manages device memory.
        self.make_room: Callable[[int | None], None] | None = None
        self.stats = CacheStats()
        self._pipelines: collections.OrderedDict[tuple, LoadedPipeline] = collections.OrderedDict()
        self._lock = threading.Lock()  # held while the pipelines change (a load, a move, an eviction)
        self._runs = 0  # runs in progress: their pipelines stay where they are

    def get(self, handle: PipelineHandle, device: DeviceInfo,
            on_progress: ProgressCallback | None = None) -> tuple[LoadedPipeline, bool]:
        """The loaded pipeline for `handle`, and whether it was loaded just now."""
        key = handle.load_key(device)
        with self._lock:
            if key in self._pipelines:
                self._pipelines.move_to_end(key)
                self.stats.hits += 1
                entry = self._pipelines[key]
                entry.placed_note = self._move_back(entry) if entry.on_host else ""
                return entry, False
            while len(self._pipelines) >= self.capacity:
                self._evict_oldest(device)
            log.info("TPU Diffusers: loading %s on %s", handle.describe(), device.type)
            notes: list[str] = []
            entry = LoadedPipeline(self.loader(handle, device, on_progress, notes=notes), device=device,
                                   placement=handle.placement, load_notes=tuple(notes))
            self._pipelines[key] = entry
            self.stats.loads += 1
            return entry, True

    def _move_back(self, entry: LoadedPipeline) -> str:
        """Place a pipeline that waited in host memory on its device again (a host-to-device copy, no load
        from disk; a compiled denoiser keeps its graphs: the same parameters come back to the same device).
        The application is asked for the room first. Returns the note for the run's info."""
        if self.make_room is not None:
            self.make_room(offload.weight_bytes(entry.pipe))
        offload.place(entry.pipe, entry.placement, entry.device)
        note = f"moved back to {entry.device.type} from host memory ({entry.on_host})"
        entry.on_host = ""
        log.info("TPU Diffusers: pipeline %s", note)
        return note

    def move_to_host(self, device_type: str, why: str) -> int:
        """Move the idle pipelines on `device_type` to host memory, so that the application can use the device
        memory they held; the next get() moves each back. Returns how many moved. Nothing moves while a run
        or a load is in progress, on any thread: their pipelines are in use (the caller gets what the others
        free), and a call from inside a run (the same thread) must not wait for that run."""
        if not self._lock.acquire(blocking=False):
            log.info("TPU Diffusers: a pipeline is loading or moving; it keeps its device memory (%s)", why)
            return 0
        try:
            placed = [key for key, entry in self._pipelines.items()
                      if entry.device.type == device_type and not entry.on_host]
            if not placed:
                return 0
            if self._runs:
                log.info("TPU Diffusers: a run is in progress; its pipeline keeps its device memory (%s)", why)
                return 0
            device = self._pipelines[placed[0]].device
            moved, failed = 0, []
            for key in placed:
                try:
                    moved += self._park(self._pipelines[key], why)
                except Exception:  # e.g. host memory ran out half way: split between host and device, it cannot run
                    log.exception("TPU Diffusers: moving a pipeline to host memory failed; dropping it instead")
                    failed.append(key)
            for key in failed:
                self._drop(key, device)
            empty_cache(device)
            if moved:
                log.info("TPU Diffusers: moved %d pipeline(s) to host memory (%s)", moved, why)
            return moved
        finally:
            self._lock.release()

    @staticmethod
    def _park(entry: LoadedPipeline, why: str) -> int:
        """1 when the pipeline's weights moved to host memory and must move back before it runs again."""
        if not offload.to_host(entry.hooked or entry.pipe, entry.placement):
            return 0
        entry.upscaler = ()  # its device memory freed too: loaded again from its file when a run asks for it
        entry.decoder = ()  # as the upscaler
        entry.on_host = why
        return 1

    @contextlib.contextmanager
    def running(self):
        """Marks a run in progress: move_to_host leaves the pipelines alone until it ends."""
        with self._lock:
            self._runs += 1
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1

    def free_after_out_of_memory(self, device: DeviceInfo) -> int:
        """The device ran out of memory: drop every pipeline (a failed run may have left one half placed) and
        ask the application to free what its own models hold, as ComfyUI does after its own out-of-memory
        errors; returns how many pipelines were dropped."""
        dropped = self.clear(device)
        if self.make_room is not None:
            self.make_room(None)
        return dropped

    def _evict_oldest(self, device: DeviceInfo) -> None:
        self._drop(next(iter(self._pipelines)), device)

    def _drop(self, key: tuple, device: DeviceInfo) -> None:
        entry = self._pipelines.pop(key)
        offload.remove(entry, entry.states.get(offload.NAME))
        del entry
        gc.collect()
        empty_cache(device)

    def clear(self, device: DeviceInfo) -> int:
        """Drop every loaded pipeline and give the device memory back; returns how many were dropped."""
        with self._lock:
            count = len(self._pipelines)
            while self._pipelines:
                self._evict_oldest(device)
            return count

    def __len__(self) -> int:
        return len(self._pipelines)
