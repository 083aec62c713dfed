"""FLUX.2 [dev] (Black Forest Labs): text to image, and edits from up to three reference images (`image=` list)."""

from .base import EDIT, TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, TaskPipeline
from .components import attention_shape, diffusers_detection_keys, image_memory

TRANSFORMER = FileKind("flux2_transformer", "a FLUX.2 diffusion model",
                       lambda: diffusers_detection_keys("flux2") + ("single_stream_modulation.linear.weight",))
def vae_to_diffusers(checkpoint, config):
    """FLUX.2's VAE file is FLUX.1's LDM layout plus a batch norm over the latents (diffusers' AutoencoderKLFlux2 is
    not one `from_single_file` takes)."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    out = convert_ldm_vae_checkpoint(checkpoint, config)
    out.update({k: v for k, v in checkpoint.items() if k.startswith("bn.")})
    return out


VAE = FileKind("flux2_vae", "a FLUX.2 VAE", lambda: ("bn.running_mean",), converter=vae_to_diffusers)
MISTRAL3 = FileKind("mistral3", "a Mistral 3 text encoder", lambda: (
    "language_model.model.layers.0.self_attn.q_proj.weight", "model.language_model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.q_proj.weight"), text_only_prefix=("model.", "model.language_model."))


def latent_grid(pipe, latents, height, width):
    """FLUX.2 packs (B, 128, H/16, W/16) row by row into tokens: undo Flux2Pipeline._pack_latents. That grid,
    still batch-normalised, is ComfyUI's Flux2 LATENT: ComfyUI's FLUX.2 VAE undoes the batch norm (its `bn`)
    and the 2x2 patches when it decodes, as Flux2Pipeline does before its VAE."""
    side = 2 * pipe.vae_scale_factor
    batch, _, channels = latents.shape
    return latents.permute(0, 2, 1).reshape(batch, channels, height // side, width // side)


def patchified_latents(pipe, latents, height, width):
    """Flux2Pipeline's own _unpatchify_latents of the grid gives (B, 32, H/8, W/8), the layout ComfyUI's Flux2
    preview factors are for (its latent_rgb_factors_reshape does the same); also for another pipeline of FLUX.2's
    latents (FLUX 3's modular one)."""
    from diffusers import Flux2Pipeline

    return Flux2Pipeline._unpatchify_latents(latent_grid(pipe, latents, height, width))


# no LATENT input: FLUX.2 has no image-to-image pipeline (its references are edits)
COMFY_LATENT = ComfyLatent(channels=128, factor=16, frame_axis=False, to_comfy=latent_grid)


MEMORY = image_memory(attention_shape(3.0, packed=2))  # 2x2 patches of its VAE's latents per token

FAMILY = Family(
    name="FLUX.2",
    model_classes={"Flux2Pipeline": {
        TEXT2IMAGE: TaskPipeline("Flux2Pipeline"),
        EDIT: TaskPipeline("Flux2Pipeline", images=3, image_list=True),
    }},
    takes_negative_prompt=False,
    guidance_hint="4 for dev",
    guidance_kwarg="guidance_scale",
    size_multiple=16,
    default_steps=28,
    latent_grid=patchified_latents,
    comfy_latent_format="Flux2",
    comfy_latent=COMFY_LATENT,
    denoiser_kind=TRANSFORMER,
    denoiser_files=("flux2_dev_fp8mixed.safetensors",),
    file_slots=(
        FileSlot("text_encoder", MISTRAL3, "mistral_3_small_flux2_bf16.safetensors"),
        FileSlot("vae", VAE, "flux2-vae.safetensors"),
    ),
    default_config_repo="black-forest-labs/FLUX.2-dev",
    memory=MEMORY,
    diffusers_model_types=("flux-2-dev",),
)
