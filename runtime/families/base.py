"""What a family is: the classes its modules fill in. A leaf module: it imports nothing of the pack."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

# Task names (runtime/tasks has the tasks that run today; a family lists its classes for the others already).
TEXT2IMAGE = "text2image"
IMAGE2IMAGE = "image2image"
INPAINT = "inpaint"
EDIT = "edit"
VIDEO = "video"


@dataclasses.dataclass(frozen=True)
class FileKind:
    """What a single weights file is, told by one key it carries (after any checkpoint prefix): its
    original layout's key first, then the diffusers/transformers layout's. `keys` is called when needed
    (diffusers' own detection keys need diffusers imported)."""

    name: str
    words: str  # "a FLUX.1 diffusion model": how messages name it
    keys: Callable[[], tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class FileSlot:
    """A pipeline component that can come from a single file in ComfyUI's folders."""

    component: str  # the pipeline's component name: text_encoder, text_encoder_2, vae, ...
    kind: FileKind
    comfy_file: str  # the file ComfyUI's own templates download for it (Comfy-Org names)
    checkpoint_prefix: str = ""  # where an all-in-one checkpoint keeps it ("" = never in one)
    optional: bool = False  # the pipeline runs without it (left None when no file or weights give it)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # shown to users
    # model_index.json `_class_name`s of this family -> {task: the diffusers pipeline class that runs it}.
    # The first is the base model, what a diffusion-model file of this family loads as.
    model_classes: Mapping[str, Mapping[str, str]]
    takes_negative_prompt: bool
    guidance_kwarg: str  # the __call__ argument the node's "guidance" feeds
    size_multiple: int  # height and width must be multiples of this (VAE factor x patch size)
    default_steps: int  # named in the message for a bad step count
    # (pipe, latents, height, width) -> (B, C, h, w): the denoising loop's latents (diffusers'
    # callback_on_step_end "latents", already in the normalised space ComfyUI's models sample in) as the
    # image-shaped latent that ComfyUI's latent_rgb_factors for `comfy_latent_format` read, for previews.
    latent_grid: Callable
    comfy_latent_format: str  # the class in ComfyUI's comfy.latent_formats
    # Single files: the denoiser's kind, the files ComfyUI's templates download for it, the other components.
    denoiser_kind: FileKind
    denoiser_files: tuple[str, ...]
    file_slots: tuple[FileSlot, ...]
    default_config_repo: str  # configs and tokenizers for single files when diffusers cannot tell the variant
    diffusers_model_types: tuple[str, ...] = ()  # single_file_utils.infer_diffusers_model_type values of it
    denoiser: str = "transformer"  # the pipeline component that denoises (SDXL's is a "unet")

    @property
    def base_class(self) -> str:
        return next(iter(self.model_classes))

    @property
    def optional_slots(self) -> tuple[str, ...]:
        return tuple(slot.component for slot in self.file_slots if slot.optional)

    def slot(self, component: str) -> FileSlot | None:
        return next((slot for slot in self.file_slots if slot.component == component), None)

    def pipeline_for(self, model_class: str, task: str) -> str | None:
        """The diffusers class that runs `task` on a model of `model_class`, or None if it has none."""
        return self.model_classes[model_class].get(task)

