"""TPU LoRA: add a LoRA from models/loras to the pipeline; chain several. Fused into the loaded weights
when the Sampler runs, so the base model is not reloaded and compiled graphs are reused."""

import asyncio

from comfy_api.latest import io

import folder_paths

from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.features.lora import SECOND_EXPERT_WORDS, check_lora_file, check_lora_fits
from tpu_diffusers_runtime.model_files import resolve_model_file
from tpu_diffusers_runtime.single_file import config_folder
from tpu_diffusers_runtime.specs import LoraExpert, LoraSpec
from .types import CATEGORY, TPUPipeline

MAX_STRENGTH = 10.0


def lora_path(name: str) -> str:
    path = resolve_model_file(name, folder_paths.get_folder_paths("loras"), "loras")
    check_lora_file(path)
    return path


class TPULora(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPULora",
            display_name="TPU LoRA",
            category=CATEGORY,
            description="Adds a LoRA (diffusers, kohya or ComfyUI format, for the pipeline's family) at a strength; "
                        "chain several (a model with two experts: one per expert, e.g. 4-step high_noise and "
                        "low_noise LoRAs). The LoRA is fused into the loaded weights when the Sampler runs: no "
                        "per-step cost, no reload of the base model, and in compiled mode no recompile when the "
                        "LoRA or its strength changes. Works on a TP Mesh of replicas or with context parallelism; "
                        "refused before launch where the mesh shards the transformer (tp above 1).",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="The pipeline from a TPU loader, Mode Selector or another TPU LoRA."),
                io.Combo.Input("lora_name", options=folder_paths.get_filename_list("loras"),
                               tooltip="A LoRA .safetensors file in models/loras."),
                io.Float.Input("strength", default=1.0, min=-MAX_STRENGTH, max=MAX_STRENGTH, step=0.05,
                               tooltip="How strongly the LoRA applies. 0 leaves the model exactly as it is."),
                # optional: a prompt saved before this input existed has no expert and runs as before (high_noise)
                io.Combo.Input("expert", options=[e.value for e in LoraExpert], default=LoraExpert.HIGH_NOISE.value,
                               optional=True,
                               tooltip="Which transformer the LoRA goes into. high_noise: the model's transformer "
                                       "(every model; the first expert of a model with two). low_noise: the second "
                                       f"expert (transformer_2: {SECOND_EXPERT_WORDS}), e.g. a 4-step *_low_noise "
                                       "LoRA. both: the same LoRA into each. refine: the transformer in the refine "
                                       "stage of a two-stage run only (a latent upscaler into the Video Sampler), e.g. "
                                       "a distilled LoRA of a two-stage recipe. Models with one transformer take high_noise."),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline", tooltip="The pipeline with this LoRA added.")],
        )

    @classmethod
    async def validate_inputs(cls, lora_name: str | None = None, strength: float | None = None) -> bool | str:
        """Checked when the prompt is queued (file in models/loras, readable, LoRA weights); ComfyUI skips
        its own list and range checks for the inputs named here, so these cover them. The file's header
        is read in a thread: ComfyUI awaits this on its event loop."""
        return await asyncio.to_thread(check_choice, lora_name, strength)

    @classmethod
    def execute(cls, pipeline, lora_name: str, strength: float, expert: str = LoraExpert.HIGH_NOISE.value
                ) -> io.NodeOutput:
        lora = LoraSpec(path=lora_path(lora_name), strength=strength, expert=expert)
        # a LoRA of another family, or for a low-noise expert the model lacks, fails here, on this node, against
        # the model's configs (no weights loaded)
        check_lora_fits(pipeline.model_class, config_folder(pipeline.source), lora)
        return io.NodeOutput(pipeline.replace(loras=(*pipeline.loras, lora)))


def check_choice(lora_name: str | None, strength: float | None) -> bool | str:
    try:
        if lora_name is not None:
            lora_path(lora_name)
        if strength is not None and not -MAX_STRENGTH <= strength <= MAX_STRENGTH:
            raise UserInputError(f"strength {strength} is outside -{MAX_STRENGTH}..{MAX_STRENGTH}.")
    except UserInputError as e:
        return str(e)
    except (OSError, ValueError) as e:  # an unreadable folder, a name the file system refuses
        return f"cannot read the LoRA file ({type(e).__name__}: {e}); check it and pick again."
    return True
