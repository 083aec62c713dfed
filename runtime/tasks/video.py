"""Video: text to video, image to video (the image is the first frame), and first/last frame to video (image and
last_image are the first and the last frame). One pipeline call per video (seed + i for video i, as image batches);
the frames come back as ComfyUI's IMAGE batch, video after video, so ComfyUI's own CreateVideo / SaveAnimatedWEBP
take them as they are."""

from __future__ import annotations

from ..families import FIRSTLAST2VIDEO, IMAGE2VIDEO, TEXT2VIDEO, Family, TaskPipeline
from ..outputs import AUDIO, FRAMES, KINDS, OutputKind
from .base import SampleRequest, Task
from .images import pil_image


class Text2Video(Task):
    name = TEXT2VIDEO
    count_kwarg = "num_videos_per_prompt"

    def extra_kwargs(self, request: SampleRequest) -> dict:
        return {"num_frames": request.frames}

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        return {}

    def output_kinds(self, family: Family) -> tuple[OutputKind, ...]:
        """The frames, and the sound track of a family that makes sound."""
        return (KINDS[FRAMES], *((KINDS[AUDIO],) if family.makes_sound else ()))


class Image2Video(Text2Video):
    name = IMAGE2VIDEO

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        return {"image": pil_image(request.images[0], index)}  # diffusers resizes it to the video's size


class FirstLast2Video(Text2Video):
    name = FIRSTLAST2VIDEO

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        first, last = request.images
        return pipeline.first_last(pil_image(first, index), pil_image(last, index))  # diffusers resizes them
