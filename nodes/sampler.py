"""TPU Sampler: realises the pipeline (load once, reuse after) and generates images."""

from comfy_api.latest import io

from tpu_diffusers_runtime.engine import ENGINE
from tpu_diffusers_runtime.tasks import MAX_SEED, SampleRequest, size_problem
from .comfy_progress import ComfyProgress, preview_spec
from .types import CATEGORY, TPUPipeline

MAX_SIZE = 8192


class TPUSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUSampler",
            display_name="TPU Sampler",
            category=CATEGORY,
            description="Loads the pipeline on first use (later runs reuse it) and generates images. "
                        "Shows progress and a preview per step (ComfyUI's --preview-method); "
                        "Cancel stops it within one step.",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="The pipeline from TPU Loader or Mode Selector."),
                io.String.Input("prompt", multiline=True, default="a golden retriever surfing a wave, photorealistic",
                                tooltip="What to generate. Required."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="What to avoid. Used by SD3/SD3.5 and QwenImage; FLUX.1 and FLUX.2 take none."),
                io.Int.Input("width", default=1024, min=16, max=MAX_SIZE, step=16,
                             tooltip="Image width in pixels; a multiple of 16."),
                io.Int.Input("height", default=1024, min=16, max=MAX_SIZE, step=16,
                             tooltip="Image height in pixels; a multiple of 16."),
                io.Int.Input("steps", default=4, min=1, max=1000,
                             tooltip="Denoising steps (FLUX.1-schnell 4, SD3.5 40, FLUX.2-dev 28)."),
                io.Float.Input("guidance", default=3.5, min=0.0, max=100.0, step=0.1,
                               tooltip="Guidance scale (FLUX.1-schnell 0, SD3.5 4.5, FLUX.2-dev 4). "
                                       "For QwenImage this is the true-CFG scale."),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Random seed; the same seed gives the same image on TPU, GPU and CPU."),
                io.Int.Input("batch_size", default=1, min=1, max=64,
                             tooltip="Images per run; image i uses seed + i."),
            ],
            outputs=[
                io.Image.Output(display_name="images", tooltip="Connect to Save Image or Preview Image."),
                io.String.Output(display_name="info",
                                 tooltip="Device, the mode that actually ran, load and sampling times."),
            ],
        )

    @classmethod
    def validate_inputs(cls, prompt: str | None = None, width: int | None = None,
                        height: int | None = None) -> bool | str:
        """Checked when the prompt is queued, so a bad request is refused on this node before any node
        runs: what every supported family needs (each family's own rules are checked when it runs).
        ComfyUI skips its min/max check for the inputs named here, so the largest size is checked
        too. An input fed by a link arrives as None and is checked when the node runs; a value that is
        not a number has already been reported by ComfyUI's own conversion, which runs first."""
        if prompt is not None and not prompt.strip():
            return "prompt is empty: describe the image to generate."
        for name, value in (("width", width), ("height", height)):
            if not isinstance(value, int):
                continue
            if value > MAX_SIZE:
                return f"{name} {value} is larger than {MAX_SIZE}; use at most {MAX_SIZE}."
            if problem := size_problem(name, value):
                return problem
        return True

    @classmethod
    def execute(cls, pipeline, prompt: str, negative_prompt: str, width: int, height: int, steps: int,
                guidance: float, seed: int, batch_size: int) -> io.NodeOutput:
        request = SampleRequest(prompt=prompt, negative_prompt=negative_prompt, width=width, height=height,
                                steps=steps, guidance=guidance, seed=seed, batch_size=batch_size)
        generation = ENGINE.generate(pipeline, request, on_progress=ComfyProgress(),
                                     preview=preview_spec(pipeline.model_class))
        info = generation.info
        # ComfyUI sends the ui dict to the page (`executed`, where web/tpu_diffusers.js shows it on
        # our nodes) and keeps it in the prompt's history, where API clients read it.
        return io.NodeOutput(generation.images, info.summary(), ui={"tpu_run_info": [info.as_dict()]})
