"""Video: text to video, image to video (the image is the first frame), first/last frame to video (image and
last_image are the first and the last frame), and in-context video (a reference video's tokens beside the video's, as
IC-LoRAs are trained: the image, if any, is the first frame). One pipeline call per video (seed + i for video i, as
image batches); the frames come back as ComfyUI's IMAGE batch, video after video, so ComfyUI's own CreateVideo /
SaveAnimatedWEBP take them as they are."""

from __future__ import annotations

from ..errors import UserInputError
from ..families import (FIRSTLAST2VIDEO, IMAGE2VIDEO, INCONTEXT2VIDEO, REFERENCE2VIDEO, TEXT2VIDEO, Family,
                        TaskPipeline)
from ..input_checks import reference_frames_problem, references_problem
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


class InContext2Video(Text2Video):
    name = INCONTEXT2VIDEO

    def validate(self, family: Family, pipeline: TaskPipeline, request: SampleRequest) -> None:
        if request.upscaler:
            raise UserInputError("a reference_video with an upscaler: two stages with in-context conditioning are "
                                 "not supported yet; disconnect one of them.")
        super().validate(family, pipeline, request)
        video = request.reference_video
        if video.ndim != 4 or min(video.shape[:3]) < 1 or video.shape[3] not in (1, 3, 4):
            raise UserInputError(f"reference_video has shape {list(video.shape)}; it is an IMAGE batch of frames: "
                                 "[frames, height, width, channels] with 3 channels (RGB; 4 = RGBA and 1 = grey "
                                 "are converted).")
        if problem := reference_frames_problem(len(request.reference_video), request.frames, family):
            raise UserInputError(problem)
        step = family.size_multiple * request.reference_downscale
        if request.reference_downscale < 1 or request.width % step or request.height % step:
            raise UserInputError(f"the IC-LoRA's reference_downscale_factor is {request.reference_downscale} (its "
                                 f"file's metadata): the reference is encoded at 1/{request.reference_downscale} of "
                                 f"the video's size, so width and height must be multiples of {step}.")

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        reference = [pil_image(request.reference_video, i) for i in range(len(request.reference_video))]
        first = pil_image(request.images[0], index) if request.images else None
        # diffusers resizes (crops) them to the video's size, the reference to 1/factor of it
        return pipeline.in_context(reference, first, request.reference_downscale)


class Reference2Video(Text2Video):
    name = REFERENCE2VIDEO

    def validate(self, family: Family, pipeline: TaskPipeline, request: SampleRequest) -> None:
        others = ["image", "last_image"][:len(request.images)]  # the Video Sampler's images, in order
        if request.reference_video is not None:
            others.append("reference_video")
        if problem := references_problem(True, others):
            raise UserInputError(problem)
        super().validate(family, pipeline, request)
        for reference in request.references:
            if problem := reference.problem():
                raise UserInputError(problem)
        if problem := family.reference_rule.problem(request.references, family.name):
            raise UserInputError(problem)

    def image_kwargs(self, pipeline: TaskPipeline, request: SampleRequest, index: int) -> dict:
        return pipeline.references(request.references)  # the same references for every video of the batch
