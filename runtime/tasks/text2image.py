"""Text to image: a prompt in, a batch of images out, in one pipeline call (diffusers seeds each image with
its own generator there)."""

from __future__ import annotations

from ..families import TEXT2IMAGE, TaskPipeline
from .base import SampleRequest, Task


class Text2Image(Task):
    name = TEXT2IMAGE
    per_image = False

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        return {}
