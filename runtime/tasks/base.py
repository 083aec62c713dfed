"""What every task shares: the request, its checks, and the call into a diffusers pipeline.

Seeds go through one CPU `torch.Generator` per image (seed, seed+1, ...), as the guide does, so a seed
gives the same image on every device and in every batch position.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from ..errors import UserInputError
from ..families import FAMILIES, Family
from ..features.preview import Previewer, PreviewSpec
from ..modes import outside_inference_mode

# on_step(done, total[, preview]): called after each denoising step; it may raise to cancel the run.
# With a PreviewSpec it also gets the step's preview (an RGB uint8 array, or None).
StepCallback = Callable[..., None]

MAX_SEED = 2**64 - 1  # ComfyUI's seed widgets go up to here; torch.Generator takes all of it


@dataclasses.dataclass(frozen=True)
class SampleRequest:
    prompt: str
    negative_prompt: str = ""
    width: int = 1024
    height: int = 1024
    steps: int = 4
    guidance: float = 0.0
    seed: int = 0
    batch_size: int = 1


class Task:
    """One kind of generation (text to image, ...): what it checks, what it passes to the pipeline's
    __call__, how the pipeline's output becomes the node's output, and the host memory that output needs."""

    name: str

    def validate(self, family: Family, request: SampleRequest) -> None:
        """Reject what the family cannot take, with a message that says what to change."""
        if not request.prompt.strip():
            raise UserInputError(f"{family.name} needs a prompt: the prompt is empty. Describe the image to generate.")
        if request.steps < 1:
            raise UserInputError(f"steps is {request.steps}; at least 1 denoising step is needed "
                                 f"({family.name} models usually use {family.default_steps}).")
        if request.batch_size < 1:
            raise UserInputError(f"batch size is {request.batch_size}; it must be at least 1.")
        if not 0 <= request.seed <= MAX_SEED:
            raise UserInputError(f"seed {request.seed} is outside 0..{MAX_SEED}.")
        validate_size(family, request.width, request.height)

    def pipeline_kwargs(self, family: Family, request: SampleRequest) -> dict:
        raise NotImplementedError

    def output(self, pipeline_output):
        """The node's output from the pipeline's (called with output_type="pt")."""
        raise NotImplementedError

    def host_bytes(self, request: SampleRequest) -> int:
        """Host memory the output alone needs, checked before anything is allocated."""
        raise NotImplementedError

    def run(self, pipe, family: Family, request: SampleRequest, on_step: StepCallback | None = None,
            preview: PreviewSpec | None = None):
        """Sample with `pipe` (a loaded pipeline of this task's class). Without a preview spec the step
        callback never touches the latents, so previews cost nothing when off."""
        self.validate(family, request)
        previewer = Previewer(preview, pipe, family, request.height, request.width) if preview and on_step else None

        def step_end(_pipe, step, _timestep, callback_kwargs):
            if previewer:
                on_step(step + 1, request.steps, previewer(callback_kwargs["latents"]))
            elif on_step:
                on_step(step + 1, request.steps)
            return callback_kwargs

        with outside_inference_mode():
            output = pipe(**self.pipeline_kwargs(family, request), callback_on_step_end=step_end)
        return self.output(output)


def generators(request: SampleRequest) -> list:
    """One CPU generator per image: image i of a batch is what a batch of one with seed + i gives."""
    import torch

    return [torch.Generator("cpu").manual_seed((request.seed + i) % (MAX_SEED + 1)) for i in range(request.batch_size)]


def nearest_sizes(value: int, multiple: int) -> tuple[int, int]:
    lower = max(multiple, value // multiple * multiple)
    return lower, lower + multiple


def validate_size(family: Family, width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if value < family.size_multiple or value % family.size_multiple:
            below, above = nearest_sizes(value, family.size_multiple)
            raise UserInputError(f"{name} {value} cannot be used with {family.name}: it must be a multiple of "
                                 f"{family.size_multiple}. Nearest valid {name}s: {below} or {above}.")


def size_problem(name: str, value: int) -> str | None:
    """What every supported family finds wrong with a width or height, or None: for checks made
    before the model is known (validate_size applies the family's own rule when it runs)."""
    multiple = math.lcm(*(family.size_multiple for family in FAMILIES))
    if value >= multiple and value % multiple == 0:
        return None
    below, above = nearest_sizes(value, multiple)
    return (f"{name} {value} cannot be used: every supported model needs a multiple of {multiple}. "
            f"Nearest valid {name}s: {below} or {above}.")
