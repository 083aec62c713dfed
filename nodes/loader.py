"""TPU Loader: pick a diffusers model; checked now, loaded only when a Sampler needs it."""

import asyncio

from comfy_api.latest import io

import folder_paths

from tpu_diffusers_runtime.device import resolve_device
from tpu_diffusers_runtime.downloads import check_downloads_allowed
from tpu_diffusers_runtime.errors import ModelLoadError, SettingError, UserInputError
from tpu_diffusers_runtime.families import FAMILIES, listed
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.specs import DeviceChoice, DType
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.sources import check_hub_id, list_model_folders, resolve_model_folder
from .types import CATEGORY, TPUPipeline


def model_roots() -> list[str]:
    return folder_paths.get_folder_paths("diffusers")


class TPULoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPULoader",
            display_name="TPU Loader",
            category=CATEGORY,
            description=f"Chooses a diffusers pipeline ({listed(FAMILIES)}) and checks it. "
                        "Weights are loaded later, once, by the Sampler, and reused across runs.",
            inputs=[
                io.Combo.Input("model", options=list_model_folders(model_roots()),
                               tooltip="A diffusers-format folder (with model_index.json) in models/diffusers."),
                io.String.Input("hub_id", default="",
                                tooltip=f"Optional Hugging Face id such as '{FAMILIES[0].default_config_repo}'; "
                                        "overrides 'model'. Downloaded by the Sampler (progress on its bar, Cancel "
                                        "stops it) unless TPU_DIFFUSERS_DOWNLOADS=forbid; offline, only the local "
                                        "hub cache."),
                io.Combo.Input("dtype", options=DType, default=DType.AUTO,
                               tooltip="Weight precision. auto = bfloat16 on TPU/CUDA, float32 on CPU."),
                io.Combo.Input("device", options=DeviceChoice, default=DeviceChoice.AUTO,
                               tooltip="Where to run. auto = TPU if TorchTPU finds a chip, else CUDA, else CPU."),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline",
                                              tooltip="The model choice; connect to Mode Selector or Sampler.")],
        )

    @classmethod
    async def validate_inputs(cls, model: str | None = None, hub_id: str | None = None,
                              device: str | None = None) -> bool | str:
        """Checked when the prompt is queued; ComfyUI awaits this on its event loop, so the folder's
        files are read in a thread and the server keeps answering."""
        return await asyncio.to_thread(check_choices, model, hub_id, device)

    @classmethod
    def execute(cls, model: str, hub_id: str, dtype: str, device: str) -> io.NodeOutput:
        resolve_device(device)  # an absent device is reported here, on the Loader
        source = check_hub_id(hub_id.strip()) if hub_id.strip() else resolve_model_folder(model, model_roots())
        handle = PipelineHandle.of(source=source, model_class=inspect_source(source), dtype=dtype, device=device)
        return io.NodeOutput(handle)


def check_choices(model: str | None, hub_id: str | None, device: str | None) -> bool | str:
    """Checked when the prompt is queued, so a bad choice is refused on this node before any node
    runs; execute checks again (a folder can change in between). An input fed by a link arrives
    as None and is checked when the node runs. A hub id is checked for its form here, and with
    TPU_DIFFUSERS_DOWNLOADS=forbid for being in the local cache; it is not looked up on the hub: that
    needs the network, and this runs while the server answers the request.
    ComfyUI skips its own list check for the inputs named here; these checks cover it."""
    try:
        if device is not None:
            resolve_device(device)
    except UserInputError as e:
        return str(e)
    if hub_id is None:  # fed by a link: which source is used is known when the node runs
        return True
    field = "hub_id" if hub_id.strip() else "model"
    try:
        if hub_id.strip():
            check_downloads_allowed(check_hub_id(hub_id.strip()))
        elif model is not None:
            inspect_source(resolve_model_folder(model, model_roots()))
    except (UserInputError, ModelLoadError, SettingError) as e:
        return f"{field}: {e}"  # the message names the folder or id, this says which input
    return True
