"""Krea 2 (Krea AI) Raw and Turbo: text to image (diffusers has no image-to-image or reference class for it).

A single-stream MMDiT fed by a Qwen3-VL text encoder: the hidden states of several of its layers are stacked per
token, the prompt padded to 512 tokens. Its guidance_scale is cond + g x (cond - uncond), so g = 0 turns CFG off
(Turbo, distilled: 8 steps at 0; Raw: 28 steps at 4.5). Turbo has Raw's classes and keys, only the model_index
setting `is_distilled` (a fixed timestep shift) differs: a file variant told by its name, whose configs must have
it. Its VAE and latents are Qwen-Image's (Wan 2.1's VAE, packed 2x2), which ComfyUI previews with the Wan21 latent
format. diffusers has no tensor-parallel plan for its transformer: several chips run it as replicas.
"""

from .base import TEXT2IMAGE, ComfyLatent, Family, FileKind, FileSlot, FileVariant, TaskPipeline
from .components import QWEN3VL, WAN_VAE, diffusers_detection_keys, image_memory, wan_vae_shape
from .qwenimage import comfy_latents, one_frame_latents

# "txtfusion.projector.weight" in Krea's (and ComfyUI's) layout, "text_fusion.projector.weight" in diffusers'
TRANSFORMER = FileKind("krea2_transformer", "a Krea 2 diffusion model",
                       lambda: (*diffusers_detection_keys("krea2"), "text_fusion.projector.weight"))


def transformer_shape(config):
    """Krea2Transformer2DModel's heads x head width, its SwiGLU's `intermediate_size`, latents packed 2x2."""
    return config["num_attention_heads"] * config["attention_head_dim"], config["intermediate_size"], (1, 2, 2)


FAMILY = Family(
    name="Krea 2",
    model_classes={"Krea2Pipeline": {TEXT2IMAGE: TaskPipeline("Krea2Pipeline")}},
    takes_negative_prompt=True,  # used only when guidance > 0
    guidance_hint="cond + g x (cond - uncond): 0 turns CFG off (Turbo: 0, Raw: 4.5)",
    guidance_kwarg="guidance_scale",
    size_multiple=16,
    default_steps=28,
    latent_grid=one_frame_latents,
    comfy_latent_format="Wan21",
    comfy_latent=ComfyLatent(channels=16, factor=8, frame_axis=True, to_comfy=comfy_latents),
    denoiser_kind=TRANSFORMER,
    denoiser_files=("krea2_turbo_fp8_scaled.safetensors", "krea2_turbo_int8_convrot.safetensors"),
    file_slots=(
        FileSlot("text_encoder", QWEN3VL, "qwen3vl_4b_fp8_scaled.safetensors"),
        FileSlot("vae", WAN_VAE, "qwen_image_vae.safetensors"),
    ),
    default_config_repo="krea/Krea-2-Raw",
    memory=image_memory(transformer_shape, wan_vae_shape),
    diffusers_model_types=("krea2",),
    setting_changes=(("is_distilled", {"default_steps": 8}),),
    file_variants=(FileVariant("Krea2Pipeline", "krea/Krea-2-Turbo", name_contains=("turbo",),
                               settings={"is_distilled": True}),),
)
