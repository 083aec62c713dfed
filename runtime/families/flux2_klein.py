"""FLUX.2 [klein] (Black Forest Labs) 4B and 9B, distilled (4 steps) and base: text to image, edits from
reference images (`image=` list) and inpaint (with one reference).

Its transformer is FLUX.2 [dev]'s architecture (the same keys) at other widths, fed by a Qwen3 text encoder
(Qwen3-4B for 4B, Qwen3-8B for 9B) instead of Mistral 3: three of its layers stacked, so the context embedder's
input width is 3 x the encoder's hidden size (7680, 12288; [dev]'s is 15360). That width tells a klein file
from a [dev] one, and the 4B from the 9B. VAE and latent space are FLUX.2's. Whether CFG runs is the configs'
`is_distilled` (model_index.json), not a component.
"""

from . import flux2
from .base import EDIT, INPAINT, TEXT2IMAGE, Family, FileKind, FileSlot, FileVariant, TaskPipeline
from .components import QWEN3

QWEN3_4B_WIDTH, QWEN3_8B_WIDTH = 3 * 2560, 3 * 4096  # the context embedder's input: 3 stacked encoder layers

TRANSFORMER = FileKind("flux2_klein_transformer", "a FLUX.2 [klein] diffusion model", flux2.TRANSFORMER.keys,
                       width_keys=("txt_in.weight", "context_embedder.weight"),
                       widths=(QWEN3_4B_WIDTH, QWEN3_8B_WIDTH))


def inpaint_size(width: int, height: int) -> tuple[int, int]:
    """What Flux2KleinInpaintPipeline makes from an image of width x height, whatever size is asked: the image's
    own size (scaled down to about 1 MP when larger), rounded down to a multiple of 16, as its __call__ does."""
    if width * height > 1024 * 1024:
        scale = (1024 * 1024 / (width * height)) ** 0.5
        width, height = int(width * scale), int(height * scale)
    return width // 16 * 16, height // 16 * 16


FAMILY = Family(
    name="FLUX.2 [klein]",
    model_classes={"Flux2KleinPipeline": {
        TEXT2IMAGE: TaskPipeline("Flux2KleinPipeline"),
        EDIT: TaskPipeline("Flux2KleinPipeline", images=3, image_list=True),
        INPAINT: TaskPipeline("Flux2KleinInpaintPipeline", images=2, reference_kwarg="image_reference", strength=True,
                              output_size=inpaint_size, output_size_words="the image's size, to 16 px"),
    }},
    takes_negative_prompt=False,  # the base models' CFG runs with an empty negative prompt
    guidance_kwarg="guidance_scale",  # ignored by the distilled models (is_distilled)
    guidance_hint="ignored by the distilled models",
    size_multiple=16,
    default_steps=4,
    latent_grid=flux2.patchified_latents,
    comfy_latent_format="Flux2",
    comfy_latent=flux2.COMFY_LATENT,
    denoiser_kind=TRANSFORMER,
    denoiser_files=("flux-2-klein-4b-fp8.safetensors", "flux-2-klein-4b.safetensors",
                    "flux-2-klein-9b-fp8.safetensors", "flux-2-klein-9b.safetensors",
                    "flux-2-klein-base-4b.safetensors", "flux-2-klein-base-9b-fp8.safetensors"),
    file_slots=(
        FileSlot("text_encoder", QWEN3, "qwen_3_4b.safetensors (4B) / qwen_3_8b_fp8mixed.safetensors (9B)"),
        FileSlot("vae", flux2.VAE, "flux2-vae.safetensors"),
    ),
    default_config_repo="black-forest-labs/FLUX.2-klein-4B",
    memory=flux2.MEMORY,
    file_variants=(  # the base (undistilled) models are told by their names: flux-2-klein-base-4b, ...
        FileVariant("Flux2KleinPipeline", "black-forest-labs/FLUX.2-klein-base-9B", name_contains=("base",),
                    widths=(QWEN3_8B_WIDTH,)),
        FileVariant("Flux2KleinPipeline", "black-forest-labs/FLUX.2-klein-base-4B", name_contains=("base",)),
        FileVariant("Flux2KleinPipeline", "black-forest-labs/FLUX.2-klein-9B", widths=(QWEN3_8B_WIDTH,)),
    ),
)
