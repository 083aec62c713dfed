"""The tasks a Sampler runs, and which one runs for a model and a request.

A family names the diffusers class of each task for each of its model classes; a task knows the
request's checks, the pipeline's call arguments and its output. Only text-to-image runs today: image
inputs (image to image, inpaint, edit) and video add tasks here, and their classes in the families.
"""

from __future__ import annotations

from ..errors import UserInputError
from ..families import Family, family_for
from .base import MAX_SEED, SampleRequest, Task, nearest_sizes, size_problem, validate_size  # noqa: F401
from .text2image import Text2Image

TASKS: dict[str, Task] = {task.name: task for task in (Text2Image(),)}


def runnable_tasks(family: Family, model_class: str) -> list[str]:
    return [task for task in family.model_classes[model_class] if task in TASKS]


def check_runnable(model_class, where: str = "") -> Family:
    """The model's family, refused unless some task it runs is one TPU Diffusers runs."""
    family = family_for(model_class, where)
    if not runnable_tasks(family, model_class):
        tasks = ", ".join(family.model_classes[model_class])
        raise UserInputError(
            f"{where or 'this model'} is a {family.name} {model_class}, which runs {tasks}: that needs image inputs, "
            f"which TPU Diffusers does not take yet. Pick a text-to-image model of {family.name} "
            f"({family.base_class}).")
    return family


def task_for(family: Family, model_class: str) -> tuple[Task, str]:
    """The task a model of `model_class` (checked with check_runnable) runs, and the diffusers class that
    runs it. Without image inputs that is text to image; image inputs will choose among several here."""
    task = TASKS[runnable_tasks(family, model_class)[0]]
    return task, family.pipeline_for(model_class, task.name)


def check_host_memory(task: Task, request: SampleRequest, available: int | None) -> None:
    """Refuse a request whose output alone cannot fit in host memory, before anything is allocated: it would
    otherwise allocate until the allocator fails or the OOM killer ends ComfyUI."""
    needed = task.host_bytes(request)
    if available is not None and needed > available:
        raise UserInputError(f"batch {request.batch_size} at {request.width}x{request.height} is too large for this "
                             f"machine's memory: the images alone need {needed / 2**30:.1f} GiB and "
                             f"{available / 2**30:.1f} GiB are available. Lower the batch size or the image size.")


def run_pipeline(pipe, family: Family, request: SampleRequest, on_step=None, preview=None):
    """Sample `request` with a loaded pipeline of `family`, as the task its class runs."""
    task, _ = task_for(family, type(pipe).__name__)
    return task.run(pipe, family, request, on_step, preview)
