"""Stable Diffusion XL (Stability AI) and its finetunes (Illustrious, Pony, ...): text to image, image to image,
inpaint, from diffusers folders or all-in-one checkpoints in the original (LDM/SGM) layout.

The denoiser is a UNet. The second text encoder is OpenCLIP ViT-bigG, which checkpoints keep in OpenCLIP's own
layout (`conditioner.embedders.1.model.`): diffusers' `convert_open_clip_checkpoint` turns it into transformers'.
The VAE overflows in fp16; its config's `force_upcast` makes diffusers' SDXL pipelines decode it in float32 then.
"""

from .base import (IMAGE2IMAGE, INPAINT, TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, ModularBlocks,
                   TaskPipeline, classifier_free_guider)
from .components import CLIP, KL_VAE, image_memory
from .sd3 import raw_latents, sampled_latents, spatial_latents

# label_emb (diffusers: add_embedding) takes SDXL's pooled text + size conditioning; SD1.x/2.x UNets have none.
UNET = FileKind("sdxl_unet", "an SDXL UNet", lambda: ("label_emb.0.0.weight", "add_embedding.linear_1.weight"),
                converter_prefix="model.diffusion_model.")  # diffusers' LDM UNet converter reads keys under it


def unet_shape(config):
    """The UNet at its widest attention: the first down block with cross-attention (its first block has none, so one
    2x downsample below the latents), as a token of `block_out_channels` there with a GEGLU FFN 4x as wide."""
    kinds = config.get("down_block_types") or ("DownBlock2D", "CrossAttnDownBlock2D")
    level = next((i for i, kind in enumerate(kinds) if "CrossAttn" in kind), 0)
    width = config["block_out_channels"][level]
    return width, 4 * width, (1, 2 ** level, 2 ** level)


def open_clip_to_transformers(cls, config, weights: dict) -> dict:
    """OpenCLIP's text tower (resblocks with fused in_proj, text_projection as a matrix) -> CLIPTextModelWithProjection,
    with diffusers' own single-file converter."""
    import torch
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

    with torch.device("meta"):
        model = cls(config)
    converted = convert_open_clip_checkpoint(model, weights, prefix="")
    if not hasattr(model, "text_model"):  # transformers flattens some CLIP classes; diffusers strips it likewise
        converted = {k.removeprefix("text_model."): v for k, v in converted.items()}
    return converted


OPEN_CLIP_BIGG = FileKind("open_clip_bigg", "an OpenCLIP ViT-bigG text encoder (SDXL's second)",
                          lambda: ("transformer.resblocks.0.attn.in_proj_weight",),
                          to_transformers=open_clip_to_transformers)

FAMILY = Family(
    name="SDXL",
    model_classes={"StableDiffusionXLPipeline": {
        TEXT2IMAGE: TaskPipeline("StableDiffusionXLPipeline"),
        IMAGE2IMAGE: TaskPipeline("StableDiffusionXLImg2ImgPipeline", images=1, strength=True),
        INPAINT: TaskPipeline("StableDiffusionXLInpaintPipeline", images=1, strength=True),
    }},
    takes_negative_prompt=True,
    guidance_kwarg="guidance_scale",
    size_multiple=8,  # the VAE's factor; the UNet upsamples to any latent size
    default_steps=30,
    latent_grid=spatial_latents,  # (B, 4, H/8, W/8)
    comfy_latent_format="SDXL",
    comfy_latent=ComfyLatent(channels=4, factor=8, frame_axis=False, to_comfy=raw_latents, to_pipeline=sampled_latents),
    denoiser="unet",
    denoiser_kind=UNET,
    denoiser_files=("sd_xl_base_1.0.safetensors",),
    file_slots=(
        FileSlot("text_encoder", CLIP, "the checkpoint's CLIP-L", "conditioner.embedders.0.transformer."),
        FileSlot("text_encoder_2", OPEN_CLIP_BIGG, "the checkpoint's OpenCLIP ViT-bigG",
                 "conditioner.embedders.1.model."),
        FileSlot("vae", KL_VAE, "sdxl_vae.safetensors"),
    ),
    default_config_repo="stabilityai/stable-diffusion-xl-base-1.0",
    memory=image_memory(unet_shape),
    diffusers_model_types=("xl_base",),
    # inpaint: the blocks' workflow gives other images than StableDiffusionXLInpaintPipeline (not wired)
    modular={"StableDiffusionXLPipeline": ModularBlocks(
        "StableDiffusionXLAutoBlocks", "StableDiffusionXLModularPipeline",
        {TEXT2IMAGE: "text2image", IMAGE2IMAGE: "image2image"}, guider=classifier_free_guider)},
)
