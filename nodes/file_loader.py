"""TPU File Loader: a pipeline from the single files ComfyUI keeps (diffusion_models, text_encoders,
vae, checkpoints); checked now, loaded only when a Sampler needs it, like TPU Loader's folders."""

import asyncio

from comfy_api.latest import io

import folder_paths
from tpu_diffusers_runtime.device import resolve_device
from tpu_diffusers_runtime.errors import ModelLoadError, UserInputError
from tpu_diffusers_runtime.families import FAMILIES, with_each_setting
from tpu_diffusers_runtime.file_choice import AUTO_CONFIGS, check_against_configs, file_status, plan
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.model_files import NONE, resolve_model_file
from tpu_diffusers_runtime.sources import list_model_folders
from tpu_diffusers_runtime.specs import DeviceChoice, DType, QuantizedWeights

from .types import CATEGORY, TPUPipeline

ENCODER_SLOTS = ("text_encoder", "text_encoder_2", "text_encoder_3")
# model_2: the second denoiser of the families that have one (the node has one input for it)
(SECOND_MODEL_SLOT,) = {denoiser for family in FAMILIES for denoiser in family.extra_denoisers}
MODELS = with_each_setting(FAMILIES)  # a model with settings can take other files (another VAE, no second model)


def slot_files(component: str) -> str:
    """What each family takes for `component`, as ComfyUI's templates name its files (its file variants' too), for
    the tooltips."""
    takes = {}
    for model in MODELS:
        slot = model.slot(component)
        if slot is not None:
            variants = [(f"{model.name} ({(*variant.name_contains, variant.config_repo.split('/')[-1])[0]})",
                         variant.comfy_files[component]) for variant in model.file_variants
                        if component in variant.comfy_files]
            for name, file in ((model.name, slot.comfy_file), *variants):
                takes.setdefault(file + (" (optional)" if slot.optional else ""), []).append(name)
    return "; ".join(f"{'/'.join(dict.fromkeys(names))}: {file}" for file, names in takes.items())


def family_files(family) -> str:
    """A family's files for the node's description: its diffusion models' and each other slot's."""
    files = [family.denoiser_files[0], *(slot.comfy_file for slot in family.file_slots)]
    return f"{family.name} ({', '.join(files)})"


def model_files() -> list[str]:
    """diffusion_models (and the legacy unet folder) first, then all-in-one checkpoints."""
    names = folder_paths.get_filename_list("diffusion_models")
    return names + [n for n in folder_paths.get_filename_list("checkpoints") if n not in names]


def model_path(name: str) -> str:
    try:
        return resolve_model_file(name, folder_paths.get_folder_paths("diffusion_models"), "diffusion_models")
    except UserInputError:
        return resolve_model_file(name, folder_paths.get_folder_paths("checkpoints"), "checkpoints")


def plan_choices(model: str, text_encoder: str, text_encoder_2: str, text_encoder_3: str, vae: str, configs: str,
                 model_2: str = NONE, audio_vae: str = NONE):
    """The node's choices (names inside ComfyUI's folders) resolved to paths and planned by the runtime:
    (configs source, model class, files); raises UserInputError. The model is resolved first: its error
    is the one to show when several files are missing."""
    model_file = model_path(model)
    if model_2 not in (None, NONE):
        second = {SECOND_MODEL_SLOT: resolve_model_file(model_2, folder_paths.get_folder_paths("diffusion_models"),
                                                        "diffusion_models")}
    else:
        second = {}
    picked = {slot: resolve_model_file(name, folder_paths.get_folder_paths("text_encoders"), "text_encoders")
              for slot, name in zip(ENCODER_SLOTS, (text_encoder, text_encoder_2, text_encoder_3)) if name != NONE}
    for slot, name in (("vae", vae), ("audio_vae", audio_vae)):
        if name not in (None, NONE):
            picked[slot] = resolve_model_file(name, folder_paths.get_folder_paths("vae"), "vae")
    return plan(model_file, {**second, **picked}, configs, folder_paths.get_folder_paths("diffusers"))


def check_choices(choices: tuple, device: str | None, model_2: str | None = NONE,
                  audio_vae: str | None = NONE) -> bool | str:
    try:
        if device is not None:
            resolve_device(device)
        if None not in choices:
            plan_choices(*choices, model_2=model_2, audio_vae=audio_vae)
    except (UserInputError, ModelLoadError) as e:
        return str(e)
    except (OSError, ValueError) as e:  # an unreadable folder, a name the file system refuses (NUL)
        return f"cannot read the picked files or folders ({type(e).__name__}: {e}); check them and pick again."
    return True


class TPUFileLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        text_encoders = [NONE, *folder_paths.get_filename_list("text_encoders")]
        return io.Schema(
            node_id="TPUFileLoader",
            display_name="TPU File Loader",
            category=CATEGORY,
            description="Chooses a pipeline from single files in ComfyUI's model folders, e.g. "
                        f"{'; '.join(family_files(family) for family in FAMILIES if family.denoiser_files)}. "
                        "int8 and fp8 layers stay quantized on TPU/CUDA (quantized_weights), else are upcast; GGUF "
                        "and NF4 are refused. Configs and tokenizers (not in single "
                        "files) come from 'configs'. Loaded later, once, by the Sampler.",
            inputs=[
                io.Combo.Input("model", options=model_files(),
                               tooltip="The diffusion model: a file in models/diffusion_models (or unet), or an "
                                       "all-in-one checkpoint in models/checkpoints. Its family is read from it."),
                io.Combo.Input("text_encoder", options=text_encoders,
                               tooltip=f"models/text_encoders (or clip). {slot_files('text_encoder')}. none: from "
                                       "the checkpoint."),
                io.Combo.Input("text_encoder_2", options=text_encoders,
                               tooltip=f"{slot_files('text_encoder_2')}; others: none. none: from the checkpoint."),
                io.Combo.Input("text_encoder_3", options=text_encoders,
                               tooltip=f"{slot_files('text_encoder_3')}: none and a checkpoint without it runs "
                                       "without it; others: none."),
                io.Combo.Input("vae", options=[NONE, *folder_paths.get_filename_list("vae")],
                               tooltip=f"models/vae: {slot_files('vae')}. none: from the checkpoint."),
                io.Combo.Input("configs", options=[AUTO_CONFIGS, *list_model_folders(
                                   folder_paths.get_folder_paths("diffusers"))],
                               tooltip="Where configs and tokenizers come from: a diffusers folder of the same "
                                       "model in models/diffusers (its weights also fill any file left at none), "
                                       "or auto: the model's small config files from the Hugging Face cache "
                                       "(downloaded when online; the error names the command otherwise)."),
                io.Combo.Input("dtype", options=DType, default=DType.AUTO,
                               tooltip="Weight precision. auto = bfloat16 on TPU/CUDA, float32 on CPU. int8 and "
                                       "fp8 layers are dequantized to it (on load, or per layer as they run)."),
                io.Combo.Input("device", options=DeviceChoice, default=DeviceChoice.AUTO,
                               tooltip="Where to run. auto = TPU if TorchTPU finds a chip, else CUDA, else CPU."),
                # last, so that workflows saved before it keep their widget values
                io.Combo.Input("model_2", options=[NONE, *folder_paths.get_filename_list("diffusion_models")],
                               default=NONE, optional=True,
                               tooltip="A second diffusion model, for models with two (its first in model): "
                                       f"{slot_files(SECOND_MODEL_SLOT)}. none for every other model."),
                io.Combo.Input("quantized_weights", options=QuantizedWeights, default=QuantizedWeights.AUTO,
                               optional=True,
                               tooltip="int8 and fp8 files (ComfyUI's per-layer formats): keep quantized holds their "
                                       "layers as stored in chip memory (a 22B int8 model ~22 GB, not ~44 GB in "
                                       "bf16) and dequantizes each as it runs, same image; dequantize on load "
                                       "upcasts them when read; int8 matmul (W8A8) also multiplies int8 x int8. "
                                       "auto = keep quantized on TPU/CUDA, dequantize on CPU. Changing it reloads."),
                io.Combo.Input("audio_vae", options=[NONE, *folder_paths.get_filename_list("vae")], default=NONE,
                               optional=True,
                               tooltip=f"models/vae, for models with sound whose audio VAE is a file of its own "
                                       f"(it may carry the vocoder too): {slot_files('audio_vae')}. none: from the "
                                       "checkpoint, and for models without sound."),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline",
                                        tooltip="The model choice; connect to Mode Selector, TPU LoRA or Sampler.")],
        )

    @classmethod
    async def validate_inputs(cls, model: str | None = None, text_encoder: str | None = None,
                        text_encoder_2: str | None = None, text_encoder_3: str | None = None,
                        vae: str | None = None, configs: str | None = None, device: str | None = None,
                        model_2: str | None = NONE, audio_vae: str | None = NONE) -> bool | str:
        """Checked when the prompt is queued (headers only), so a wrong file is refused on this node before
        any node runs. ComfyUI awaits this on its event loop: the file reads run in a thread, so the server
        keeps answering. Inputs fed by links arrive as None and are checked when the node runs."""
        choices = (model, text_encoder, text_encoder_2, text_encoder_3, vae, configs)
        if model_2 is None or audio_vae is None:  # fed by a link: checked when the node runs
            choices = (*choices, None)
        return await asyncio.to_thread(check_choices, choices, device, model_2, audio_vae)

    @classmethod
    def execute(cls, model: str, text_encoder: str, text_encoder_2: str, text_encoder_3: str, vae: str,
                configs: str, dtype: str, device: str, model_2: str = NONE,
                quantized_weights: str = QuantizedWeights.AUTO, audio_vae: str = NONE) -> io.NodeOutput:
        target = resolve_device(device)
        source, model_class, files = plan_choices(model, text_encoder, text_encoder_2, text_encoder_3, vae, configs,
                                                  model_2, audio_vae)
        check_against_configs(source, model_class, files, model)
        handle = PipelineHandle.of(source=source, model_class=model_class, files=files, dtype=dtype, device=device,
                                   quantized_weights=quantized_weights)
        status = file_status(files, handle.load.quantized_weights, target.type)
        return io.NodeOutput(handle, ui={"tpu_file_status": status} if status else None)
