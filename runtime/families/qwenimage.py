"""Qwen-Image (Alibaba Qwen): text to image (and 2512), image to image, inpaint; the Edit models share the family:
Qwen-Image-Edit (one image, or inpaint) and Edit-2509/2511 (QwenImageEditPlusPipeline, one to three images).

Its CFG is "true CFG" and only runs when a negative prompt is given. Its VAE is Wan 2.1's, so ComfyUI
previews it with the Wan21 latent format, one frame.
"""

from .base import (EDIT, IMAGE2IMAGE, INPAINT, TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, FileVariant,
                   ModularBlocks, TaskPipeline, classifier_free_guider)
from .components import WAN_VAE, attention_shape, image_memory, wan_vae_shape

TRANSFORMER = FileKind("qwenimage_transformer", "a QwenImage diffusion model",
                       lambda: ("transformer_blocks.0.img_mod.1.weight",))
QWEN25VL = FileKind("qwen25vl", "a Qwen2.5-VL text encoder", lambda: (
    "model.layers.0.self_attn.q_proj.bias", "model.language_model.layers.0.self_attn.q_proj.bias"))


def edit_inpaint_size(width: int, height: int) -> tuple[int, int]:
    """What QwenImageEditInpaintPipeline makes from an image of width x height, whatever size is asked: about
    1 MP at the image's aspect ratio (diffusers' own calculate_dimensions), a multiple of 16."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_inpaint import calculate_dimensions

    out_width, out_height, _ = calculate_dimensions(1024 * 1024, width / height)
    return out_width // 16 * 16, out_height // 16 * 16


def unpacked_latents(pipe, latents, height, width):
    """Packed 2x2 like FLUX.1, with a frame axis: (B, C, 1, h, w), by QwenImagePipeline's own unpacking (so a modular
    pipeline, which has the VAE factor but not the helper, is unpacked alike)."""
    from diffusers import QwenImagePipeline

    return QwenImagePipeline._unpack_latents(latents, height, width, pipe.vae_scale_factor)


def one_frame_latents(pipe, latents, height, width):
    """The unpacked latents' one frame, for previews."""
    return unpacked_latents(pipe, latents, height, width)[:, :, 0]


def mean_and_std(pipe):
    """The VAE's per-channel latents_mean and latents_std, shaped (1, C, 1, 1, 1) as its latents."""
    import torch

    config = pipe.vae.config
    return (torch.tensor(values, dtype=torch.float32).view(1, config.z_dim, 1, 1, 1)
            for values in (config.latents_mean, config.latents_std))


def comfy_latents(pipe, latents, height, width):
    """Unpacked to (B, 16, 1, h, w), then x std + mean: what QwenImagePipeline hands its VAE (ComfyUI's Wan21
    LATENT for one image, 5-D as ComfyUI's VAE Encode makes it with this VAE)."""
    mean, std = mean_and_std(pipe)
    return unpacked_latents(pipe, latents, height, width) * std + mean


def sampled_latents(pipe, samples):
    """ComfyUI's LATENT -> the normalised (B, 16, h, w) latents QwenImageImg2ImgPipeline takes as its `image`
    (its prepare_latents adds the frame axis back)."""
    mean, std = mean_and_std(pipe)
    return ((samples - mean) / std)[:, :, 0]


FAMILY = Family(
    name="QwenImage",
    model_classes={
        "QwenImagePipeline": {
            TEXT2IMAGE: TaskPipeline("QwenImagePipeline"),
            IMAGE2IMAGE: TaskPipeline("QwenImageImg2ImgPipeline", images=1, strength=True),
            INPAINT: TaskPipeline("QwenImageInpaintPipeline", images=1, strength=True),
        },
        "QwenImageEditPipeline": {
            EDIT: TaskPipeline("QwenImageEditPipeline", images=1),
            INPAINT: TaskPipeline("QwenImageEditInpaintPipeline", images=1, strength=True,
                                  output_size=edit_inpaint_size),
        },
        "QwenImageEditPlusPipeline": {EDIT: TaskPipeline("QwenImageEditPlusPipeline", images=3, image_list=True)},
    },
    takes_negative_prompt=True,
    guidance_hint="the true-CFG scale, used with a negative prompt",
    guidance_kwarg="true_cfg_scale",
    size_multiple=16,
    default_steps=50,
    latent_grid=one_frame_latents,
    comfy_latent_format="Wan21",
    comfy_latent=ComfyLatent(channels=16, factor=8, frame_axis=True, to_comfy=comfy_latents,
                             to_pipeline=sampled_latents),
    denoiser_kind=TRANSFORMER,
    denoiser_files=("qwen_image_fp8_e4m3fn.safetensors", "qwen_image_2512_fp8_e4m3fn.safetensors",
                    "qwen_image_edit_fp8_e4m3fn.safetensors", "qwen_image_edit_2509_fp8_e4m3fn.safetensors",
                    "qwen_image_edit_2511_bf16.safetensors", "qwen_image_2512_bf16.safetensors"),
    file_slots=(
        FileSlot("text_encoder", QWEN25VL, "qwen_2.5_vl_7b_fp8_scaled.safetensors"),
        FileSlot("vae", WAN_VAE, "qwen_image_vae.safetensors"),
    ),
    default_config_repo="Qwen/Qwen-Image",
    memory=image_memory(attention_shape(4.0), wan_vae_shape),
    file_variants=(  # Comfy-Org's names: qwen_image_edit_2509_fp8_e4m3fn, qwen_image_edit_2511_bf16, qwen_image_edit_...
        FileVariant("QwenImageEditPlusPipeline", "Qwen/Qwen-Image-Edit-2511", name_contains=("edit_2511", "edit-2511")),
        FileVariant("QwenImageEditPlusPipeline", "Qwen/Qwen-Image-Edit-2509", name_contains=("edit_2509", "edit-2509")),
        FileVariant("QwenImageEditPipeline", "Qwen/Qwen-Image-Edit", name_contains=("edit",)),
        # Qwen-Image-2512 (qwen_image_2512_fp8_e4m3fn, qwen_image_2512_bf16): the base model's class and keys, with
        # its own configs repo (what `auto` looks for in models/diffusers)
        FileVariant("QwenImagePipeline", "Qwen/Qwen-Image-2512", name_contains=("image_2512", "image-2512")),
    ),
    # image to image and inpaint: the blocks' workflows give other images than the classic pipelines (not wired)
    modular={"QwenImagePipeline": ModularBlocks("QwenImageAutoBlocks", "QwenImageModularPipeline",
                                                {TEXT2IMAGE: "text2image"}, guider=classifier_free_guider)},
)
