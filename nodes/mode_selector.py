"""TPU Mode Selector: how the pipeline executes and where its weights live."""

from comfy_api.latest import io

from tpu_diffusers_runtime.specs import ExecutionMode, Placement
from .types import CATEGORY, TPUPipeline


class TPUModeSelector(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUModeSelector",
            display_name="TPU Mode Selector",
            category=CATEGORY,
            description="Sets the execution mode (strict eager, fused eager or compiled) and the placement "
                        "(whole pipeline on the chip, or model CPU offload for models larger than one chip).",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="The pipeline from TPU Loader."),
                io.Combo.Input("mode", options=ExecutionMode, default=ExecutionMode.EAGER,
                               tooltip="eager: ops run one at a time (EagerMode.DEFER_NEVER). fused_eager: ops are "
                                       "deferred and fused into larger graphs (EagerMode.DEFER_AND_FUSE), faster "
                                       "after a longer first run; TPU only, CUDA/CPU run eager and say so. "
                                       "compiled: the transformer runs through torch.compile with static shapes "
                                       "(options: TPU Compile Transformer node; without it, its defaults)."),
                io.Combo.Input("placement", options=Placement, default=Placement.DEVICE,
                               tooltip="device: the whole pipeline stays on the accelerator (fastest). "
                                       "model_cpu_offload: each model moves to the accelerator only while it runs, "
                                       "for models that do not fit (e.g. a 12B model in bf16 on one 16 GiB chip)."),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline", tooltip="The pipeline with these settings.")],
        )

    @classmethod
    def execute(cls, pipeline, mode: str, placement: str) -> io.NodeOutput:
        # Compiled mode without a Compile Transformer runs with its defaults (PipelineHandle.compile None).
        return io.NodeOutput(pipeline.replace(mode=ExecutionMode(mode), placement=Placement(placement)))
