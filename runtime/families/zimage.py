"""Z-Image (Alibaba Tongyi-MAI): Z-Image-Turbo text to image, image to image and inpaint.

A single-stream DiT with a Qwen3-4B text encoder and FLUX.1's VAE; it samples FLUX.1's 16-channel latents
unpacked (B, 16, H/8, W/8), which ComfyUI previews with the Flux latent format. diffusers runs CFG when
guidance > 0 (its guidance is ComfyUI's cfg - 1): Turbo is distilled and runs 8 steps at guidance 0.
diffusers has no tensor-parallel plan for its transformer: several chips run it as replicas.
"""

from .base import (IMAGE2IMAGE, INPAINT, TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, ModularBlocks,
                   TaskPipeline)
from .components import KL_VAE, QWEN3, diffusers_detection_keys, image_memory
from .sd3 import raw_latents, sampled_latents, spatial_latents


def fill_rope_table(transformer) -> None:
    """Compute the transformer's rotary table now, as its first call would: diffusers' RopeEmbedder fills it
    lazily inside a `with torch.device("cpu")` block, which torch.compile cannot trace with fullgraph
    ("Unsupported context manager"). Its own precompute, on the transformer's device."""
    rope = transformer.rope_embedder
    if rope.freqs_cis is None:
        table = rope.precompute_freqs_cis(rope.axes_dims, rope.axes_lens, theta=rope.theta)
        rope.freqs_cis = [part.to(transformer.device) for part in table]

def original_cfg_guider(guidance: float) -> dict:
    """The modular blocks' ClassifierFreeGuidance as ZImagePipeline runs CFG: cond + guidance x (cond - uncond), on
    when guidance is above 0 (the blocks' guider is off by default)."""
    return {"guidance_scale": guidance, "use_original_formulation": True, "enabled": True}


def latents_as_image(pipe, samples):
    """ComfyUI's LATENT -> the sampled latents ZImageImg2ImgPipeline starts from as its `image`. Its image processor
    passes a tensor through as latents only when its channels are `vae_latent_channels`, which this pipeline leaves
    at the default 4 (FluxImg2ImgPipeline sets its VAE's): set to the VAE's 16 here, so the latents are not resized
    and normalised as pixels (an image's 3 channels never match it)."""
    pipe.image_processor.register_to_config(vae_latent_channels=pipe.vae.config.latent_channels)
    return sampled_latents(pipe, samples)


def transformer_shape(config):
    """ZImageTransformer2DModel's `dim` channels, its FFN 8/3 as wide (a SwiGLU), patches of `all_patch_size`."""
    side = config.get("all_patch_size", (2,))[0]
    return config["dim"], int(config["dim"] / 3 * 8), (1, side, side)


# "layers.0.adaLN_modulation.0.weight" is the same in ComfyUI's and diffusers' layouts (Lumina 2's is ".1.").
TRANSFORMER = FileKind("zimage_transformer", "a Z-Image diffusion model",
                       lambda: diffusers_detection_keys("z-image-turbo"))

FAMILY = Family(
    name="Z-Image",
    model_classes={"ZImagePipeline": {
        TEXT2IMAGE: TaskPipeline("ZImagePipeline"),
        IMAGE2IMAGE: TaskPipeline("ZImageImg2ImgPipeline", images=1, strength=True, resize_image=True),
        INPAINT: TaskPipeline("ZImageInpaintPipeline", images=1, strength=True, resize_image=True),
    }},
    takes_negative_prompt=True,  # used only when guidance > 0
    guidance_hint="CFG runs only above 0 (Turbo: 0)",
    guidance_kwarg="guidance_scale",
    size_multiple=16,
    default_steps=8,
    latent_grid=spatial_latents,
    comfy_latent_format="Flux",  # ComfyUI's supported_models.ZImage (a Lumina2): latent_formats.Flux
    comfy_latent=ComfyLatent(channels=16, factor=8, frame_axis=False, to_comfy=raw_latents,
                             to_pipeline=latents_as_image),
    denoiser_kind=TRANSFORMER,
    denoiser_files=("z_image_turbo_bf16.safetensors",),
    file_slots=(
        FileSlot("text_encoder", QWEN3, "qwen_3_4b.safetensors"),
        FileSlot("vae", KL_VAE, "ae.safetensors"),
    ),
    default_config_repo="Tongyi-MAI/Z-Image-Turbo",
    memory=image_memory(transformer_shape),
    diffusers_model_types=("z-image-turbo",),
    prepare_compile=fill_rope_table,
    modular={"ZImagePipeline": ModularBlocks("ZImageAutoBlocks", "ZImageModularPipeline",
                                             {TEXT2IMAGE: "text2image", IMAGE2IMAGE: "image2image"},
                                             guider=original_cfg_guider)},
)
