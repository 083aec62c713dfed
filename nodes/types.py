"""Edge types shared by our nodes."""

from comfy_api.latest import io

from tpu_diffusers_runtime.handle import PipelineHandle


@io.comfytype(io_type="TPU_PIPELINE")
class TPUPipeline(io.ComfyTypeIO):
    """A lazy description of what to run (runtime.handle.PipelineHandle), never a loaded model."""

    Type = PipelineHandle


CATEGORY = "TPU Diffusers"
