"""TPU File Loader: a pipeline from the single files ComfyUI keeps (diffusion_models, text_encoders,
vae, checkpoints); checked now, loaded only when a Sampler needs it, like TPU Loader's folders."""

import os

from comfy_api.latest import io

import folder_paths

from ..runtime.device import resolve_device
from ..runtime.errors import ModelLoadError, UserInputError
from ..runtime.file_choice import choose_files, components_with_weights
from ..runtime.handle import PipelineHandle
from ..runtime.loading import list_model_folders, read_model_index, resolve_model_folder
from ..runtime.model_files import NONE, resolve_model_file
from ..runtime.single_file import check_files_against_configs, config_folder, default_config_repo, pipeline_class_of
from ..runtime.specs import DeviceChoice, DType
from .types import CATEGORY, TPUPipeline

AUTO_CONFIGS = "auto"
ENCODER_SLOTS = ("text_encoder", "text_encoder_2", "text_encoder_3")


def model_files() -> list[str]:
    """diffusion_models (and the legacy unet folder) first, then all-in-one checkpoints."""
    names = folder_paths.get_filename_list("diffusion_models")
    return names + [n for n in folder_paths.get_filename_list("checkpoints") if n not in names]


def model_path(name: str) -> str:
    try:
        return resolve_model_file(name, folder_paths.get_folder_paths("diffusion_models"), "diffusion_models")
    except UserInputError:
        return resolve_model_file(name, folder_paths.get_folder_paths("checkpoints"), "checkpoints")


def plan(model: str, text_encoder: str, text_encoder_2: str, text_encoder_3: str, vae: str, configs: str):
    """(source of configs, pipeline class, files) for the node's choices; raises UserInputError."""
    path = model_path(model)
    picked = {slot: resolve_model_file(name, folder_paths.get_folder_paths("text_encoders"), "text_encoders")
              for slot, name in zip(ENCODER_SLOTS, (text_encoder, text_encoder_2, text_encoder_3)) if name != NONE}
    if vae != NONE:
        picked["vae"] = resolve_model_file(vae, folder_paths.get_folder_paths("vae"), "vae")
    roots = folder_paths.get_folder_paths("diffusers")
    source = auto_configs(default_config_repo(path)) if configs == AUTO_CONFIGS else resolve_model_folder(configs, roots)
    if os.path.isabs(source):
        check_configs_class(source, pipeline_class_of(path), model)
    with_weights = components_with_weights(source) if os.path.isabs(source) else set()  # a hub id: configs only
    pipeline_class, files = choose_files(path, picked, with_weights)
    return source, pipeline_class, files


def check_configs_class(folder: str, pipeline_class: str, model: str) -> None:
    """The configs are of the model's pipeline class: not another family's, nor e.g. FLUX.1 Fill's."""
    held = read_model_index(folder, is_folder=True)["_class_name"]
    if held != pipeline_class:
        raise UserInputError(f"configs: '{os.path.basename(folder)}' holds a {held}, but '{model}' is a "
                             f"{pipeline_class}; pick a diffusers folder of the same model (or auto). TPU Diffusers "
                             "runs the text-to-image pipelines of FLUX.1, SD3/SD3.5, FLUX.2 and QwenImage.")


def auto_configs(repo: str) -> str:
    """The folder in models/diffusers named like the model's hub repository (where the download command
    that the error names puts the config files), else the hub id: its config files from the hub cache."""
    roots = folder_paths.get_folder_paths("diffusers")
    folders = [f for f in list_model_folders(roots) if f.split("/")[-1] == repo.split("/")[-1]]
    return resolve_model_folder(folders[0], roots) if folders else repo


class TPUFileLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        text_encoders = [NONE, *folder_paths.get_filename_list("text_encoders")]
        return io.Schema(
            node_id="TPUFileLoader",
            display_name="TPU File Loader",
            category=CATEGORY,
            description="Chooses a pipeline from single files in ComfyUI's model folders: FLUX.1 (transformer, "
                        "clip_l, t5xxl, ae), SD3.5 (checkpoint, with or without T5, or clip_l/clip_g/t5xxl files), "
                        "FLUX.2 (transformer, Mistral encoder, VAE), QwenImage (transformer, Qwen2.5-VL, VAE). "
                        "fp8 files are upcast; GGUF and NF4 are refused. Configs and tokenizers (not in single "
                        "files) come from 'configs'. Loaded later, once, by the Sampler.",
            inputs=[
                io.Combo.Input("model", options=model_files(),
                               tooltip="The diffusion model: a file in models/diffusion_models (or unet), or an "
                                       "all-in-one checkpoint in models/checkpoints. Its family is read from it."),
                io.Combo.Input("text_encoder", options=text_encoders,
                               tooltip="models/text_encoders (or clip). FLUX.1 and SD3.5: clip_l; FLUX.2: the "
                                       "Mistral file; QwenImage: the Qwen2.5-VL file. none: from the checkpoint."),
                io.Combo.Input("text_encoder_2", options=text_encoders,
                               tooltip="FLUX.1: t5xxl; SD3.5: clip_g; others: none. none: from the checkpoint."),
                io.Combo.Input("text_encoder_3", options=text_encoders,
                               tooltip="SD3.5: t5xxl (optional: none and a checkpoint without T5 runs without "
                                       "it); others: none."),
                io.Combo.Input("vae", options=[NONE, *folder_paths.get_filename_list("vae")],
                               tooltip="models/vae: FLUX.1 ae.safetensors, FLUX.2 flux2-vae, QwenImage "
                                       "qwen_image_vae. none: from the checkpoint."),
                io.Combo.Input("configs", options=[AUTO_CONFIGS, *list_model_folders(
                                   folder_paths.get_folder_paths("diffusers"))],
                               tooltip="Where configs and tokenizers come from: a diffusers folder of the same "
                                       "model in models/diffusers (its weights also fill any file left at none), "
                                       "or auto: the model's small config files from the Hugging Face cache "
                                       "(downloaded when online; the error names the command otherwise)."),
                io.Combo.Input("dtype", options=DType, default=DType.AUTO,
                               tooltip="Weight precision. auto = bfloat16 on TPU/CUDA, float32 on CPU. fp8 files "
                                       "are upcast to it."),
                io.Combo.Input("device", options=DeviceChoice, default=DeviceChoice.AUTO,
                               tooltip="Where to run. auto = TPU if TorchTPU finds a chip, else CUDA, else CPU."),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline",
                                        tooltip="The model choice; connect to Mode Selector, TPU LoRA or Sampler.")],
        )

    @classmethod
    def validate_inputs(cls, model: str | None = None, text_encoder: str | None = None,
                        text_encoder_2: str | None = None, text_encoder_3: str | None = None,
                        vae: str | None = None, configs: str | None = None, device: str | None = None) -> bool | str:
        """Checked when the prompt is queued (headers only), so a wrong file is refused on this node before
        any node runs. Inputs fed by links arrive as None and are checked when the node runs."""
        choices = (model, text_encoder, text_encoder_2, text_encoder_3, vae, configs)
        try:
            if device is not None:
                resolve_device(device)
            if None not in choices:
                plan(*choices)
        except (UserInputError, ModelLoadError) as e:
            return str(e)
        except (OSError, ValueError) as e:  # an unreadable folder, a name the file system refuses
            return f"cannot read the picked files or folders ({type(e).__name__}: {e}); check them and pick again."
        return True

    @classmethod
    def execute(cls, model: str, text_encoder: str, text_encoder_2: str, text_encoder_3: str, vae: str,
                configs: str, dtype: str, device: str) -> io.NodeOutput:
        resolve_device(device)
        source, pipeline_class, files = plan(model, text_encoder, text_encoder_2, text_encoder_3, vae, configs)
        # the configs now (downloaded when online, else the error names the command), and the text encoders
        # checked against them, so a wrong file fails here and not in the Sampler's load
        folder = config_folder(source)
        check_configs_class(folder, pipeline_class, model)  # auto's hub configs too (e.g. FLUX.1 Fill's)
        check_files_against_configs(files, folder, pipeline_class)
        return io.NodeOutput(PipelineHandle(source=source, pipeline_class=pipeline_class, files=files,
                                            dtype=dtype, device=device))
