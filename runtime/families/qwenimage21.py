"""Qwen-Image 2.1 (Alibaba Qwen): text to image, and edit from one to three reference images (the Sampler's image,
image_2 and image_3) with the same pipeline class, QwenImage21Pipeline, through its `image=` list.

Not Qwen-Image's architecture: a single-stream block-causal transformer fed by a Qwen3-VL text encoder (which also
reads the edit's images), a 16x VAE with 64 latent channels that decodes RGBA, one token per latent pixel. Sizes
are multiples of 32 (diffusers rounds other sizes down). CFG ("true CFG") runs only with true_cfg_scale > 1 and a
negative prompt; the model is made to run without (1). The references are resized to about 1 MP at their own
aspect ratio (diffusers' output_resolution 1024), whatever the output size. Its IMAGE is the RGB of its RGBA output,
and the alpha is the Sampler's MASK (1 - alpha, ComfyUI's convention; its background-removal template uses it).
"""

from .base import EDIT, TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, FileVariant, ModularBlocks, TaskPipeline
from .components import QWEN3VL, attention_shape, diffusers_detection_keys, image_memory, wan_vae_shape

TRANSFORMER = FileKind("qwenimage21_transformer", "a Qwen-Image 2.1 diffusion model",
                       lambda: diffusers_detection_keys("qwen-image-2.1"))
# its VAE's decoder has a fifth stage (16x) of Wan-style residual blocks; Wan's VAEs have four (diffusers layout)
VAE = FileKind("qwenimage21_vae", "a Qwen-Image 2.1 VAE", lambda: ("decoder.up_blocks.4.resnets.0.norm1.gamma",))


def one_frame_latents(pipe, latents, height, width):
    """The loop's (B, h x w, C) tokens as the (B, C, h, w) latent image, by QwenImage21Pipeline's own unpacking."""
    from diffusers import QwenImage21Pipeline

    return QwenImage21Pipeline._unpack_latents(latents, height, width, pipe.vae_scale_factor)[:, :, 0]


def comfy_latents(pipe, latents, height, width):
    """The (B, 64, h, w) latent image x std + mean: what QwenImage21Pipeline hands its VAE (less the frame axis),
    ComfyUI's QwenImage21 LATENT (4-D, raw: its latent format's process_out is x std + mean too)."""
    import torch

    config = pipe.vae.config
    mean, std = (torch.tensor(values, dtype=torch.float32).view(1, config.z_dim, 1, 1)
                 for values in (config.latents_mean, config.latents_std))
    return one_frame_latents(pipe, latents, height, width) * std + mean


# Qwen-Image 2.1 Turbo: the same classes, distilled to a fixed sampling grid that its model_index.json records
# (`sample_sigmas`: they set the step count, whatever is asked) and run without guidance. The classic pipeline runs it
# from that setting; diffusers' modular Turbo blocks (TPU_DIFFUSERS_PIPELINE_KIND=modular) take no guidance and no
# negative prompt at all, and give the classic run's images.
TURBO_BLOCKS = ModularBlocks("QwenImage21TurboAutoBlocks", "QwenImage21TurboModularPipeline",
                             {TEXT2IMAGE: "text2image", EDIT: "image_conditioned"}, unguided=True)
TURBO = {"default_steps": 8, "takes_negative_prompt": False, "modular": {"QwenImage21Pipeline": TURBO_BLOCKS}}

FAMILY = Family(
    name="Qwen-Image 2.1",
    model_classes={"QwenImage21Pipeline": {
        TEXT2IMAGE: TaskPipeline("QwenImage21Pipeline"),
        EDIT: TaskPipeline("QwenImage21Pipeline", images=3, image_list=True),
    }},
    takes_negative_prompt=True,
    guidance_kwarg="true_cfg_scale",
    guidance_hint="the true-CFG scale, used above 1 with a negative prompt (made for 1; Turbo: none)",
    size_multiple=32,
    default_steps=40,
    latent_grid=one_frame_latents,
    # ComfyUI's supported_models.QwenImage21 (newer than the vendored 0.3.75, which has no previews for it)
    comfy_latent_format="QwenImage21",
    # no LATENT input: QwenImage21Pipeline has no image to image (its images are references)
    comfy_latent=ComfyLatent(channels=64, factor=16, frame_axis=False, to_comfy=comfy_latents),
    denoiser_kind=TRANSFORMER,
    denoiser_files=("qwen_image_2.1_bf16.safetensors", "qwen_image_2.1_int8_convrot.safetensors"),
    file_slots=(
        FileSlot("text_encoder", QWEN3VL, "qwen3vl_8b_bf16.safetensors"),
        FileSlot("vae", VAE, "qwen_image_2.1_vae_bf16.safetensors"),
    ),
    default_config_repo="Qwen/Qwen-Image-2.1",
    diffusers_model_types=("qwen-image-2.1",),
    memory=image_memory(attention_shape(3.0), wan_vae_shape),
    decodes_alpha=True,
    setting_changes=(("sample_sigmas", TURBO),),
    # ComfyUI's names: qwen_image_2.1_turbo_bf16, qwen_image_2.1_turbo_int8_convrot
    file_variants=(FileVariant("QwenImage21Pipeline", "Qwen/Qwen-Image-2.1-Turbo", name_contains=("turbo",),
                               settings={"sample_sigmas": True}),),
    untraceable_whole="diffusers' QwenImage21Rope reads the token mask with tolist() outside the blocks",
)
