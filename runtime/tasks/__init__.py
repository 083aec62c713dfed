"""The tasks a Sampler runs, and which one runs for a model and a request.

A family names, for each of its model classes, the diffusers pipeline of each task it has; the task follows
from the inputs (no image: text to image; an image: edit on an edit model, else image to image; image and
mask: inpaint), as diffusers' AutoPipeline maps a model to its task classes. A task knows the request's
checks and the pipeline's call arguments.
"""

from __future__ import annotations

from ..errors import UserInputError
from ..families import (EDIT, FIRSTLAST2VIDEO, IMAGE2IMAGE, IMAGE2VIDEO, INCONTEXT2VIDEO, INPAINT, REFERENCE2VIDEO,
                        TEXT2IMAGE, TEXT2VIDEO, Family, TaskPipeline, family_for)
from .base import MAX_SEED, SampleRequest, Task, resolve_size, validate_frames, validate_size  # noqa: F401
from .edit import Edit
from .image2image import Image2Image
from .inpaint import Inpaint
from .text2image import Text2Image
from .video import FirstLast2Video, Image2Video, InContext2Video, Reference2Video, Text2Video

TASKS: dict[str, Task] = {task.name: task for task in (Text2Image(), Image2Image(), Inpaint(), Edit(), Text2Video(),
                                                       Image2Video(), FirstLast2Video(), InContext2Video(),
                                                       Reference2Video())}


def wanted_task(tasks, request: SampleRequest) -> str:
    if request.frames:  # the Video Sampler's images: none, (image,) or (image, last_image); its references
        if request.references:
            return REFERENCE2VIDEO
        if request.reference_video is not None:
            return INCONTEXT2VIDEO
        if len(request.images) > 1:
            return FIRSTLAST2VIDEO
        return IMAGE2VIDEO if request.images else TEXT2VIDEO
    if request.mask is not None:
        return INPAINT
    if request.latent is not None:  # latents are a start to denoise from, never an edit's reference
        return IMAGE2IMAGE
    if request.images:
        return EDIT if EDIT in tasks else IMAGE2IMAGE
    return TEXT2IMAGE


def _needs(task: str, pipeline: TaskPipeline) -> str:
    if task in (TEXT2IMAGE, TEXT2VIDEO):
        return "no image"
    if task == IMAGE2VIDEO:
        return "a start image"
    if task == FIRSTLAST2VIDEO:
        return "image + last_image (the first and the last frame)"
    if task == INCONTEXT2VIDEO:
        return "reference_video (+ image as the first frame)"
    if task == REFERENCE2VIDEO:
        return "references (TPU Video Reference)"
    if task == INPAINT:
        return "image + mask" + (" (+ image_2 as reference)" if pipeline.reference_kwarg else "")
    return f"1 to {pipeline.images} images" if pipeline.images > 1 else "an image"


def task_for(family: Family, model_class: str, request: SampleRequest) -> tuple[Task, TaskPipeline]:
    """The task a model of `model_class` runs for the request's inputs, and the diffusers pipeline that runs
    it; refused, saying what the model takes, when it has none for these inputs."""
    validate_frames(family, request.frames)  # a video model on the image Sampler, or the reverse
    tasks = family.model_classes[model_class]
    wanted = wanted_task(tasks, request)
    if wanted not in tasks:
        given = {TEXT2IMAGE: "no image is connected", INPAINT: "a mask is connected",
                 IMAGE2IMAGE: "a latent is connected" if request.latent is not None
                 else "an image without a mask is connected", TEXT2VIDEO: "no image is connected",
                 IMAGE2VIDEO: "an image is connected (this model takes no image: text to video only)",
                 FIRSTLAST2VIDEO: "a last_image is connected",
                 INCONTEXT2VIDEO: "a reference_video is connected",
                 REFERENCE2VIDEO: "references are connected"}[wanted]
        runs = "; ".join(f"{task} with {_needs(task, pipeline)} ({pipeline.cls})" for task, pipeline in tasks.items())
        inputs = "image, last_image, reference_video and references" if request.frames else "image and mask"
        raise UserInputError(f"{family.name} {model_class} has no {wanted} pipeline, and {given}. It runs: {runs}. "
                             f"Connect or disconnect the Sampler's {inputs} inputs to match.")
    return TASKS[wanted], tasks[wanted]


def prepare(model_class: str, request: SampleRequest,
            settings: dict | None = None) -> tuple[Family, Task, TaskPipeline, SampleRequest]:
    """What a request on a model of `model_class` (with these model_index settings) runs, checked before
    anything loads: the family, the task, its diffusers pipeline, and the request with its size resolved."""
    family = family_for(model_class, settings=settings)
    task, pipeline = task_for(family, model_class, request)
    request = resolve_size(family, pipeline, request)
    task.validate(family, pipeline, request)
    return family, task, pipeline, request


def check_host_memory(task: Task, request: SampleRequest, available: int | None) -> None:
    """Refuse a request whose output alone cannot fit in host memory, before anything is allocated: it would
    otherwise allocate until the allocator fails or the OOM killer ends ComfyUI."""
    needed = task.host_bytes(request)
    if available is not None and needed > available:
        frames = f" x {request.frames} frames" if request.frames else ""
        raise UserInputError(f"batch {request.batch_size} at {request.width}x{request.height}{frames} is too large for "
                             f"this machine's memory: the images alone need {needed / 2**30:.1f} GiB and "
                             f"{available / 2**30:.1f} GiB are available. Lower the batch size or the image size"
                             f"{' or the frames' if frames else ''}.")


def run_pipeline(pipe, family: Family, request: SampleRequest, on_step=None, preview=None):
    """Sample `request` with a loaded pipeline of one of `family`'s model classes, as its inputs say (and as its
    config's settings make the family: `Family.with_settings`)."""
    family = family.with_settings(pipe.config)
    task, pipeline = task_for(family, type(pipe).__name__, request)
    return task.run(pipe, family, pipeline, request, on_step, preview)


def markdown_matrix() -> str:
    """docs/image_inputs.md's task matrix: each model class's tasks and the diffusers class of each."""
    names = {TEXT2IMAGE: "text to image", IMAGE2IMAGE: "image to image", EDIT: "edit (references)",
             INPAINT: "inpaint"}
    from ..families import FAMILIES

    rows = ["| family | model (model_index / file) | " + " | ".join(names.values()) + " |",
            "|---|---|" + "---|" * len(names)]
    for family in (family for family in FAMILIES if not family.makes_video):  # video: docs/video.md
        for model_class, tasks in family.model_classes.items():
            cells = []
            for task in names:
                pipeline = tasks.get(task)
                if pipeline is None:
                    cells.append("—")
                    continue
                detail = [f"`{pipeline.cls}`"]
                if task == INPAINT:
                    detail.append("image + mask" + (", image_2 = reference" if pipeline.reference_kwarg else ""))
                elif task != TEXT2IMAGE:
                    detail.append(f"1-{pipeline.images} images" if pipeline.images > 1 else "1 image")
                if pipeline.strength:
                    detail.append("denoise")
                if pipeline.output_size:
                    detail.append(f"output {pipeline.output_size_words} (size 0)")
                cells.append(", ".join(detail))
            rows.append(f"| {family.name} | {model_class} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
