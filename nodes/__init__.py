"""ComfyUI nodes of TPU Diffusers (V3 schema). Each node builds or refines a handle, or runs one."""

import comfy.model_management
from comfy_api.latest import ComfyExtension, io
from server import PromptServer

from tpu_diffusers_runtime.device import detect_device
from . import comfy_memory
from .compile_transformer import TPUCompileTransformer
from .file_loader import TPUFileLoader
from .latent_upscale_model import TPULatentUpscaleModel
from .loader import TPULoader
from .lora import TPULora
from .mode_selector import TPUModeSelector
from .sampler import TPUSampler
from .tp_mesh import TPUMesh
from .video_reference import TPUVideoReference
from .video_sampler import TPUVideoSampler


class TPUDiffusersExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [TPULoader, TPUFileLoader, TPULora, TPUModeSelector, TPUCompileTransformer, TPUMesh, TPUSampler,
                TPUVideoSampler, TPUVideoReference, TPULatentUpscaleModel]


async def comfy_entrypoint() -> TPUDiffusersExtension:
    # ComfyUI 0.3.75 never calls ComfyExtension.on_load, so set-up happens here.
    device = detect_device()  # logs the device line (and why TPU was not used) at start-up
    comfy_memory.install(PromptServer.instance.prompt_queue, comfy.model_management, device.type)
    return TPUDiffusersExtension()
