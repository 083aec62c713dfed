"""The pipeline families we support, declared once.

A family is identified by the `_class_name` in a folder's `model_index.json`. Everything
that differs between families at sampling time is a field here, not an `if` elsewhere.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .errors import UserInputError


# How a family's in-loop latents (diffusers' callback_on_step_end "latents") become the image-shaped
# latent (B, C, h, w) that ComfyUI's latent_rgb_factors for that family read: latent_grid(pipe, latents,
# height, width). diffusers' loop latents are already in the normalised space ComfyUI's models sample in.
def _spatial(_pipe, latents, _height, _width):
    return latents  # SD3 samples (B, 16, H/8, W/8) as is


def _packed_2x2(pipe, latents, height, width):
    return pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor)  # FLUX.1: (B, H*W/256, 64)


def _packed_2x2_frame(pipe, latents, height, width):
    return pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor)[:, :, 0]  # QwenImage: one frame


def _packed_patchified(pipe, latents, height, width):
    """FLUX.2 packs (B, 128, H/16, W/16) row by row into tokens: undo Flux2Pipeline._pack_latents, then its
    own _unpatchify_latents gives (B, 32, H/8, W/8), the layout ComfyUI's Flux2 factors are for (its
    latent_rgb_factors_reshape does the same)."""
    side = 2 * pipe.vae_scale_factor
    batch, _, channels = latents.shape
    grid = latents.permute(0, 2, 1).reshape(batch, channels, height // side, width // side)
    return pipe._unpatchify_latents(grid)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # shown to users
    pipeline_class: str  # diffusers class named in model_index.json
    takes_negative_prompt: bool
    guidance_kwarg: str  # the __call__ argument the node's "guidance" feeds
    size_multiple: int  # height and width must be multiples of this (VAE factor x patch size)
    default_steps: int  # named in the message for a bad step count
    latent_grid: Callable  # (pipe, latents, height, width) -> (B, C, h, w), for previews
    comfy_latent_format: str  # the class in ComfyUI's comfy.latent_formats whose latent_rgb_factors fit latent_grid
    # Single-file loading: the pipeline components besides the transformer, in the order of the file loader's
    # text_encoder_1.. inputs then vae, each with the file ComfyUI users hold for it (Comfy-Org names).
    file_slots: tuple[tuple[str, str], ...] = ()
    optional_slots: tuple[str, ...] = ()  # components the pipeline runs without (left None when no file)


FAMILIES = {
    f.pipeline_class: f
    for f in (
        Family("FLUX.1", "FluxPipeline", takes_negative_prompt=False, guidance_kwarg="guidance_scale",
               size_multiple=16, default_steps=4, latent_grid=_packed_2x2, comfy_latent_format="Flux",
               file_slots=(("text_encoder", "clip_l.safetensors"), ("text_encoder_2", "t5xxl_fp16.safetensors"),
                           ("vae", "ae.safetensors"))),
        Family("SD3/SD3.5", "StableDiffusion3Pipeline", takes_negative_prompt=True, guidance_kwarg="guidance_scale",
               size_multiple=16, default_steps=40, latent_grid=_spatial, comfy_latent_format="SD3",
               file_slots=(("text_encoder", "clip_l.safetensors"), ("text_encoder_2", "clip_g.safetensors"),
                           ("text_encoder_3", "t5xxl_fp16.safetensors"), ("vae", "the checkpoint's VAE")),
               optional_slots=("text_encoder_3",)),
        Family("FLUX.2", "Flux2Pipeline", takes_negative_prompt=False, guidance_kwarg="guidance_scale",
               size_multiple=16, default_steps=28, latent_grid=_packed_patchified,
               comfy_latent_format="Flux2",
               file_slots=(("text_encoder", "mistral_3_small_flux2_bf16.safetensors"),
                           ("vae", "flux2-vae.safetensors"))),
        # QwenImage's CFG is "true CFG" and only runs when a negative prompt is given. Its VAE is Wan 2.1's,
        # so ComfyUI previews it with the Wan21 latent format.
        Family("QwenImage", "QwenImagePipeline", takes_negative_prompt=True, guidance_kwarg="true_cfg_scale",
               size_multiple=16, default_steps=50, latent_grid=_packed_2x2_frame, comfy_latent_format="Wan21",
               file_slots=(("text_encoder", "qwen_2.5_vl_7b.safetensors"), ("vae", "qwen_image_vae.safetensors"))),
    )
}


def family_for(pipeline_class: str, where: str = "") -> Family:
    try:
        return FAMILIES[pipeline_class]
    except KeyError:
        supported = ", ".join(f"{f.name} ({f.pipeline_class})" for f in FAMILIES.values())
        raise UserInputError(
            f"{where or 'this model'} is a '{pipeline_class}', which TPU Diffusers does not run. "
            f"Supported pipelines: {supported}. Pick a model folder of one of these."
        ) from None
