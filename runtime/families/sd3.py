"""Stable Diffusion 3 and 3.5 (Stability AI): Medium, Large, Large Turbo; T5 is optional."""

from .base import IMAGE2IMAGE, INPAINT, TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, TaskPipeline
from .components import CLIP, KL_VAE, T5, attention_shape, diffusers_detection_keys, image_memory

TRANSFORMER = FileKind("sd3_transformer", "an SD3/SD3.5 diffusion model",
                       lambda: diffusers_detection_keys("sd3") + ("pos_embed.proj.weight",), converter_pops_used=True)


def spatial_latents(_pipe, latents, _height, _width):
    """SD3 samples (B, 16, H/8, W/8): already image-shaped."""
    return latents


def raw_latents(pipe, latents, _height=0, _width=0):
    """Image-shaped latents the pipeline samples -> the VAE's raw ones, as its decode step: / scaling + shift
    (a VAE without a shift factor, SDXL's, has None)."""
    config = pipe.vae.config
    return latents / config.scaling_factor + (config.shift_factor or 0.0)


def sampled_latents(pipe, samples):
    """The VAE's raw latents -> the scaled ones the pipeline samples, as its image encoding step makes them."""
    config = pipe.vae.config
    return (samples - (config.shift_factor or 0.0)) * config.scaling_factor


COMFY_LATENT = ComfyLatent(channels=16, factor=8, frame_axis=False, to_comfy=raw_latents, to_pipeline=sampled_latents)

FAMILY = Family(
    name="SD3/SD3.5",
    model_classes={"StableDiffusion3Pipeline": {
        TEXT2IMAGE: TaskPipeline("StableDiffusion3Pipeline"),
        IMAGE2IMAGE: TaskPipeline("StableDiffusion3Img2ImgPipeline", images=1, strength=True),
        INPAINT: TaskPipeline("StableDiffusion3InpaintPipeline", images=1, strength=True),
    }},
    takes_negative_prompt=True,
    guidance_hint="4.5 for SD3.5",
    guidance_kwarg="guidance_scale",
    size_multiple=16,
    default_steps=40,
    latent_grid=spatial_latents,
    comfy_latent_format="SD3",
    comfy_latent=COMFY_LATENT,
    denoiser_kind=TRANSFORMER,
    denoiser_files=("sd3.5_large.safetensors", "sd3.5_medium.safetensors", "sd3.5_large_turbo.safetensors"),
    file_slots=(
        FileSlot("text_encoder", CLIP, "clip_l.safetensors", "text_encoders.clip_l.transformer."),
        FileSlot("text_encoder_2", CLIP, "clip_g.safetensors", "text_encoders.clip_g.transformer."),
        FileSlot("text_encoder_3", T5, "t5xxl_fp16.safetensors", "text_encoders.t5xxl.transformer.", optional=True),
        FileSlot("vae", KL_VAE, "the checkpoint's VAE"),
    ),
    default_config_repo="stabilityai/stable-diffusion-3.5-medium",
    memory=image_memory(attention_shape(4.0)),
    diffusers_model_types=("sd3", "sd35_large", "sd35_medium"),
)
