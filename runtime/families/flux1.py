"""FLUX.1 (Black Forest Labs): schnell and dev (text, image to image, inpaint); Kontext (edit, and inpaint with a
reference) and Fill (inpaint) share its components."""

from .base import (EDIT, IMAGE2IMAGE, INPAINT, TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, FileVariant,
                   ModularBlocks, TaskPipeline)
from .components import CLIP, KL_VAE, T5, attention_shape, diffusers_detection_keys, image_memory
from .sd3 import raw_latents, sampled_latents

TRANSFORMER = FileKind("flux_transformer", "a FLUX.1 diffusion model",
                       lambda: diffusers_detection_keys("flux") + ("single_transformer_blocks.0.proj_mlp.weight",),
                       converter_pops_used=True)


def packed_2x2_latents(pipe, latents, height, width):
    """(B, H*W/256, 64) tokens of 2x2 latent patches -> (B, 16, H/8, W/8), by FluxPipeline's own unpacking (so a
    modular pipeline, which has the VAE factor but not the helper, is previewed alike)."""
    from diffusers import FluxPipeline

    return FluxPipeline._unpack_latents(latents, height, width, pipe.vae_scale_factor)


def comfy_latents(pipe, latents, height, width):
    """Unpacked, then / scaling + shift: what FluxPipeline hands its VAE (ComfyUI's Flux LATENT)."""
    return raw_latents(pipe, packed_2x2_latents(pipe, latents, height, width))


FAMILY = Family(
    name="FLUX.1",
    model_classes={
        "FluxPipeline": {
            TEXT2IMAGE: TaskPipeline("FluxPipeline"),
            IMAGE2IMAGE: TaskPipeline("FluxImg2ImgPipeline", images=1, strength=True),
            INPAINT: TaskPipeline("FluxInpaintPipeline", images=1, strength=True),
        },
        "FluxKontextPipeline": {
            TEXT2IMAGE: TaskPipeline("FluxKontextPipeline", max_area=True),
            EDIT: TaskPipeline("FluxKontextPipeline", images=1, max_area=True),
            INPAINT: TaskPipeline("FluxKontextInpaintPipeline", images=2, reference_kwarg="image_reference",
                                  strength=True, max_area=True),
        },
        "FluxFillPipeline": {INPAINT: TaskPipeline("FluxFillPipeline", images=1, strength=True)},
    },
    takes_negative_prompt=False,
    guidance_hint="0 for schnell, 3.5 for dev",
    guidance_kwarg="guidance_scale",
    size_multiple=16,
    default_steps=4,
    latent_grid=packed_2x2_latents,
    comfy_latent_format="Flux",
    # FluxImg2ImgPipeline takes (B, 16, h, w) scaled latents as its `image`
    comfy_latent=ComfyLatent(channels=16, factor=8, frame_axis=False, to_comfy=comfy_latents,
                             to_pipeline=sampled_latents),
    denoiser_kind=TRANSFORMER,
    denoiser_files=("flux1-dev.safetensors", "flux1-schnell.safetensors", "flux1-dev-kontext_fp8_scaled.safetensors",
                    "flux1-fill-dev.safetensors"),
    file_slots=(
        FileSlot("text_encoder", CLIP, "clip_l.safetensors", "text_encoders.clip_l.transformer."),
        FileSlot("text_encoder_2", T5, "t5xxl_fp16.safetensors", "text_encoders.t5xxl.transformer."),
        FileSlot("vae", KL_VAE, "ae.safetensors"),
    ),
    default_config_repo="black-forest-labs/FLUX.1-dev",
    memory=image_memory(attention_shape(4.0, packed=2)),  # 2x2 latent patches per token; its FFN is 4x wide
    diffusers_model_types=("flux-dev", "flux-schnell", "flux-fill", "flux-depth"),
    file_variants=(
        FileVariant("FluxFillPipeline", "black-forest-labs/FLUX.1-Fill-dev", model_types=("flux-fill",)),
        FileVariant("FluxKontextPipeline", "black-forest-labs/FLUX.1-Kontext-dev", name_contains=("kontext",)),
    ),
    modular={"FluxPipeline": ModularBlocks("FluxAutoBlocks", "FluxModularPipeline",
                                           {TEXT2IMAGE: "text2image", IMAGE2IMAGE: "image2image"})},
)
