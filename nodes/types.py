"""Edge types shared by our nodes."""

from comfy_api.latest import io

# Carries a runtime.handle.PipelineHandle: a lazy description, never a loaded model.
TPUPipeline = io.Custom("TPU_PIPELINE")

CATEGORY = "TPU Diffusers"
