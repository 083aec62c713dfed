"""TPU Diffusers for ComfyUI: diffusers pipelines on TPU (TorchTPU), CUDA or CPU.

ComfyUI imports this folder as a package and calls `comfy_entrypoint`. Kept cheap:
heavy libraries (diffusers, transformers) load only when a Sampler first runs.
"""

from . import runtime_package

runtime_package.load()  # before the nodes, which import the runtime by its one name

from .nodes import comfy_entrypoint  # noqa: E402

# Served at /extensions/<folder name>/: the status display on our nodes and the node help pages.
WEB_DIRECTORY = "./web"

__all__ = ["comfy_entrypoint", "WEB_DIRECTORY"]
