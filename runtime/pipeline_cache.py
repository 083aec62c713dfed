"""Loaded pipelines kept for reuse, keyed by the handle's load key, and what has been done to each.

The default capacity is one pipeline: accelerator memory is the scarce resource, and a second model is
better loaded after the first is gone than beside it.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import threading

from .device import DeviceInfo, empty_cache
from .features import offload
from .features.compilation import CompileState
from .features.lora import LoraState
from .handle import PipelineHandle
from .loading import load_pipeline
from .specs import ProgressCallback

log = logging.getLogger("tpu_diffusers")


@dataclasses.dataclass
class LoadedPipeline:
    """A loaded, placed pipeline and what has been done to it since (compiling, warm-up)."""

    pipe: object
    compiled: CompileState | None = None  # while the denoiser is compiled
    lora: LoraState = dataclasses.field(default_factory=LoraState)  # the LoRAs fused into its weights now
    notes: tuple[str, ...] = ()  # what loading found, for every run's info


@dataclasses.dataclass
class CacheStats:
    loads: int = 0  # pipelines loaded from disk since start
    hits: int = 0  # realisations served from memory


class PipelineCache:
    """Loaded pipelines keyed by `PipelineHandle.load_key`, least recently used evicted first."""

    def __init__(self, capacity: int = 1, loader=load_pipeline):
        self.capacity = capacity
        self.loader = loader  # (handle, device, on_progress, notes=[]) -> pipeline; appends to notes
        self.stats = CacheStats()
        self._pipelines: collections.OrderedDict[tuple, LoadedPipeline] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, handle: PipelineHandle, device: DeviceInfo,
            on_progress: ProgressCallback | None = None) -> tuple[LoadedPipeline, bool]:
        """The loaded pipeline for `handle`, and whether it was loaded just now."""
        key = handle.load_key(device)
        with self._lock:
            if key in self._pipelines:
                self._pipelines.move_to_end(key)
                self.stats.hits += 1
                return self._pipelines[key], False
            while len(self._pipelines) >= self.capacity:
                self._evict_oldest(device)
            log.info("TPU Diffusers: loading %s on %s", handle.describe(), device.type)
            notes: list[str] = []
            entry = LoadedPipeline(self.loader(handle, device, on_progress, notes=notes), notes=tuple(notes))
            self._pipelines[key] = entry
            self.stats.loads += 1
            return entry, True

    def _evict_oldest(self, device: DeviceInfo) -> None:
        _, entry = self._pipelines.popitem(last=False)
        offload.remove(entry.pipe)
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
