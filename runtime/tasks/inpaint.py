"""Inpaint: the image's masked part (mask 1) is repainted, the rest kept. A pipeline with a `reference_kwarg`
also takes image_2 as its reference image there (e.g. `image_reference`)."""

from __future__ import annotations

from ..families import INPAINT, TaskPipeline
from .base import SampleRequest, Task
from .images import at_output_size, pil_image, pil_mask


class Inpaint(Task):
    name = INPAINT

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        image = pil_image(request.images[0], index)
        # the mask at its image's size: diffusers resizes it to the output size itself
        kwargs = {"image": at_output_size(pipeline, image, request),
                  "mask_image": pil_mask(request.mask, index, image.size)}
        if pipeline.reference_kwarg and len(request.images) > 1:
            kwargs[pipeline.reference_kwarg] = pil_image(request.images[1], index)
        return kwargs
