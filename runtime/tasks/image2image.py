"""Image to image: the image is noised to `denoise` (diffusers' strength) and denoised from there. From a LATENT
instead of an image, its latents are where it starts (Task.run has the family turn ComfyUI's format into the
pipeline's, which its prepare_latents then takes as the encoded image)."""

from __future__ import annotations

from ..families import IMAGE2IMAGE, TaskPipeline
from .base import SampleRequest, Task
from .images import at_output_size, pil_image


class Image2Image(Task):
    name = IMAGE2IMAGE

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        if request.latent is not None:
            import torch

            latent = request.latent
            return {"image": torch.from_numpy(latent[index % len(latent)][None].copy())}
        return {"image": at_output_size(pipeline, pil_image(request.images[0], index), request)}
