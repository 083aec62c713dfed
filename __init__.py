"""TPU Diffusers for ComfyUI: diffusers pipelines on TPU (TorchTPU), CUDA or CPU.

ComfyUI imports this folder as a package and calls `comfy_entrypoint`. Kept cheap:
heavy libraries (diffusers, transformers) load only when a Sampler first runs.
"""

from .nodes import comfy_entrypoint

__all__ = ["comfy_entrypoint"]
