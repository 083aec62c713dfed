"""FLUX 3 [klein] (Black Forest Labs), base and distilled: text to image, and edit from one to three reference images
(the Sampler's image, image_2 and image_3). diffusers runs it only as modular blocks (`Flux3AutoBlocks`,
`Flux3DistilledAutoBlocks`): its folders have a modular_model_index.json and no model_index.json.

A transformer with per-mode blocks (image, reference images, text) before joint ones, fed by a Qwen3-VL text encoder
(eight of its layers' hidden states stacked per token, one prompt per call) and FLUX.2's VAE and latent space (2x2
patches of 32 channels per token, batch-normalised): FLUX.2's LATENT and previews. Sizes are multiples of 16. The base
model guides with a ClassifierFreeGuidance guider component (the Sampler's guidance, CFG above 1; diffusers' default
3.5, 50 steps); the distilled one (a flow map, 16 steps) takes no guidance and no negative prompt. By default diffusers
first rewrites the prompt with a prompt upsampler (a Qwen3.5 language model, 9B in the release, kept in a repository
of its own): the Sampler's prompt_upsampling, on by default as in diffusers, runs it when the model's folder holds it.
"""

from . import flux2
from .base import (EDIT, TEXT2IMAGE, Family, FileKind, FileSlot, FileVariant, ModularBlocks, TaskPipeline,
                   classifier_free_guider)
from .components import QWEN3VL, diffusers_detection_keys

TRANSFORMER = FileKind("flux3_transformer", "a FLUX 3 [klein] diffusion model",
                       lambda: (*diffusers_detection_keys("flux3"), "early_stream_modulations.image.linear.weight"))

WORKFLOWS = {TEXT2IMAGE: "text2image", EDIT: "image_conditioned"}
BASE, DISTILLED = "Flux3ModularPipeline", "Flux3DistilledModularPipeline"


def tasks(pipeline: str) -> dict:
    """Its tasks, each run by a workflow of the blocks of `pipeline` (a ModularPipeline class: no classic class)."""
    return {TEXT2IMAGE: TaskPipeline(pipeline), EDIT: TaskPipeline(pipeline, images=3, image_list=True)}


FAMILY = Family(
    name="FLUX 3 [klein]",
    model_classes={BASE: tasks(BASE), DISTILLED: tasks(DISTILLED)},
    modular={
        BASE: ModularBlocks("Flux3AutoBlocks", BASE, WORKFLOWS, guider=classifier_free_guider,
                            prompt_upsampler="prompt_upsampler"),
        DISTILLED: ModularBlocks("Flux3DistilledAutoBlocks", DISTILLED, WORKFLOWS, unguided=True,
                                 prompt_upsampler="prompt_upsampler"),
    },
    takes_negative_prompt=True,  # the base model's CFG; the distilled blocks take none (ModularBlocks.unguided)
    guidance_kwarg="guidance_scale",
    guidance_hint="CFG above 1 for the base model (3.5 in diffusers); the distilled model takes none",
    size_multiple=16,
    default_steps=50,  # the base model's; the distilled model's is 16
    latent_grid=flux2.patchified_latents,
    comfy_latent_format="Flux2",
    comfy_latent=flux2.COMFY_LATENT,  # no LATENT input: its references are edits, it has no image to image
    denoiser_kind=TRANSFORMER,
    denoiser_files=("flux3-image-klein-base-bf16.safetensors", "flux3-image-klein-base-int8-convrot.safetensors"),
    file_slots=(
        FileSlot("text_encoder", QWEN3VL, "qwen3vl_4b_int8_convrot.safetensors"),
        FileSlot("vae", flux2.VAE, "flux2-vae.safetensors"),
    ),
    default_config_repo="black-forest-labs/flux-3-image-klein-base",
    diffusers_model_types=("flux-3-image", "flux-3-image-distilled"),
    memory=flux2.MEMORY,  # FLUX.2's shapes: heads x head width, FFN mlp_ratio (3) x as wide, 2x2 patches per token
    # the distilled model's files carry its flow map's second timestep embedder: diffusers' model type says which
    file_variants=(FileVariant(DISTILLED, "black-forest-labs/flux-3-image-klein",
                               model_types=("flux-3-image-distilled",)),),
)
