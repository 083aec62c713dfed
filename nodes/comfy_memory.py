"""How ComfyUI's memory management reaches our pipelines (docs/memory.md).

- The user's "Unload Models" releases them and stops the worker groups. `POST /free {"unload_models":
  true}` only sets a flag on the prompt queue; ComfyUI's prompt worker reads the flags with `get_flags()`
  between prompts, never during one, and then unloads its own models. We release ours at that same read.
- On CUDA, the one device ComfyUI and the pack share, ComfyUI's `free_memory` also covers our pipelines:
  when ComfyUI needs VRAM they hold, they move to host memory, as ComfyUI's own models do, and our next run
  moves them back. `unload_all_models()` goes through `free_memory` too, so another pack calling it as a
  routine step costs our next run a host-to-device copy, not a load from disk. In turn, our cache asks
  ComfyUI for room (`make_room`) before moving a pipeline back, and after a device out-of-memory error.

ComfyUI 0.3.75 and newer read the flags the same way (main.py, `prompt_worker`), and make room through
`free_memory(memory_required, device, ...)`; newer versions add arguments (passed through) and pass
device None for every device.
"""

import logging

from tpu_diffusers_runtime.engine import ENGINE
from tpu_diffusers_runtime.pipeline_cache import PipelineCache

log = logging.getLogger("tpu_diffusers")

WHY = "ComfyUI needed the VRAM"


def install(queue, model_management, device_type: str) -> None:
    """Release our pipelines on the user's Unload Models read from `queue`; on CUDA (`device_type`, where our
    pipelines run), share the device with ComfyUI's `model_management`. On a TPU ComfyUI runs with --cpu and
    our runs live in worker processes; on CPU there is no device memory to share: nothing more to do."""
    read_flags = queue.get_flags

    def get_flags(reset=True):
        flags = read_flags(reset)
        # reset=True is the prompt worker consuming the request; the rule is main.py's.
        if reset and flags.get("unload_models", flags.get("free_memory", False)):
            release()
        return flags

    queue.get_flags = get_flags
    if device_type == "cuda":
        share_device(model_management, ENGINE.cache, device_type)


def release() -> None:
    try:
        dropped = ENGINE.unload()
    except Exception:
        # This runs on ComfyUI's prompt worker thread, which an exception would end for good.
        log.exception("TPU Diffusers: releasing the pipelines failed")
        return
    if dropped:
        log.info("TPU Diffusers: unloaded %d pipeline(s)", dropped)


def share_device(model_management, cache: PipelineCache, device_type: str) -> None:
    """Wrap ComfyUI's `free_memory`, the call through which it makes room on a device: `load_models_gpu`
    before loading any of its models, nodes for their working memory, `unload_all_models()` (its
    out-of-memory recovery, Unload Models, other packs) for everything. ComfyUI frees its own idle models
    first; when what is free is still short of what was asked, our idle pipelines on `device_type` move to
    host memory. And give `cache` a `make_room` that asks ComfyUI to free memory for us."""
    free_memory = model_management.free_memory

    def free_memory_and_ours(memory_required, device, *args, **kwargs):
        unloaded = free_memory(memory_required, device, *args, **kwargs)
        try:
            if still_short(model_management, memory_required, device, device_type):
                cache.move_to_host(device_type, WHY)
        except Exception:
            # Also called on the prompt worker thread outside any node (Unload Models), which an exception would end.
            log.exception("TPU Diffusers: giving ComfyUI the device memory failed")
        return unloaded

    def make_room(bytes_needed: int | None) -> None:
        if bytes_needed is None:
            model_management.unload_all_models()
        else:
            model_management.free_memory(bytes_needed + model_management.minimum_inference_memory(),
                                         model_management.get_torch_device())

    model_management.free_memory = free_memory_and_ours
    cache.make_room = make_room


def still_short(model_management, memory_required: float, device, device_type: str) -> bool:
    """Whether ComfyUI, after freeing its own models, still needs memory of the device our pipelines are on.
    With --disable-smart-memory ComfyUI offloads everything it can whenever it makes room, and so do we."""
    import torch

    if device is None:  # newer ComfyUI's unload_all_models: every device
        return True
    if device.type != device_type:
        return False
    if device.index is not None and device.index != torch.accelerator.current_device_index():
        return False  # another GPU: ours are on the current one
    return model_management.DISABLE_SMART_MEMORY or model_management.get_free_memory(device) < memory_required
