"""Make ComfyUI's "Unload Models" also release our pipelines.

ComfyUI 0.3.75 handles `POST /free {"unload_models": true}` by calling
`comfy.model_management.unload_all_models()`, and offers no registry for models it does
not manage, so we wrap that one function (once) to clear the runtime's cache too.
"""

import logging

import comfy.model_management

from ..runtime.engine import ENGINE

log = logging.getLogger("tpu_diffusers")


def install() -> None:
    original = comfy.model_management.unload_all_models
    if getattr(original, "releases_tpu_pipelines", False):
        return

    def unload_all_models(*args, **kwargs):
        dropped = ENGINE.unload()
        if dropped:
            log.info("TPU Diffusers: unloaded %d pipeline(s)", dropped)
        return original(*args, **kwargs)

    unload_all_models.releases_tpu_pipelines = True
    comfy.model_management.unload_all_models = unload_all_models
