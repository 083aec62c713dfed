"""Edit: the images are references the prompt speaks of (an edit model's task, `families.EDIT`); the
output is a new image of width x height, not a noised copy of the first."""

from __future__ import annotations

from ..families import EDIT, TaskPipeline
from .base import SampleRequest, Task
from .images import pil_image


class Edit(Task):
    name = EDIT

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        references = [pil_image(image, index) for image in request.images]
        return {"image": references if pipeline.image_list else references[0]}
