"""Turn a sampling request into a pipeline call and the pipeline's output into images.

Seeds go through one CPU `torch.Generator` per image (seed, seed+1, ...), as the guide
does, so a seed gives the same image on every device and in every batch position.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from .errors import UserInputError
from .families import FAMILIES, Family
from .modes import outside_inference_mode
from .preview import Previewer, PreviewSpec

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


def nearest_sizes(value: int, multiple: int) -> tuple[int, int]:
    lower = max(multiple, value // multiple * multiple)
    return lower, lower + multiple


def validate_request(family: Family, request: SampleRequest) -> None:
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


def check_host_memory(request: SampleRequest, available: int | None) -> None:
    """Refuse a request whose images alone cannot fit in host memory, before anything is allocated:
    the pipeline's float32 output and the IMAGE tensor made from it (2 x 4 bytes per value). A request
    that large would otherwise allocate until the allocator fails or the OOM killer ends ComfyUI."""
    needed = 2 * 4 * 3 * request.width * request.height * request.batch_size
    if available is not None and needed > available:
        raise UserInputError(f"batch {request.batch_size} at {request.width}x{request.height} is too large for this "
                             f"machine's memory: the images alone need {needed / 2**30:.1f} GiB and "
                             f"{available / 2**30:.1f} GiB are available. Lower the batch size or the image size.")


def validate_size(family: Family, width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if value < family.size_multiple or value % family.size_multiple:
            below, above = nearest_sizes(value, family.size_multiple)
            raise UserInputError(f"{name} {value} cannot be used with {family.name}: it must be a multiple of "
                                 f"{family.size_multiple}. Nearest valid {name}s: {below} or {above}.")


def pipeline_kwargs(family: Family, request: SampleRequest) -> dict:
    import torch

    kwargs = dict(
        prompt=request.prompt,
        height=request.height,
        width=request.width,
        num_inference_steps=request.steps,
        generator=[torch.Generator("cpu").manual_seed((request.seed + i) % (MAX_SEED + 1)) for i in range(request.batch_size)],
        num_images_per_prompt=request.batch_size,
        output_type="pt",
    )
    kwargs[family.guidance_kwarg] = request.guidance
    if family.takes_negative_prompt:
        # diffusers runs QwenImage's true CFG only when a negative prompt is given; " " is its own default.
        kwargs["negative_prompt"] = request.negative_prompt or " "
    return kwargs


def run_pipeline(pipe, family: Family, request: SampleRequest, on_step: StepCallback | None = None,
                 preview: PreviewSpec | None = None):
    """Sample; returns a float32 CPU tensor [B, H, W, C] in 0..1 (ComfyUI's IMAGE layout). Without a
    preview spec the step callback never touches the latents, so previews cost nothing when off."""
    import torch

    validate_request(family, request)
    previewer = Previewer(preview, pipe, family, request.height, request.width) if preview and on_step else None

    def step_end(_pipe, step, _timestep, callback_kwargs):
        if previewer:
            on_step(step + 1, request.steps, previewer(callback_kwargs["latents"]))
        elif on_step:
            on_step(step + 1, request.steps)
        return callback_kwargs

    with outside_inference_mode():
        output = pipe(**pipeline_kwargs(family, request), callback_on_step_end=step_end)
    images = output.images  # [B, C, H, W] in 0..1 for output_type="pt"
    return images.permute(0, 2, 3, 1).to(device="cpu", dtype=torch.float32).clamp(0, 1).contiguous()


def size_problem(name: str, value: int) -> str | None:
    """What every supported family finds wrong with a width or height, or None: for checks made
    before the model is known (validate_size applies the family's own rule when it runs)."""
    multiple = math.lcm(*(family.size_multiple for family in FAMILIES.values()))
    if value >= multiple and value % multiple == 0:
        return None
    below, above = nearest_sizes(value, multiple)
    return (f"{name} {value} cannot be used: every supported model needs a multiple of {multiple}. "
            f"Nearest valid {name}s: {below} or {above}.")
