"""Make ComfyUI's "Unload Models" also release our pipelines and stop the TP workers.

`POST /free {"unload_models": true}` only sets a flag on the prompt queue; ComfyUI's prompt worker
reads the flags with `get_flags()` between prompts, never during one, and then unloads its own
models. We release ours at that same read. Wrapping `comfy.model_management.unload_all_models`
instead would also release them whenever another pack calls it as a routine step. ComfyUI 0.3.75
and newer read the flags the same way (main.py, `prompt_worker`).
"""

import logging

from tpu_diffusers_runtime.engine import ENGINE

log = logging.getLogger("tpu_diffusers")


def install(queue) -> None:
    """Release our pipelines when the prompt worker takes an unload request from `queue`."""
    read_flags = queue.get_flags

    def get_flags(reset=True):
        flags = read_flags(reset)
        # reset=True is the prompt worker consuming the request; the rule is main.py's.
        if reset and flags.get("unload_models", flags.get("free_memory", False)):
            release()
        return flags

    queue.get_flags = get_flags


def release() -> None:
    try:
        dropped = ENGINE.unload()
    except Exception:
        # This runs on ComfyUI's prompt worker thread, which an exception would end for good.
        log.exception("TPU Diffusers: releasing the pipelines failed")
        return
    if dropped:
        log.info("TPU Diffusers: unloaded %d pipeline(s)", dropped)
