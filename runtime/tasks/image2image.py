"""Image to image: the image is noised to `denoise` (diffusers' strength) and denoised from there."""

from __future__ import annotations

from ..families import IMAGE2IMAGE, TaskPipeline
from .base import SampleRequest, Task
from .images import at_output_size, pil_image


class Image2Image(Task):
    name = IMAGE2IMAGE

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        return {"image": at_output_size(pipeline, pil_image(request.images[0], index), request)}
