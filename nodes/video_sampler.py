"""TPU Video Sampler: TPU Sampler's sibling for video models (Wan 2.2): frames in, frames out as an IMAGE batch."""

from comfy_api.latest import io

from tpu_diffusers_runtime.engine import ENGINE
from tpu_diffusers_runtime.tasks import MAX_SEED, SampleRequest, frames_problem
from .comfy_progress import ComfyProgress, preview_spec
from .sampler import MAX_SIZE, queue_time_problem
from .types import CATEGORY, TPUPipeline

MAX_FRAMES = 1025
FRAME_FACTOR = 4  # every supported video model's VAE makes 4 frames per latent frame, plus the first: 4k + 1
LINK_TYPES = {"pipeline": TPUPipeline.io_type, "prompt": "STRING", "negative_prompt": "STRING", "width": "INT",
              "height": "INT", "frames": "INT", "steps": "INT", "guidance": "FLOAT", "seed": "INT",
              "batch_size": "INT", "image": "IMAGE"}


class TPUVideoSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUVideoSampler",
            display_name="TPU Video Sampler",
            category=CATEGORY,
            description="Generates video with a video model (Wan 2.2): from text, or from a start image (I2V "
                        "A14B, TI2V-5B). The frames come out as an IMAGE batch for ComfyUI's Create Video + Save "
                        "Video or Save Animated WEBP, with the model's frame rate. Loads on first use, shows "
                        "progress and the first frame's preview per step. Cancel stops sampling at the end of "
                        "the running step, and loading between components.",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="A Wan 2.2 pipeline from TPU Loader or TPU File Loader."),
                io.String.Input("prompt", multiline=True, default="a corgi running on a beach at sunset, cinematic",
                                tooltip="What happens in the video. Required."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="What to avoid (used when guidance is above 1)."),
                io.Int.Input("width", default=832, min=0, max=MAX_SIZE, step=16,
                             tooltip="Frame width: a multiple of 16 (TI2V-5B: 32). 832x480 is Wan's 480p, "
                                     "1280x720 its 720p (TI2V-5B: 1280x704). 0 = the start image's width."),
                io.Int.Input("height", default=480, min=0, max=MAX_SIZE, step=16,
                             tooltip="Frame height: a multiple of 16 (TI2V-5B: 32). 0 = the start image's height."),
                io.Int.Input("frames", default=81, min=1, max=MAX_FRAMES, step=FRAME_FACTOR,
                             tooltip="Frames per video: 4k + 1 (1, 5, ..., 81 = 5 s at Wan A14B's 16 fps; "
                                     "TI2V-5B: 121 = 5 s at 24 fps)."),
                io.Int.Input("steps", default=4, min=1, max=1000,
                             tooltip="Denoising steps: 4 with the lightx2v 4-step LoRAs, Wan 2.2's own 40 (5B: 50)."),
                io.Float.Input("guidance", default=1.0, min=0.0, max=100.0, step=0.1,
                               tooltip="Guidance scale: 1.0 (no CFG) with the 4-step LoRAs; Wan 2.2 without them "
                                       "4.0 (A14B) or 5.0 (5B)."),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Random seed; the same seed gives the same video on TPU, GPU and CPU."),
                io.Int.Input("batch_size", default=1, min=1, max=16,
                             tooltip="Videos per run; video i uses seed + i (and item i % N of an image batch). "
                                     "The frames output holds them one after another: batch x frames images."),
                io.Image.Input("image", optional=True,
                               tooltip="Image to video: the first frame (Load Image). Wan 2.2 I2V A14B needs it, "
                                       "TI2V-5B takes it or not, T2V A14B takes none. Resized to width x height."),
            ],
            outputs=[
                io.Image.Output(display_name="frames", tooltip="batch x frames images, video after video: connect to "
                                                                "Create Video or Save Animated WEBP."),
                io.Float.Output(display_name="fps", tooltip="The model's frame rate (Wan 2.2 A14B 16, TI2V-5B 24): "
                                                            "connect to Create Video's fps."),
                io.String.Output(display_name="info", tooltip="Device, the task and diffusers class that ran, the "
                                                              "mode, frames and fps, load and sampling times."),
            ],
        )

    @classmethod
    def validate_inputs(cls, input_types: dict | None = None, prompt: str | None = None, width: int | None = None,
                        height: int | None = None, frames: int | None = None) -> bool | str:
        """Checked when the prompt is queued (see TPUSampler.validate_inputs): link types, prompt, size and the
        frame count, which every supported video model takes as 4k + 1."""
        problem = queue_time_problem(input_types or {}, LINK_TYPES, prompt, width, height)
        if problem:
            return problem
        if not isinstance(frames, int):
            return True
        if not 1 <= frames <= MAX_FRAMES:
            return f"frames {frames} is outside 1..{MAX_FRAMES}."
        return frames_problem(frames, FRAME_FACTOR) if (frames - 1) % FRAME_FACTOR else True

    @classmethod
    def execute(cls, pipeline, prompt: str, negative_prompt: str, width: int, height: int, frames: int, steps: int,
                guidance: float, seed: int, batch_size: int, image=None) -> io.NodeOutput:
        request = SampleRequest(prompt=prompt, negative_prompt=negative_prompt, width=width, height=height,
                                steps=steps, guidance=guidance, seed=seed, batch_size=batch_size, frames=frames,
                                images=() if image is None else (image,))
        generation = ENGINE.generate(pipeline, request, on_progress=ComfyProgress(), preview=preview_spec(pipeline))
        info = generation.info
        return io.NodeOutput(generation.images, info.fps, info.summary(), ui={"tpu_run_info": [info.as_dict()]})
