"""TPU Latent Upscale Model: a latent upscaler for the TPU Video Sampler's two-stage generation (half size, x2 latent
upscale, refine at full size). Checked now; the Sampler loads it once, with its pipeline."""

import asyncio
import os

from comfy_api.latest import io

import folder_paths
from tpu_diffusers_runtime import upscalers
from tpu_diffusers_runtime.errors import ModelLoadError, UserInputError
from tpu_diffusers_runtime.families import FAMILIES, listed
from tpu_diffusers_runtime.model_files import find_inside

from .types import CATEGORY, TPUUpscaler

FOLDER = "latent_upscale_models"  # ComfyUI's own folder for them (models/latent_upscale_models)
TWO_STAGE_FAMILIES = [family for family in FAMILIES if family.two_stage]


def roots() -> list[str]:
    """Where upscalers are looked for: ComfyUI's folder for them, then models/diffusers (a pipeline folder there may
    hold one in its subfolder, `TwoStage.subfolder`)."""
    return folder_paths.get_folder_paths(FOLDER) + folder_paths.get_folder_paths("diffusers")


def choices() -> list[str]:
    """The folder's files, then the diffusers upscaler folders."""
    return folder_paths.get_filename_list(FOLDER) + upscalers.list_folders(roots())


def upscaler_path(name: str) -> str:
    """The absolute path of a choice, never outside the folders, checked to be a latent upscaler; raises
    UserInputError."""
    try:
        found = find_inside(name, roots(), os.path.exists)
    except ValueError:
        raise UserInputError(f"'{name}' is not a name inside models/{FOLDER}; pick an upscaler from the "
                             "list.") from None
    if not found:
        raise UserInputError(f"'{name}' was not found in {', '.join(roots())}; put the upscaler there (or pick "
                             "another one) and press R in ComfyUI to refresh the lists.")
    upscalers.check(found)
    return found


def check_choice(name: str) -> bool | str:
    try:
        upscaler_path(name)
    except (UserInputError, ModelLoadError) as e:
        return str(e)
    return True


class TPULatentUpscaleModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        files = ", ".join(family.two_stage.comfy_file for family in TWO_STAGE_FAMILIES)
        return io.Schema(
            node_id="TPULatentUpscaleModel",
            display_name="TPU Latent Upscale Model",
            category=CATEGORY,
            description="Picks a latent upscaler for the TPU Video Sampler's upscaler input: the video is sampled at "
                        "half the size, its latents upscaled x2 with this model, then refined at full size "
                        f"(models with it: {listed(TWO_STAGE_FAMILIES)}). Checked now, loaded by the Sampler.",
            inputs=[
                io.Combo.Input("upscaler", options=choices(),
                               tooltip=f"A file in models/{FOLDER} (e.g. {files}), or a diffusers folder there "
                                       "(config.json and weights) or in models/diffusers (a pipeline folder with the "
                                       "upscaler in its subfolder)."),
            ],
            outputs=[TPUUpscaler.Output(display_name="upscaler",
                                        tooltip="Connect to the TPU Video Sampler's upscaler input.")],
        )

    @classmethod
    async def validate_inputs(cls, upscaler: str | None = None) -> bool | str:
        """Checked when the prompt is queued (the file's header only, in a thread: the server keeps answering); an
        input fed by a link arrives as None and is checked when the node runs. ComfyUI skips its own list check for
        the inputs named here; this covers it."""
        return True if upscaler is None else await asyncio.to_thread(check_choice, upscaler)

    @classmethod
    def execute(cls, upscaler: str) -> io.NodeOutput:
        return io.NodeOutput(upscaler_path(upscaler))
